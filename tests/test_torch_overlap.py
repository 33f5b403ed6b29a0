"""One step of overlap on the torch executor: the forward and sampling of step N run on the
device thread while the host prepares step N+1, whose rows that feed N's tokens are filled on
the device (``TorchExecutor.launch``).

The real tiny model on the CPU; token streams, finish reasons and logprobs equal the loop in
series for the same seed: greedy, seeded, penalties and logit bias (their token history is
kept on the device side), stops, EOS, min_tokens, chunked prefills, aborts, preemption and
prefix hits, images. Each again with the sampled ids handed back later, as on CUDA (a side
stream's copy, ``harness.engine.read_back``), emulated on the CPU.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from test_overlap import Stream, make_core, request, serve, workload

from harness.engine.core import EngineCore
from harness.engine.device_thread import Pending
from harness.engine.executor import TorchExecutor
from harness.engine.read_back import ReadBack
from harness.wire.messages import EngineCoreRequest, PlaceholderRange, SamplingParams


def torch_core(overlapped: bool, deferred: bool = False, **kw: Any) -> EngineCore:
    """``test_overlap``'s engine with the tiny model on the CPU (the sim's knobs go unread);
    ``deferred``: launched steps' ids are handed over when read, as CUDA's side-stream copy is."""
    core = make_core(overlapped, executor="torch", device="cpu", overlap_on_cpu=True, **kw)
    assert isinstance(core.executor, TorchExecutor)
    core.executor.read_back.deferred = deferred
    return core


def rounded(streams: Stream) -> Stream:
    """Logprobs to 4 decimals: a step's batch differs between the loops (a wasted row), and float
    sums over another batch shape differ in the last bits; the tokens may not."""

    def item(t: Any) -> Any:
        if isinstance(t, tuple):
            return (t[0], t[1], [[round(v, 4) for v in row] for row in t[2]])
        return t

    return {rid: [item(t) for t in s] for rid, s in streams.items()}


def both(
    load: Any, abort: dict[str, int] | None = None, deferred: bool = False, **kw: Any
) -> tuple[Stream, Stream, EngineCore]:
    series = serve(torch_core(False, **kw), load(), abort or {})
    core = torch_core(True, deferred, **kw)
    return rounded(series), rounded(serve(core, load(), abort or {})), core


def seeded_workload() -> dict[int, list[EngineCoreRequest]]:
    """``test_overlap``'s workload with every unseeded request greedy: unseeded ones share the
    engine's generator, whose draws depend on the batch (a wasted row draws too), as in vLLM."""
    load = workload()
    for reqs in load.values():
        for r in reqs:
            if r.sampling_params.seed is None:
                r.sampling_params.temperature = 0.0
    return load


@pytest.mark.parametrize("deferred", [False, True])
def test_overlapped_streams_equal_the_loop_in_series(deferred: bool) -> None:
    series, overlapped, core = both(seeded_workload, {"stop-string": 4}, deferred)
    assert overlapped == series
    reasons = {s[-1] for s in series.values()}
    assert {"FinishReason.LENGTH", "FinishReason.STOP"} <= reasons
    stats = core.device_stats()
    assert stats is not None and stats.steps > 0 and stats.busy_ns > 0  # the steps ran on the device thread


@pytest.mark.parametrize("deferred", [False, True])
def test_penalties_and_bias_keep_their_history_on_the_device_side(deferred: bool) -> None:
    def load() -> dict[int, list[EngineCoreRequest]]:
        return {
            0: [
                request("rep", temperature=0.0, repetition_penalty=1.5, max_tokens=30, ignore_eos=True),
                request("freq", seed=3, frequency_penalty=1.0, presence_penalty=0.5, max_tokens=30),
                request("bias", temperature=0.0, logit_bias={7: 5.0}, max_tokens=20, ignore_eos=True),
                request("plain", temperature=0.0, max_tokens=25, ignore_eos=True),
            ],
            4: [request("late", temperature=0.0, repetition_penalty=1.2, prompt_len=40, max_tokens=12)],
        }

    series, overlapped, _ = both(load, deferred=deferred)
    assert overlapped == series
    assert series["rep"] != series["plain"]  # the penalty did change something


@pytest.mark.parametrize(("prefix_caching", "deferred"), [(False, False), (True, False), (True, True)])
def test_streams_equal_when_the_paged_cache_preempts(prefix_caching: bool, deferred: bool) -> None:
    kw: dict[str, Any] = dict(kv_cache_tokens=160, kv_block_size=8, prefix_caching=prefix_caching, max_model_len=96)

    def load() -> dict[int, list[EngineCoreRequest]]:
        shared: dict[str, Any] = dict(prompt_len=20, ignore_eos=True)
        return {
            0: [
                request(f"p{i}", max_tokens=40 + i, seed=i, repetition_penalty=1.0 + i % 2 / 10, **shared)
                for i in range(4)
            ],
            3: [request("q", max_tokens=30, stop_token_ids=[11], temperature=0.0)],
        }

    series_core, overlapped_core = torch_core(False, **kw), torch_core(True, deferred, **kw)
    series = rounded(serve(series_core, load(), {}))
    overlapped = rounded(serve(overlapped_core, load(), {}))
    assert overlapped == series
    assert series_core.scheduler.preemptions > 0 and overlapped_core.scheduler.preemptions > 0


def _image(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (24, 24, 3), dtype=np.uint8))


def test_streams_with_images_equal():
    def load() -> dict[int, list[EngineCoreRequest]]:
        reqs = []
        for i in range(3):
            prompt = [5 + (j % 30) for j in range(40)]
            reqs.append(
                EngineCoreRequest(
                    f"img{i}",
                    None,
                    prompt,
                    SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
                    None,
                    0.0,
                    mm_inputs=[_image(i)],
                    mm_placeholders=[PlaceholderRange(offset=4, length=16)],
                )
            )
        return {0: reqs[:2], 2: reqs[2:]}

    series, overlapped, _ = both(load)
    assert overlapped == series


def test_a_failed_step_fails_the_step_it_feeds_and_the_engine_serves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step launched behind a failed one feeds tokens never sampled: it must fail, not embed -1."""
    core = torch_core(True)
    ex = core.executor
    assert isinstance(ex, TorchExecutor)
    smallest: list[int] = []
    embed, sample = ex.model.embed, ex.sampler.sample_columns

    def spied_embed(ids: torch.Tensor) -> torch.Tensor:
        smallest.append(int(ids.min()))
        return embed(ids)

    calls = iter(range(10**6))

    def flaky_sample(logits: torch.Tensor, cols: Any) -> torch.Tensor:
        if next(calls) == 0:  # the prefill: its rows' ids are never written
            raise RuntimeError("boom")
        return sample(logits, cols)

    monkeypatch.setattr(ex.model, "embed", spied_embed)
    monkeypatch.setattr(ex.sampler, "sample_columns", flaky_sample)
    assert core.add_request(request("a", temperature=0.0, max_tokens=8, ignore_eos=True)) is None
    with pytest.raises(RuntimeError, match="boom"):
        for _ in range(10):
            core.step()
    core.fail_all("boom")
    ex.device_thread.stop()  # the step queued behind the failed one has run (and failed) by now
    assert smallest and min(smallest) >= 0
    again = serve(core, {0: [request("b", temperature=0.0, max_tokens=5)]}, {})
    fresh = serve(torch_core(True), {0: [request("b", temperature=0.0, max_tokens=5)]}, {})
    assert again == fresh and len(again["b"]) == 6  # five tokens and the finish reason


def test_a_launch_that_raises_waits_for_the_step_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next launch stages into the buffers of the step before the one that failed to launch."""
    core = torch_core(True)
    ex = core.executor
    assert isinstance(ex, TorchExecutor)
    for i in range(3):
        assert core.add_request(request(f"r{i}", temperature=0.0, max_tokens=20, ignore_eos=True)) is None
    for _ in range(3):
        core.step()
    forward = ex.model.forward_step

    def slow_forward(*args: Any) -> torch.Tensor:
        time.sleep(0.3)
        return forward(*args)

    monkeypatch.setattr(ex.model, "forward_step", slow_forward)
    core.step()  # launches a slow step
    in_flight = core._inflight
    assert in_flight is not None and not in_flight.handle.done()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a bad block id")

    monkeypatch.setattr(ex, "_prepare", refuse)
    with pytest.raises(ValueError, match="a bad block id"):
        core.step()
    assert in_flight.handle.done()


@pytest.mark.parametrize("penalty", [1.0, 1.2])
def test_deferred_ids_reach_the_host_only_when_read_and_a_failed_read_fails_its_step(
    monkeypatch: pytest.MonkeyPatch, penalty: float
) -> None:
    """As on CUDA: a launched step's handle holds its outputs pending; the device's error surfaces
    when its ids are read, fails the requests in that step, and the engine serves on (penalized
    requests too: a new one's history does not wait for the failed step's ids)."""
    core = torch_core(True, deferred=True)
    ex = core.executor
    assert isinstance(ex, TorchExecutor)
    ids = ex.read_back.ids
    reads = iter(range(10**6))

    def broken() -> np.ndarray:
        raise RuntimeError("copy failed")

    def failing_copy(*args: Any) -> Pending[np.ndarray]:
        copied = ids(*args)
        return Pending(broken) if next(reads) == 1 else copied  # the first decode's copy

    monkeypatch.setattr(ex.read_back, "ids", failing_copy)
    asked: dict[str, Any] = dict(temperature=0.0, repetition_penalty=penalty)
    assert core.add_request(request("a", max_tokens=8, ignore_eos=True, **asked)) is None
    core.step()  # launches the prefill
    in_flight = core._inflight
    assert in_flight is not None
    in_flight.handle._done.wait()
    assert isinstance(in_flight.handle._result, Pending)  # the device thread did not read the ids
    with pytest.raises(RuntimeError, match="copy failed"):
        for _ in range(10):
            core.step()
    core.fail_all("copy failed")
    ex.device_thread.stop()
    again = serve(core, {0: [request("b", max_tokens=5, **asked)]}, {})
    fresh = serve(torch_core(True), {0: [request("b", max_tokens=5, **asked)]}, {})
    assert again == fresh and len(again["b"]) == 6  # five tokens and the finish reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs where one is lent)")
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_cuda_side_stream_read_back_streams_what_an_immediate_read_does(cuda_graphs: bool) -> None:
    """On CUDA a launched step's ids come back on a side stream while the next step is launched;
    the streams equal those of the same loop reading each step's ids at once on the one stream
    (with graphs too: the copy reads a graph's static output, which the next replay rewrites),
    and the GPU's busy and idle time come from events."""

    def cuda_core(side_stream: bool) -> EngineCore:
        core = make_core(True, executor="torch", device="cuda", dtype="float32", cuda_graphs=cuda_graphs)
        ex = core.executor
        assert isinstance(ex, TorchExecutor) and ex.read_back.timed and ex.read_back.deferred
        if not side_stream:
            ex.read_back = ReadBack(ex.device, side_stream=False)
        return core

    abort = {"stop-string": 4}
    at_once = serve(cuda_core(False), seeded_workload(), abort)
    core = cuda_core(True)
    assert serve(core, seeded_workload(), abort) == at_once
    stats = core.device_stats()
    assert core.executor.info()["device_time"] == "cuda-events"
    assert stats is not None and stats.steps > 0 and stats.busy_ns > 0 and stats.gaps > 0
