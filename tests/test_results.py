"""harness.analysis.frames and bench report --png (the gate: tests/test_gate.py).

The files are produced by the project's own writers: run files by
``documents.save_run`` on hand-built BenchmarkResults, compare files by
``compare.compare_document`` from ``bench_run.build_arms`` as ``bench run``
saves them. No timing is asserted: the numbers are made up and only checked
for being carried through faithfully (and, for the gate, judged).
"""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.documents import save_run, write_json
from harness.analysis.frames import ResultsError, itls_frame, load_compare, load_run, requests_frame, runs_frame
from harness.analysis.verdicts import Comparison, compare_document, judged_figures
from harness.experiment.arms import ArmSpec
from harness.experiment.flow import build_arms
from harness.experiment.rounds import RunOutcome
from harness.loadgen.client import RequestRecord
from harness.loadgen.metrics import compute_metrics
from harness.loadgen.runner import BenchmarkResult, LoadSettings
from harness.loadgen.serverstats import CodecFigures, DirectionFigures
from harness.server_metrics import prometheus

# ------------------------------------------------------------------ builders


def _records(scale: float, failed: bool = True, n: int = 4) -> list[RequestRecord]:
    """n successful requests (one with a 2-token chunk) and, when ``failed``, one failed one."""
    records = []
    for i in range(n):
        ttft = scale * (0.020 + 0.005 * i)
        gap = scale * (0.002 + 0.001 * i)
        tokens = [1, 1, 2, 1] if i == 1 else [1, 1, 1, 1]
        times = [ttft + gap * j for j in range(len(tokens))]
        records.append(
            RequestRecord(
                index=i,
                prompt_len=10 + i,
                expected_output_len=5,
                planned_send=0.01 * i,
                dispatched=0.01 * i + 0.0001,
                actual_send=0.01 * i + 0.0002 * (i + 1),
                ttft=ttft,
                latency=times[-1] + 0.0005,
                chunk_times=times,
                chunk_tokens=tokens,
                generated_text="x" * sum(tokens),
                output_tokens=sum(tokens),
                prompt_tokens=9 + i,
                usage_per_chunk=True,
                success=True,
            )
        )
    if not failed:
        return records
    records.append(
        RequestRecord(
            index=n,
            prompt_len=12,
            expected_output_len=5,
            planned_send=0.05,
            dispatched=0.05,
            actual_send=0.0501,
            error="boom",
        )
    )
    return records


def _direction(
    messages: float, enc_us: float, dec_us: float
) -> tuple[DirectionFigures, prometheus.CodecCell, prometheus.CodecCell]:
    enc = prometheus.CodecCell(messages, enc_us * messages / 1e6, 100.0 * messages, messages)
    dec = prometheus.CodecCell(messages, dec_us * messages / 1e6, 100.0 * messages, messages)
    return DirectionFigures(messages, enc_us, dec_us, 100.0, 1.0), enc, dec


def make_result(codec: str, rnd: int, scale: float = 1.0, enc_us: float = 30.0, failed: bool = True) -> BenchmarkResult:
    """A run whose latencies are multiplied by ``scale`` and whose request encode costs ``enc_us``;
    ``failed``: one of its requests failed (the run is then left out of verdicts)."""
    records = _records(scale, failed)
    request, req_enc, req_dec = _direction(4, enc_us, 2 * enc_us)
    output, out_enc, out_dec = _direction(20, 10.0 * scale, 8.0 * scale)
    figures = CodecFigures(
        codec,
        request,
        output,
        {
            ("request", "encode"): req_enc,
            ("request", "decode"): req_dec,
            ("output", "encode"): out_enc,
            ("output", "decode"): out_dec,
        },
    )
    return BenchmarkResult(
        metrics=compute_metrics(records, duration_s=1.0),
        records=records,
        settings=LoadSettings(),
        base_url="http://127.0.0.1:1",
        model="wirebench-tiny",
        codec=codec,
        payload_kind="text",
        num_prompts=len(records),
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        codec_figures=figures,
        flags={"codec": codec, "round": rnd},
    )


def write_comparison(
    folder: Path,
    specs: dict[str, dict | None],
    repeat: int = 2,
    relative: bool = False,
    name: str = "compare.json",
    noise: float = 0.0,
    seed: int = 0,
) -> Path:
    """Run files plus a compare file for codecs {name: make_result kwargs}, rounds interleaved.

    ``noise``: each run's latencies are scaled by exp(N(0, noise)) (seeded), round-to-round noise
    for the verdicts. ``relative`` writes result_file as bench run does from the repo root
    ("results/<file>"), which only resolves through the compare file's folder.
    """
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arms = [ArmSpec(codec, codec) for codec in specs]
    outcomes = []
    for rnd in range(repeat):
        for arm in arms:
            kwargs = specs[arm.codec]
            if kwargs is None:  # a codec that failed: no result, no file
                outcomes.append(RunOutcome(arm, rnd, status="error", message="engine died"))
                continue
            kwargs = dict(kwargs)
            kwargs["scale"] = kwargs.get("scale", 1.0) * math.exp(rng.gauss(0.0, noise))
            result = make_result(arm.codec, rnd, **kwargs)
            path = save_run(result, folder / f"{arm.codec}-r{rnd}-{name[:-5]}.json", sysinfo={})
            status = "failures" if result.failed else "ok"  # as bench_run.run_one says it
            outcomes.append(RunOutcome(arm, rnd, result, status=status, path=path))
    arm_list, order = build_arms(outcomes, arms)
    comparison = Comparison(arm_list, judged_figures([r for a in arm_list for r in a.measured]))
    path = folder / name
    doc = compare_document(comparison, folder=folder, repeat=repeat, order=order)
    if relative:
        for run in doc["runs"]:
            if run["result_file"]:
                run["result_file"] = f"results/{Path(run['result_file']).name}"
    write_json(path, doc, indent=2)
    return path


# Clean runs (a run with a failed request is left out of verdicts); the fixture's runs each fail one.
BASE = {"pickle": {"enc_us": 30.0, "failed": False}, "msgspec": {"enc_us": 10.0, "scale": 0.8, "failed": False}}


@pytest.fixture
def compare_file(tmp_path: Path) -> Path:
    return write_comparison(tmp_path / "run", {codec: {**kw, "failed": True} for codec, kw in BASE.items()})


# ------------------------------------------------------------------ harness.analysis.frames


def test_runs_frame_from_compare_file(compare_file: Path) -> None:
    frame = runs_frame(compare_file)
    assert list(frame["codec"]) == ["pickle", "msgspec", "pickle", "msgspec"]
    assert list(frame["round"]) == [0, 0, 1, 1]
    assert set(frame["status"]) == {"failures"}  # each run has one failed request
    for _, row in frame.iterrows():
        doc = load_run(row["file"])
        for key in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "request_throughput", "output_throughput"):
            assert row[key] == pytest.approx(doc[key])
        assert row["mean_e2el_ms"] == pytest.approx(doc["metrics"]["e2el"]["mean_ms"])
        assert row["request_encode_us"] == pytest.approx(doc["codec_figures"]["request"]["encode_us"])
        assert row["output_decode_us"] == pytest.approx(doc["codec_figures"]["output"]["decode_us"])
        assert row["completed"] == 4 and row["failed"] == 1
    assert frame.loc[frame["codec"] == "msgspec", "request_encode_us"].tolist() == pytest.approx([10.0, 10.0])


def test_folder_list_and_single_file_sources_agree(compare_file: Path) -> None:
    folder = runs_frame(compare_file.parent)  # run files only; compare.json is skipped
    assert len(folder) == 4
    both = runs_frame([compare_file.parent, compare_file])  # the same files, counted once
    assert len(both) == 4
    single = runs_frame(folder["file"].iloc[0])
    assert len(single) == 1 and single["status"].iloc[0] == "failures"
    assert single["round"].iloc[0] in (0, 1)


def test_requests_frame_matches_the_run_summary(compare_file: Path) -> None:
    runs = runs_frame(compare_file)
    requests = requests_frame(compare_file)
    assert len(requests) == 4 * len(runs)  # the failed request of each run is left out
    for _, run in runs.iterrows():
        mine = requests[requests["file"] == run["file"]]
        assert mine["ttft_ms"].mean() == pytest.approx(run["mean_ttft_ms"])
        assert mine["tpot_ms"].mean() == pytest.approx(run["mean_tpot_ms"])
        assert mine["e2el_ms"].mean() == pytest.approx(run["mean_e2el_ms"])
    first = requests.iloc[1]
    assert first["index"] == 1 and first["output_tokens"] == 5 and first["chunks"] == 4
    assert first["prompt_len"] == 11 and first["prompt_tokens"] == 10
    assert first["schedule_lag_ms"] == pytest.approx(0.4)  # actual 0.0104 s − planned 0.0100 s


def test_itls_frame_per_token_and_per_chunk(compare_file: Path) -> None:
    runs = runs_frame(compare_file)
    tokens = itls_frame(compare_file, per="token")
    chunks = itls_frame(compare_file, per="chunk")
    for _, run in runs.iterrows():
        key = (tokens["codec"] == run["codec"]) & (tokens["round"] == run["round"])
        assert tokens.loc[key, "itl_ms"].mean() == pytest.approx(run["mean_itl_ms"])
        ckey = (chunks["codec"] == run["codec"]) & (chunks["round"] == run["round"])
        assert chunks.loc[ckey, "itl_ms"].mean() == pytest.approx(run["mean_chunk_itl_ms"])
        # The 2-token chunk counts as two tokens: one more sample per run than chunk gaps.
        assert key.sum() == ckey.sum() + 1
    with pytest.raises(ValueError):
        itls_frame(compare_file, per="word")


def test_relative_result_files_resolve_through_the_compare_folder(tmp_path: Path) -> None:
    compare = write_comparison(tmp_path / "baselines", BASE, relative=True)
    assert json.loads(compare.read_text())["runs"][0]["result_file"].startswith("results/")
    assert len(runs_frame(compare)) == 4


def test_a_run_without_a_file_is_a_row_without_figures(tmp_path: Path) -> None:
    compare = write_comparison(tmp_path, {"pickle": {}, "msgspec": None}, repeat=1)
    frame = runs_frame(compare)
    broken = frame[frame["codec"] == "msgspec"].iloc[0]
    assert broken["status"] == "error" and broken["message"] == "engine died"
    assert pd.isna(broken["file"]) and math.isnan(broken["mean_ttft_ms"])
    assert set(requests_frame(compare)["codec"]) == {"pickle"}


def test_a_benchmark_serving_style_file_without_records(tmp_path: Path, compare_file: Path) -> None:
    doc = load_run(runs_frame(compare_file)["file"].iloc[0])
    del doc["records"], doc["metrics"]  # what vLLM's benchmark_serving saves has neither
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(doc))
    run = runs_frame(path).iloc[0]
    assert run["mean_ttft_ms"] == pytest.approx(doc["mean_ttft_ms"]) and math.isnan(run["mean_e2el_ms"])
    requests = requests_frame(path)
    assert len(requests) == 4 and requests["ttft_ms"].mean() == pytest.approx(doc["mean_ttft_ms"])
    assert requests["e2el_ms"].isna().all()
    itls = itls_frame(path)  # only chunk gaps are saved there
    assert set(itls["per"]) == {"chunk"} and len(itls) == sum(len(g) for g in doc["itls"])


def test_bad_input_raises_clear_errors(tmp_path: Path, compare_file: Path) -> None:
    with pytest.raises(ResultsError, match="compare file"):
        load_run(compare_file)
    with pytest.raises(ResultsError, match="run file"):
        load_compare(runs_frame(compare_file)["file"].iloc[0])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ResultsError, match="not valid JSON"):
        runs_frame(bad)
    with pytest.raises(ResultsError, match="no such file"):
        runs_frame(tmp_path / "missing.json")
    doc = json.loads(compare_file.read_text())
    doc["runs"][0]["result_file"] = "gone/pickle-r0.json"
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(doc))
    # A compact compare document embeds each run's figures: a missing run file is not needed.
    assert runs_frame(moved)["mean_ttft_ms"].iloc[0] == runs_frame(compare_file)["mean_ttft_ms"].iloc[0]
    del doc["runs"][0]["figures"]  # without them (a schema 1 file) the file is needed
    moved.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match="not found"):
        runs_frame(moved)


# ------------------------------------------------------------------ bench report --png


def test_report_png_draws_one_png_and_no_page_unless_asked(
    tmp_path: Path, compare_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness import cli

    monkeypatch.chdir(tmp_path)
    target = tmp_path / "out" / "plot.png"
    assert cli.main(["report", str(compare_file), "--png", str(target)]) == 0
    assert capsys.readouterr().out.strip() == f"Plot written to {target}"
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
    assert not (tmp_path / "report.html").exists()  # --png alone: the PNG only

    page = tmp_path / "page.html"
    assert cli.main(["report", str(compare_file), "--png", str(target), "--log-scale", "-o", str(page)]) == 0
    assert page.read_text().startswith("<!DOCTYPE html>") and target.read_bytes() != data

    assert cli.main(["report", str(tmp_path / "nothing.json"), "--png", str(target)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_trace_replayed_at_its_timestamps_has_no_planned_rate_and_no_judged_throughput() -> None:
    """Its recorded --request-rate (inf by default) played no part, so req/s is not judged as at
    rate inf, and the table shows each figure once."""
    from harness.analysis.documents import run_figures
    from harness.analysis.figures import SHOWN_FIGURES, THROUGHPUT_FIGURES
    from harness.analysis.runs import RunEntry
    from harness.analysis.verdicts import figures_table

    def entry(flags: dict[str, str]) -> RunEntry:
        doc = {"request_rate": "inf", "metadata": {"flags": flags}, "request_throughput": 3.8}
        return RunEntry("msgspec", 0, "ok", "", None, doc, run_figures(doc))

    timed = entry({"dataset_name": "trace", "trace_arrivals": "timestamps"})
    assert math.isnan(timed.figures["request_rate"])
    assert not set(THROUGHPUT_FIGURES) & set(judged_figures([timed]))
    planned = entry({"dataset_name": "trace", "trace_arrivals": "rate"})
    assert set(THROUGHPUT_FIGURES) <= set(judged_figures([planned]))
    header = figures_table(Comparison([], judged_figures([planned])), SHOWN_FIGURES)[0]
    assert header.count("req/s") == 1, header


def test_a_run_records_whether_its_requests_went_at_their_own_times(tmp_path: Path) -> None:
    """The runner records what set the sends (fake server, real client); a run file's record wins
    over the trace flags, which are read only from files written before it was recorded."""
    import asyncio

    from harness.analysis.documents import run_figures
    from harness.loadgen import runner
    from harness.workloads.sample import SampleRequest

    from fake_openai_server import FakeConfig, FakeOpenAIServer

    def run(base_url: str, times: list[float | None]) -> BenchmarkResult:
        workload = [SampleRequest(f"prompt {i}", 4, 2, arrival_s=t) for i, t in enumerate(times)]
        settings = LoadSettings(request_rate=50.0, seed=3, progress=False)
        return asyncio.run(runner.run_benchmark(base_url, "fake-model", workload, settings))

    with FakeOpenAIServer(FakeConfig(ttft_s=0.005, token_gap_s=0.001)) as server:
        timed, planned = run(server.base_url, [0.0, 0.01]), run(server.base_url, [None, None])
    assert timed.own_send_times and not planned.own_send_times

    def figures(result: BenchmarkResult, name: str) -> dict[str, float]:
        doc = json.loads(save_run(result, result_dir=tmp_path, filename=name, sysinfo={}).read_text())
        assert doc["metadata"]["own_send_times"] is result.own_send_times
        return run_figures(doc)

    assert math.isnan(figures(timed, "timed.json")["request_rate"])  # no trace flags: the record says
    assert figures(planned, "planned.json")["request_rate"] == 50.0
    planned.flags = {"dataset_name": "trace", "trace_arrivals": "timestamps"}  # recorded False wins
    assert figures(planned, "flagged.json")["request_rate"] == 50.0


def test_the_ipc_table_shows_the_store_hit_rate_only_where_a_store_ran() -> None:
    from harness.analysis.runs import RunEntry
    from harness.analysis.verdict_text import ipc_lines
    from harness.analysis.verdicts import Arm

    def arm(label: str, figures: dict[str, float]) -> Arm:
        return Arm(label, [RunEntry(label, 0, "ok", "", None, None, figures)])

    plain = {"ipc_ipc_mean_us": 100.0}
    assert "store hit rate" not in "\n".join(ipc_lines([arm("zmq", plain)]))
    stored = [arm("zmq", plain), arm("shm-store", {**plain, "mm_store_hit_pct": 50.0})]
    assert "store hit rate" in "\n".join(ipc_lines(stored))
    missed = [arm("zmq", plain), arm("shm-store", {**plain, "mm_store_hit_pct": 0.0})]  # every frame new
    assert "store hit rate" in "\n".join(ipc_lines(missed))


def test_the_comparison_fits_100_columns_however_long_the_arms_labels() -> None:
    """Arms whose columns would pass 100 characters go on to a table of their own, the rows repeated."""
    from harness.analysis.runs import RunEntry
    from harness.analysis.verdict_text import format_comparison
    from harness.analysis.verdicts import Arm

    labels = [f"pickle+request-delay={d}us/shm-store" for d in (0, 125, 250, 500, 1000)]
    arms = [
        Arm(label, [RunEntry(label, r, "ok", "", None, None, {"mean_ttft_ms": 20.0 + r + i}) for r in range(3)])
        for i, label in enumerate(labels)
    ]
    text = format_comparison(arms, None)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert all(label in text for label in labels) and text.count("TTFT mean, ms") >= 2 and "nan" not in text
