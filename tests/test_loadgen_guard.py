"""The client-bottleneck guard on controlled inputs: synthetic records and a deliberately blocked event loop."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

import pytest

from harness.loadgen import guard, runner
from harness.loadgen.client import RequestRecord
from harness.loadgen.guard import assess, count_reads, format_lines, health_dict
from harness.loadgen.looplag import LoopLagProbe
from harness.loadgen.report import format_report
from harness.loadgen.runner import LoadSettings, run_benchmark
from harness.workloads.sample import SampleRequest

from fake_openai_server import FakeConfig, FakeOpenAIServer

QUIET_LOOP = [0.0005] * 1000  # 0.5 ms overshoots: a loop with time to spare


def _rec(i: int, *, lag: float = 0.001, chunk_times: list[float] | None = None, wait: float = 0.0) -> RequestRecord:
    """A successful request planned at i * 10 ms, dispatched ``lag`` late, sent ``wait`` later still."""
    times = chunk_times if chunk_times is not None else [0.1 + 0.005 * k for k in range(10)]
    planned = i * 0.01
    return RequestRecord(
        index=i,
        prompt_len=4,
        expected_output_len=len(times),
        planned_send=planned,
        dispatched=planned + lag,
        actual_send=planned + lag + wait,
        ttft=times[0],
        latency=times[-1],
        chunk_times=times,
        chunk_tokens=[1] * len(times),
        output_tokens=len(times),
        success=True,
    )


def test_a_comfortable_run_is_ok() -> None:
    health = assess([_rec(i) for i in range(200)], QUIET_LOOP, request_rate=100.0)
    assert not health.limited and health.reasons == ()
    assert health.lag_kind == "schedule" and health.lag_p99_ms == pytest.approx(1.0)
    assert health.coalesced_reads == 0 and health.output_reads == 200 * 10
    lines = format_lines(health)
    assert lines[0].startswith("-") and "Client health" in lines[0]
    assert any(line.startswith("Verdict:") and "ok" in line for line in lines)


def test_late_sends_make_the_run_client_limited() -> None:
    records = [_rec(i, lag=0.050 if i % 10 == 0 else 0.001) for i in range(200)]  # 10 % sent 50 ms late
    health = assess(records, QUIET_LOOP, request_rate=100.0)
    assert health.limited
    assert len(health.reasons) == 1 and health.reasons[0].startswith("p99 schedule lag 50.0 ms")
    assert any("CLIENT-LIMITED" in line for line in format_lines(health))


def test_a_slow_event_loop_makes_the_run_client_limited() -> None:
    loop_lag = [0.0005] * 95 + [0.030] * 5  # 5 % of wake-ups 30 ms late
    health = assess([_rec(i) for i in range(50)], loop_lag, request_rate=100.0)
    assert health.limited and health.reasons[0].startswith("p99 event-loop lag 30.0 ms")
    assert health.loop_lag_max_ms == pytest.approx(30.0) and health.loop_lag_samples == 100


def test_coalesced_reads_are_counted_from_equal_chunk_times() -> None:
    # Reads at 0.10, 0.11 (two chunks), 0.12, 0.13 (three chunks): 4 reads, 2 of them coalesced.
    rec = _rec(0, chunk_times=[0.10, 0.11, 0.11, 0.12, 0.13, 0.13, 0.13])
    assert count_reads([rec]) == (4, 2)
    coalesced = [_rec(i, chunk_times=[0.1, 0.1, 0.2, 0.3]) for i in range(20)]  # 1 of 3 reads carried two chunks
    health = assess(coalesced, QUIET_LOOP, request_rate=100.0)
    assert health.limited and health.coalesced_share == pytest.approx(1 / 3)
    assert "output reads carried several chunks" in health.reasons[0]


def test_chunks_the_server_wrote_back_to_back_are_not_held_against_the_client() -> None:
    coalesced = [_rec(i, chunk_times=[0.1, 0.1, 0.2, 0.3]) for i in range(20)]  # a third of the reads: two chunks
    # The server took a quarter of its outputs with the next one waiting: one per request, as the reads show.
    health = assess(coalesced, QUIET_LOOP, request_rate=100.0, server_behind_share=0.25)
    assert not health.limited and health.reasons == ()
    assert "the server wrote 25.0% of its outputs back to back" in health.notes[0]
    lines = format_lines(health)
    assert any(line.startswith("Server outputs back to back (%):") and "25.00" in line for line in lines)
    assert any("ok (the client kept up)" in line for line in lines) and any("the server's doing" in ln for ln in lines)
    assert health_dict(health)["server_behind_share"] == 0.25 and health_dict(health)["notes"] == list(health.notes)
    # 80 chunks in 60 reads: 20 shared a read. 0.25 explains all 20; 0.2 explains 16, +3% of 60 reads is 17.8.
    assert assess(coalesced, QUIET_LOOP, request_rate=100.0, server_behind_share=0.2).limited
    # Bursts of three: 20 requests x 5 chunks in 3 reads, 40 of 100 chunks shared a read, 1 read in 3 coalesced.
    # Behind on a third of its outputs the server explains 33 of the 40 (the client's line adds 1.8): limited.
    bursts = [_rec(i, chunk_times=[0.1, 0.1, 0.1, 0.2, 0.3]) for i in range(20)]
    assert assess(bursts, QUIET_LOOP, request_rate=100.0, server_behind_share=1 / 3).limited
    assert not assess(bursts, QUIET_LOOP, request_rate=100.0, server_behind_share=0.4).limited
    # A server that does not count them, or a client whose own loop lagged, is judged as before.
    assert assess(coalesced, QUIET_LOOP, request_rate=100.0).limited
    slow_loop = [0.0005] * 95 + [0.030] * 5
    late = assess(coalesced, slow_loop, request_rate=100.0, server_behind_share=0.5)
    assert late.limited and len(late.reasons) == 2 and late.notes == ()


def test_rate_inf_does_not_judge_schedule_lag() -> None:
    # Everything planned at 0: the last request's lag is just the time to start them all.
    records = [_rec(0, lag=0.001 * i) for i in range(500)]
    health = assess(records, QUIET_LOOP, request_rate=math.inf)
    assert not health.limited and health.lag_kind == ""


def test_with_max_concurrency_the_dispatch_lag_is_judged_not_the_slot_wait() -> None:
    # A second's wait for a slot is the limit at work; the runner itself was on time.
    records = [_rec(i, lag=0.001, wait=1.0) for i in range(100)]
    assert assess(records, QUIET_LOOP, request_rate=100.0).limited
    health = assess(records, QUIET_LOOP, request_rate=100.0, max_concurrency=4)
    assert not health.limited and health.lag_kind == "dispatch"


def test_health_dict_is_the_result_files_client_section() -> None:
    health = assess([_rec(i) for i in range(10)], [], request_rate=10.0)
    doc = health_dict(health)
    assert doc is not None and health_dict(None) is None
    assert doc["limited"] is False and doc["mode"] == "in-process" and doc["workers"] == 1
    assert math.isnan(doc["loop_lag"]["p99_ms"])  # no samples: NaN (null in the file)
    assert set(doc["thresholds"]) == {"schedule_lag_p99_ms", "loop_lag_p99_ms", "coalesced_share"}


def test_loop_lag_probe_sees_a_blocked_loop() -> None:
    async def go() -> list[float]:
        probe = LoopLagProbe.start(interval_s=0.005)
        await asyncio.sleep(0.02)
        time.sleep(0.05)  # the loop cannot wake anyone for 50 ms
        await asyncio.sleep(0.02)
        return probe.stop()

    samples = asyncio.run(go())
    assert max(samples) >= 0.04


# ---------------------------------------------------------------- a real run


@pytest.fixture(autouse=True)
def _no_scrape_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "SCRAPE_SETTLE_S", 0.0)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeConfig(ttft_s=0.02, token_gap_s=0.005)) as srv:
        yield srv


def test_the_guard_fires_on_an_overloaded_in_process_run(server: FakeOpenAIServer) -> None:
    """A CPU hog in the client's own loop (30 ms blocks) stands for a client out of CPU."""
    workload = [SampleRequest(f"p {i}", 4, 6) for i in range(10)]

    async def go() -> runner.BenchmarkResult:
        async def hog() -> None:
            while True:
                time.sleep(0.03)
                await asyncio.sleep(0.001)

        hogging = asyncio.create_task(hog())
        try:
            return await run_benchmark(server.base_url, "m", workload, LoadSettings(request_rate=50.0))
        finally:
            hogging.cancel()

    result = asyncio.run(go())
    health = result.client_health
    assert health is not None and health.mode == "in-process"
    assert result.metrics.completed == 10
    assert health.limited and any("event-loop lag" in r for r in health.reasons)
    # A 30 ms block overlaps at most the probe's own 10 ms sleep: every overshoot it causes is >= 20 ms.
    assert health.loop_lag_max_ms >= 15.0
    text = format_report(result)
    assert "Client health" in text and "CLIENT-LIMITED" in text


def test_strict_client_exits_4_when_the_guard_fires(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from harness.commands import load as cli

    monkeypatch.setattr(cli, "load_workload", lambda args: ([SampleRequest("p", 4, 3)] * 3, "tok"))
    monkeypatch.setattr(guard, "LOOP_LAG_P99_MS", -1.0)  # every loop now counts as too slow
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)  # bench load's own flags: --strict-client is there
    base = ["--base-url", server.base_url, "--no-progress", "--no-save-result"]
    assert cli.main(parser.parse_args(base)) == 0  # the guard only reports
    assert cli.main(parser.parse_args([*base, "--strict-client"])) == cli.EXIT_CLIENT_LIMITED == 4
    assert "--strict-client" in capsys.readouterr().err
