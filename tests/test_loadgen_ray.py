"""``--ray``: the load workers as Ray actors, on a local Ray instance (ray.init(num_cpus=2)) against the fake server.

Ray is in the test extra, so this runs in CI; ``ray.init`` takes ~7 s on a
2-core machine, paid once for the module.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import Iterator

import pytest

from harness.analysis.documents import run_document
from harness.loadgen import runner
from harness.loadgen.runner import BenchmarkResult, LoadSettings, run_benchmark
from harness.workloads.sample import SampleRequest

from fake_openai_server import FakeConfig, FakeOpenAIServer

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a local Ray instance: processes and ~5 s to start
TOKENS = 3


@pytest.fixture(autouse=True)
def _no_scrape_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "SCRAPE_SETTLE_S", 0.0)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeConfig(ttft_s=0.02, token_gap_s=0.005)) as srv:
        yield srv


def test_ray_actors_give_the_result_one_process_gives(local_ray: None, server: FakeOpenAIServer) -> None:
    assert importlib.util.find_spec("ray") is not None

    def run(**kw: object) -> BenchmarkResult:
        settings = LoadSettings(request_rate=100.0, seed=5, progress=False, **kw)  # type: ignore[arg-type]
        workload = [SampleRequest(f"p {i}", 4, TOKENS) for i in range(10)]
        return asyncio.run(run_benchmark(server.base_url, "fake-model", workload, settings))

    single, distributed = run(), run(workers=2, ray="")
    assert (distributed.metrics.completed, distributed.metrics.failed) == (10, 0)
    assert [r.index for r in distributed.records] == list(range(10))
    assert [r.planned_send for r in distributed.records] == [r.planned_send for r in single.records]
    assert distributed.metrics.itl.count == 10 * (TOKENS - 1)
    doc1, doc2 = run_document(single), run_document(distributed)
    assert set(doc1) == set(doc2) and set(doc1["records"][0]) == set(doc2["records"][0])
    client = doc2["client"]
    assert client["mode"] == "ray" and client["workers"] == 2
    assert {w["requests"] for w in client["worker_details"]} == {5}
    assert os.getpid() not in {w["pid"] for w in client["worker_details"]}
    # The start spread is measured through clock offsets, with its uncertainty.
    assert client["barrier_spread_ms"] >= 0 and client["barrier_uncertainty_ms"] >= 0


def test_ctrl_c_stops_the_actors_and_keeps_every_request(local_ray: None, server: FakeOpenAIServer) -> None:
    async def go() -> BenchmarkResult:
        settings = LoadSettings(request_rate=10.0, seed=3, workers=2, ray="", progress=False)
        workload = [SampleRequest(f"p {i}", 4, 2) for i in range(30)]
        task = asyncio.create_task(run_benchmark(server.base_url, "m", workload, settings))
        start = len(server.state.bodies)
        deadline = time.monotonic() + 60
        # Five arrived (the fifth at ~0.41 s for this seed): the first has finished, 25 are unsent.
        while len(server.state.bodies) - start < 5:
            assert time.monotonic() < deadline, "the load never started"
            await asyncio.sleep(0.02)
        task.cancel()
        return await task

    result = asyncio.run(go())
    assert result.interrupted and len(result.records) == 30
    assert result.metrics.completed >= 1 and result.metrics.failed >= 1
    assert {r.error for r in result.records if not r.success} == {"cancelled"}
