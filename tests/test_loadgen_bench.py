"""``bench load`` against the fake server: definitions of TTFT/TPOT/ITL, failures, exit codes, the report and JSON.

The timing checks are causal lower bounds (a measured value can never be below
what the server waited, whatever else runs on the machine) and the definitions
read back from the records; none asserts speed, so a busy machine cannot fail them.
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.analysis.documents import save_run
from harness.commands import load as cli
from harness.loadgen import runner
from harness.loadgen.report import format_report, run_line
from harness.loadgen.runner import BenchmarkError, BenchmarkResult, LoadSettings, run_benchmark
from harness.workloads.sample import SampleRequest

from fake_openai_server import (
    OUT_BYTES,
    OUT_DECODE_NS,
    OUT_ENCODE_NS,
    OUT_FRAMES,
    REQ_BYTES,
    REQ_DECODE_NS,
    REQ_ENCODE_NS,
    REQ_FRAMES,
    FakeConfig,
    FakeOpenAIServer,
)

TTFT, GAP, K = 0.08, 0.02, 8
EARLY = 0.97  # a sleep may end a hair before its time on the other thread's clock


def _workload(n: int, tokens: int = K, bad: dict[int, str] | None = None) -> list[SampleRequest]:
    bad = bad or {}
    return [SampleRequest(f"prompt {i} {bad.get(i, '')}".strip(), 4, tokens) for i in range(n)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    cli.add_server_arguments(parser)
    cli.add_load_arguments(parser)
    return parser


@pytest.fixture(autouse=True)
def _no_scrape_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake server's counters are current at once; the real wait only slows tests.
    monkeypatch.setattr(runner, "SCRAPE_SETTLE_S", 0.0)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeConfig(ttft_s=TTFT, token_gap_s=GAP)) as srv:
        yield srv


@pytest.fixture(scope="module")
def server_2tok() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeConfig(ttft_s=TTFT, token_gap_s=GAP, tokens_per_chunk=2)) as srv:
        yield srv


def _run(base_url: str, workload: list[SampleRequest], **kw: object) -> BenchmarkResult:
    settings = LoadSettings(selected_metrics=("ttft", "tpot", "itl", "chunk_itl", "e2el"), **kw)  # type: ignore[arg-type]
    return asyncio.run(run_benchmark(base_url, "fake-model", workload, settings))


def _mean_ms(seconds: list[float]) -> float:
    return 1000 * sum(seconds) / len(seconds)


def test_ttft_tpot_itl_follow_the_server_timing(server: FakeOpenAIServer) -> None:
    result = _run(server.base_url, _workload(6), max_concurrency=3, warmup_requests=1)
    m = result.metrics
    assert (m.completed, m.failed) == (6, 0)
    assert m.total_output == 6 * K and m.total_input == 6 * 4
    for rec in result.records:
        # One chunk a token, each stamped as it arrived: never before the server wrote it (chunk j at
        # TTFT + j * GAP after the request arrived, which is after the client sent it).
        assert rec.chunk_tokens == [1] * K and rec.chunk_times == sorted(rec.chunk_times)
        assert rec.ttft == rec.chunk_times[0] >= TTFT * EARLY
        assert rec.latency >= rec.chunk_times[-1] >= (TTFT + (K - 1) * GAP) * EARLY
    records = result.records
    assert m.ttft.mean == pytest.approx(_mean_ms([r.ttft for r in records]))
    assert m.e2el.mean == pytest.approx(_mean_ms([r.latency for r in records]))
    assert m.tpot.mean == pytest.approx(_mean_ms([(r.latency - r.ttft) / (K - 1) for r in records]))
    gaps = [b - a for r in records for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    assert m.itl.count == m.chunk_itl.count == 6 * (K - 1)  # one token a chunk: the two ITLs agree
    assert m.itl.mean == pytest.approx(_mean_ms(gaps)) and m.chunk_itl.mean == pytest.approx(m.itl.mean)
    # Concurrency 3 at rate inf: the second half waited for slots, visibly in the lag.
    assert m.dispatch_lag.max_ms < m.schedule_lag.max_ms
    assert result.codec == "fakecodec" and result.payload_kind == "text"


def test_chunks_carrying_two_tokens_count_two_tokens_in_itl(server_2tok: FakeOpenAIServer) -> None:
    result = _run(server_2tok.base_url, _workload(4))
    m = result.metrics
    assert m.completed == 4 and m.total_output == 4 * K
    for rec in result.records:
        assert rec.chunk_tokens == [2] * (K // 2)  # the last chunk is written at TTFT + (K - 2) * GAP
        assert rec.latency >= rec.chunk_times[-1] >= (TTFT + (K - 2) * GAP) * EARLY
    # Per chunk: one sample per chunk after the first.
    assert m.chunk_itl.count == 4 * (K // 2 - 1)
    # Per token: each 2-token chunk after the first gives two samples of half its gap.
    assert m.itl.count == 4 * (K - 2)
    assert m.itl.mean == pytest.approx(m.chunk_itl.mean / 2)
    # TPOT = (E2EL - TTFT) / (K - 1): every token after the first, the two in the first chunk included.
    assert m.tpot.mean == pytest.approx(_mean_ms([(r.latency - r.ttft) / (K - 1) for r in result.records]))


def test_codec_figures_are_the_difference_of_two_scrapes(server: FakeOpenAIServer) -> None:
    result = _run(server.base_url, _workload(3, tokens=4), warmup_requests=2)
    fig = result.codec_figures
    assert fig is not None and fig.codec == "fakecodec"
    assert fig.request.messages == 3  # warmup excluded
    assert fig.output.messages == 3 * 4
    assert fig.request.encode_us == pytest.approx(REQ_ENCODE_NS / 1000)
    assert fig.request.decode_us == pytest.approx(REQ_DECODE_NS / 1000)
    assert fig.request.bytes_per_message == pytest.approx(REQ_BYTES)
    assert fig.request.frames_per_message == pytest.approx(REQ_FRAMES)
    assert fig.output.encode_us == pytest.approx(OUT_ENCODE_NS / 1000)
    assert fig.output.decode_us == pytest.approx(OUT_DECODE_NS / 1000)
    assert fig.output.bytes_per_message == pytest.approx(OUT_BYTES)
    assert fig.output.frames_per_message == pytest.approx(OUT_FRAMES)
    path_us = (REQ_ENCODE_NS + REQ_DECODE_NS + OUT_ENCODE_NS + OUT_DECODE_NS) / 1000
    assert fig.first_token_path_us == pytest.approx(path_us)
    assert fig.ttft_share(result.metrics.ttft.mean) == pytest.approx(path_us / (result.metrics.ttft.mean * 1000))


@pytest.mark.parametrize("serve_metrics, waits", [(True, 2), (False, 0)])
def test_scrapes_settle_only_for_a_server_with_codec_counters(
    serve_metrics: bool, waits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    settles: list[None] = []

    async def record() -> None:
        settles.append(None)

    monkeypatch.setattr(runner, "_settle", record)
    with FakeOpenAIServer(FakeConfig(ttft_s=0.0, token_gap_s=0.0, serve_metrics=serve_metrics)) as srv:
        result = _run(srv.base_url, _workload(2, tokens=2))
    assert len(settles) == waits  # before the load and after it, never for other servers
    assert (result.codec_figures is not None) is serve_metrics


def test_ctrl_c_while_settling_keeps_the_finished_run(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[None] = []

    async def cancelled_after_the_load() -> None:
        calls.append(None)
        if len(calls) == 2:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(5)

    monkeypatch.setattr(runner, "_settle", cancelled_after_the_load)
    result = _run(server.base_url, _workload(2, tokens=2))
    assert result.interrupted and result.metrics.completed == 2


def test_bad_endpoint_is_a_benchmark_error(server: FakeOpenAIServer) -> None:
    with pytest.raises(BenchmarkError, match="--endpoint must be one of"):
        _run(server.base_url, _workload(1), endpoint="/v1/embeddings")


def test_report_and_json_follow_benchmark_serving(server: FakeOpenAIServer, tmp_path: Path) -> None:
    result = _run(server.base_url, _workload(3, tokens=3), percentiles=(50.0, 99.9), goodput_slos_ms={"ttft": 10_000})
    text = format_report(result)
    lines = text.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    line = run_line(result)  # bench run's line a run, without --full-report
    assert line.startswith("3/3 in ") and "TTFT mean" in line and "nan" not in line and len(line) <= 100
    for label in (
        "Successful requests:",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Total generated tokens:",
        "Request throughput (req/s):",
        "Request goodput (req/s):",
        "Output token throughput (tok/s):",
        "Total Token throughput (tok/s):",
        "Mean TTFT (ms):",
        "Median TTFT (ms):",
        "P99.9 TTFT (ms):",
        "P50 TPOT (ms):",
        "Mean ITL (ms):",
        "Mean E2EL (ms):",
        "Mean schedule lag (ms):",
        "Codec share of mean TTFT (%):",
    ):
        assert any(line.startswith(label) for line in lines), label
    assert "---------------Time to First Token----------------" in lines
    assert "-----Time per Output Token (excl. 1st token)------" in lines
    assert "=" * 50 in lines
    assert next(line for line in lines if line.startswith("Successful requests:"))[41:].strip() == "3"

    result.flags = {"request_rate": float("inf"), "func": None}
    path = save_run(result, result_dir=tmp_path, sysinfo={"python": "3.x"})
    assert path.parent == tmp_path and path.name.startswith("fakecodec-")
    doc = json.loads(path.read_text())
    for key in (
        "date",
        "backend",
        "model_id",
        "tokenizer_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "generated_texts",
        "errors",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99.9_ttft_ms",
        "p50_tpot_ms",
        "mean_e2el_ms",
        "schema_version",
        "codec",
        "payload_kind",
        "failed",
        "records",
        "codec_figures",
        "schedule_lag",
        "metadata",
    ):
        assert key in doc, key
    assert doc["request_rate"] == "inf" and doc["backend"] == "openai"
    assert doc["output_lens"] == [3, 3, 3] and doc["failed"] == 0
    assert doc["request_goodput"] == pytest.approx(3 / doc["duration"])
    assert len(doc["records"]) == 3 and doc["records"][0]["chunk_tokens"] == [1, 1, 1]
    assert doc["metadata"]["python"] == "3.x" and doc["metadata"]["flags"]["request_rate"] == "inf"


def test_failures_are_counted_and_saved_and_exit_1(
    server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = _workload(6, tokens=4, bad={1: "FAIL500", 3: "CUTSTREAM", 4: "FAIL500", 5: "ERROREVENT"})
    monkeypatch.setattr(cli, "load_workload", lambda args: (workload, "test-tokenizer"))
    args = _parser().parse_args(
        [
            "--base-url",
            server.base_url,
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "out.json",
            "--no-progress",
            "--max-concurrency",
            "2",
        ]
    )
    assert cli.main(args) == 1
    out, err = capsys.readouterr()
    assert "Serving Benchmark Result" in out  # the report was printed; its figures are checked in the file
    # Counted by status and the server's message, the commonest first.
    assert "4 of 6 requests failed: 2 x HTTP 500: injected failure; 1 x " in err, err
    assert "1 x in stream: engine died" in err and "Errors, by status and the server's message" in out
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["completed"] == 2 and doc["failed"] == 4
    assert doc["failures"][0] == {"status": 500, "message": "injected failure", "count": 2}
    assert {"status": 200, "message": "engine died", "count": 1} in doc["failures"]
    assert doc["records"][1]["status"] == 500 and doc["records"][1]["error_message"] == "injected failure"
    assert doc["model_id"] == "fake-model"  # asked from /v1/models
    assert doc["tokenizer_id"] == "test-tokenizer"
    assert doc["errors"][1].startswith("HTTP 500") and doc["errors"][3]
    assert doc["errors"][0] == "" and doc["ttfts"][1] is None
    assert doc["metadata"]["flags"]["max_concurrency"] == 2


def test_all_good_exit_0_and_no_save(
    server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "load_workload", lambda args: (_workload(2, tokens=2), "tok"))
    monkeypatch.chdir(tmp_path)
    args = _parser().parse_args(
        ["--base-url", server.base_url, "--model", "m", "--no-save-result", "--request-rate", "50", "--no-progress"]
    )
    assert cli.main(args) == 0
    assert not (tmp_path / "results").exists()


def test_unreachable_server_exit_2_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = _parser().parse_args(["--base-url", f"http://127.0.0.1:{port}", "--no-progress"])
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("bench load: error: cannot reach the server at http://127.0.0.1:")


def test_images_need_the_chat_endpoint(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = [SampleRequest("look", 2, 2, ("data:image/png;base64,AAAA",))]
    monkeypatch.setattr(cli, "load_workload", lambda args: (workload, "tok"))
    args = _parser().parse_args(["--base-url", server.base_url, "--no-progress", "--no-save-result"])
    assert cli.main(args) == 2
    assert "--endpoint /v1/chat/completions" in capsys.readouterr().err
    args = _parser().parse_args(
        ["--base-url", server.base_url, "--no-progress", "--no-save-result", "--endpoint", "/v1/chat/completions"]
    )
    assert cli.main(args) == 0
    assert server.state.bodies[-1]["messages"][0]["content"][1]["type"] == "image_url"


def test_cancellation_returns_a_partial_result(server: FakeOpenAIServer) -> None:
    async def go() -> BenchmarkResult:
        settings = LoadSettings(request_rate=20.0, seed=3)
        task = asyncio.create_task(run_benchmark(server.base_url, "m", _workload(20, tokens=4), settings))
        await asyncio.sleep(0.25)
        task.cancel()
        return await task

    result = asyncio.run(go())
    assert result.interrupted
    assert result.metrics.failed > 0
    assert {r.error for r in result.records if not r.success} == {"cancelled"}
    assert result.metrics.completed + result.metrics.failed == 20


def test_ctrl_c_saves_what_it_has(server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "load_workload", lambda args: (_workload(30, tokens=4), "tok"))
    args = _parser().parse_args(
        [
            "--base-url",
            server.base_url,
            "--request-rate",
            "5",
            "--no-progress",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "partial.json",
        ]
    )
    # Python's SIGINT handler, whatever this test process inherited (a background job's is ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = threading.Event()
    seen_before = server.state.frontend.encode_count  # the server is shared with earlier tests

    def ctrl_c_once_under_way() -> None:
        # SIGINT as Ctrl-C would send it, once the server has seen requests (a fixed delay could land
        # before the load starts or, on a loaded machine, after all 30 requests are done: ~6 s at 5/s).
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            if server.state.frontend.encode_count >= seen_before + 2:
                _thread.interrupt_main()
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=ctrl_c_once_under_way, daemon=True)
    watcher.start()
    try:
        code = cli.main(args)
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGINT, previous)
    assert code == cli.EXIT_INTERRUPTED
    doc = json.loads((tmp_path / "partial.json").read_text())
    assert doc["interrupted"] is True and doc["failed"] > 0
    assert "cancelled" in doc["errors"]
