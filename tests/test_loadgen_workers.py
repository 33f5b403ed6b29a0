"""``--workers N``: the schedule split across spawned client processes, one result as from one process.

Asserts structure and accounting only (never speed): every request comes
back exactly once, in request order, with the same fields and the same JSON
keys as a single-process run; a worker that dies or a Ctrl-C still accounts
for every request.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator

import pytest

from harness.analysis.documents import run_document
from harness.commands import load as cli
from harness.loadgen import runner
from harness.loadgen.client import RequestRecord
from harness.loadgen.fanout import local_workers
from harness.loadgen.metrics import compute_metrics
from harness.loadgen.runner import BenchmarkError, BenchmarkResult, LoadSettings, run_benchmark
from harness.loadgen.workers import (
    WorkerJob,
    WorkerOutcome,
    auto_workers,
    combine,
    is_local_url,
    parse_workers,
    split_limit,
    split_round_robin,
)
from harness.workloads.sample import SampleRequest

from fake_openai_server import FakeConfig, FakeOpenAIServer

TOKENS = 4


@pytest.fixture(autouse=True)
def _no_scrape_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "SCRAPE_SETTLE_S", 0.0)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeConfig(ttft_s=0.02, token_gap_s=0.005)) as srv:
        yield srv


def _workload(n: int, tokens: int = TOKENS) -> list[SampleRequest]:
    return [SampleRequest(f"prompt {i}", 4, tokens) for i in range(n)]


def _run(base_url: str, n: int, **kw: object) -> BenchmarkResult:
    settings = LoadSettings(request_rate=100.0, seed=7, progress=False, **kw)  # type: ignore[arg-type]
    return asyncio.run(run_benchmark(base_url, "fake-model", _workload(n), settings))


# ---------------------------------------------------------------- pure parts


def test_round_robin_slices_cover_every_request_once() -> None:
    slices = split_round_robin(10, 3)
    assert slices == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert sorted(i for s in slices for i in s) == list(range(10))


def test_max_concurrency_is_shared_out_or_refused() -> None:
    assert split_limit(None, 3) == [None, None, None]
    assert split_limit(10, 3) == [4, 3, 3] and sum(n or 0 for n in split_limit(64, 7)) == 64
    with pytest.raises(ValueError, match="--max-concurrency 2 is below the number of load workers"):
        split_limit(2, 3)
    parser = argparse.ArgumentParser()
    cli.add_load_arguments(parser)
    with pytest.raises(BenchmarkError, match="each worker needs at least one slot"):
        LoadSettings.from_args(parser.parse_args(["--workers", "3", "--max-concurrency", "2"]))
    assert LoadSettings.from_args(parser.parse_args(["--workers", "auto"])).workers == "auto"
    assert LoadSettings.from_args(parser.parse_args([])).workers == 1


def test_workers_flag_and_the_auto_rule() -> None:
    assert parse_workers("3") == 3 and parse_workers("AUTO") == "auto"
    for bad in ("0", "-1", "two"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_workers(bad)
    # Server on this host: half the usable CPUs; elsewhere: all but one; always 1..8.
    assert [auto_workers(c) for c in (1, 2, 3, 4, 16, 64)] == [1, 1, 1, 2, 8, 8]
    assert [auto_workers(c, local_server=False) for c in (1, 2, 3, 4, 16)] == [1, 1, 2, 3, 8]
    assert (
        is_local_url("http://127.0.0.1:8000") and is_local_url("http://localhost:1") and is_local_url("http://[::1]:2")
    )
    assert not is_local_url("http://10.1.2.3:8000")
    # auto never takes more workers than --max-concurrency has slots.
    assert local_workers("auto", "http://10.1.2.3:8000", 1) == 1


def test_a_dead_worker_counts_its_slice_as_failed_saying_so() -> None:
    records = [RequestRecord(i, 4, 2, i * 0.1) for i in range(6)]
    jobs = [WorkerJob(w, "u", False, None, None, records[w::2], [b""] * 3) for w in range(2)]
    done = [RequestRecord(i, 4, 2, i * 0.1, success=True, actual_send=i * 0.1) for i in (0, 2, 4)]
    outcome = WorkerOutcome(0, done, end_s=1.5, start_late_s=0.001, start_wall=0.0)
    load = combine(
        6,
        jobs,
        {0: outcome},
        {1: "(pid 99) died (exit code -9)"},
        mode="processes",
        interrupted=False,
        start_offsets_s={0: 0.001},
        uncertainty_ms=0.0,
    )
    assert [r.index for r in load.records] == list(range(6))
    assert [r.success for r in load.records] == [True, False] * 3
    assert load.records[1].error == "load worker 1 (pid 99) died (exit code -9); its records were lost"
    assert load.duration_s == 1.5 and load.barrier_spread_ms is None  # one worker came back
    assert load.workers[1].error.startswith("(pid 99) died")


# ---------------------------------------------------------------- real processes


def test_two_workers_give_the_result_one_process_gives(server: FakeOpenAIServer) -> None:
    single = _run(server.base_url, 12)
    multi = _run(server.base_url, 12, workers=2)
    for result in (single, multi):
        assert (result.metrics.completed, result.metrics.failed) == (12, 0)
        assert [r.index for r in result.records] == list(range(12))
    # Same schedule, same record fields, same JSON keys.
    assert [r.planned_send for r in multi.records] == [r.planned_send for r in single.records]
    doc1, doc2 = run_document(single), run_document(multi)
    assert set(doc1) == set(doc2)
    assert set(doc1["records"][0]) == set(doc2["records"][0])
    assert doc2["client"]["mode"] == "processes" and doc2["client"]["workers"] == 2
    assert doc1["client"]["mode"] == "in-process"
    pids = {w["pid"] for w in doc2["client"]["worker_details"]}
    assert len(pids) == 2 and os.getpid() not in pids
    assert doc2["client"]["barrier_spread_ms"] is not None
    # Times are relative to the shared origin, as in one process: sends follow the plan.
    for rec in multi.records:
        assert rec.actual_send >= rec.planned_send - 0.001 and rec.ttft > 0
    # Metrics come once from all raw records.
    again = compute_metrics(multi.records, multi.metrics.duration_s, selected_metrics=("ttft", "tpot", "itl"))
    assert multi.metrics.itl.count == again.itl.count == 12 * (TOKENS - 1)
    assert multi.metrics.ttft.mean == again.ttft.mean


def _children() -> list[mp.process.BaseProcess]:
    return [p for p in mp.active_children() if p.name.startswith("wirebench-load-")]


async def _when_requests_arrive(server: FakeOpenAIServer, count: int, timeout_s: float = 60.0) -> None:
    start = len(server.state.bodies)
    deadline = time.monotonic() + timeout_s
    while len(server.state.bodies) - start < count:
        assert time.monotonic() < deadline, "the load never started"
        await asyncio.sleep(0.02)


def test_a_worker_killed_mid_run_is_accounted_for(server: FakeOpenAIServer) -> None:
    async def go() -> BenchmarkResult:
        settings = LoadSettings(request_rate=10.0, seed=1, workers=2, progress=False)
        task = asyncio.create_task(run_benchmark(server.base_url, "m", _workload(30, tokens=2), settings))
        await _when_requests_arrive(server, 2)
        victim = next(p for p in _children() if p.name == "wirebench-load-1")
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        return await task

    result = asyncio.run(go())
    assert len(result.records) == 30 and [r.index for r in result.records] == list(range(30))
    lost = [r for r in result.records if r.index % 2 == 1]
    assert all(not r.success and "load worker 1" in r.error and "died" in r.error for r in lost)
    assert all(r.success for r in result.records if r.index % 2 == 0)
    assert result.metrics.completed == 15 and result.metrics.failed == 15
    assert not _children()


def test_ctrl_c_with_workers_returns_every_request(server: FakeOpenAIServer) -> None:
    async def go() -> BenchmarkResult:
        settings = LoadSettings(request_rate=10.0, seed=2, workers=2, progress=False)
        task = asyncio.create_task(run_benchmark(server.base_url, "m", _workload(40, tokens=2), settings))
        # Six arrived (the sixth at ~0.28 s for this seed): the first has long finished, so one
        # completes even on a loaded machine, and 34 are still unsent, so some are cancelled.
        await _when_requests_arrive(server, 6)
        task.cancel()
        return await task

    result = asyncio.run(go())
    assert result.interrupted
    assert result.metrics.completed + result.metrics.failed == 40 == len(result.records)
    assert result.metrics.completed >= 1 and result.metrics.failed >= 1
    assert {r.error for r in result.records if not r.success} == {"cancelled"}
    assert not any(math.isnan(r.planned_send) for r in result.records)
    assert not _children()


def test_ray_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    parser = argparse.ArgumentParser()
    cli.add_load_arguments(parser)
    args = parser.parse_args(["--ray"])
    assert args.ray == ""
    with pytest.raises(BenchmarkError, match=r"pip install 'wirebench\[distributed\]'"):
        LoadSettings.from_args(args)
    assert parser.parse_args(["--ray", "ray://head:10001"]).ray == "ray://head:10001"
