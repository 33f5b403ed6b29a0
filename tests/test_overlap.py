"""One step of overlap in the engine loop (``harness.engine.overlap``), driven directly on the sim executor.

- The token streams, finish reasons and logprobs equal the loop in series for the same seed: greedy and
  seeded sampling, stop tokens, EOS, min_tokens, max_tokens, chunked prefills, a request the frontend
  aborts (as it does on a stop string), an id taken again while its old step still runs.
- A placeholder never reaches an output; a request that finishes in step N sends nothing from N+1.
- The modelled GPU (``harness.engine.device_thread``) counts its busy time exactly and its idle gaps only
  while the engine had work; a run's idle share comes from its output batches and is printed.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.analysis.like_for_like import run_settings
from harness.analysis.runs import RunEntry
from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore
from harness.engine.device_thread import DeviceThread, StepHandle
from harness.engine.overlap import PLACEHOLDER
from harness.server_metrics import engine_info, prometheus
from harness.wire.messages import EngineCoreOutput, EngineCoreRequest, SamplingParams
from harness.wire.spans import device_time, trace_events

EOS = 3
VOCAB = 40  # small, so stop tokens and EOS come up often


def make_core(overlapped: bool, **kw: Any) -> EngineCore:
    base: dict[str, Any] = dict(
        executor="sim",
        async_scheduling=overlapped,
        sim_step_fixed_ms=0.2,
        sim_step_per_token_ms=0.0,
        vocab_size=VOCAB,
        eos_token_id=EOS,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=256,
        long_prefill_token_threshold=16,
        seed=7,
    )
    base.update(kw)
    core = EngineCore(EngineConfig(**base))
    assert core.overlapped is overlapped
    return core


def request(rid: str, prompt_len: int = 10, **sp: Any) -> EngineCoreRequest:
    sp.setdefault("max_tokens", 12)
    prompt = [(5 + 3 * i + len(rid)) % VOCAB for i in range(prompt_len)]
    return EngineCoreRequest(rid, None, prompt, SamplingParams(**sp), None, 0.0)


Stream = dict[str, list[Any]]


def serve(core: EngineCore, arrivals: dict[int, list[EngineCoreRequest]], abort_after: dict[str, int]) -> Stream:
    """Step until idle, adding requests before the given loop turn; abort a request once it has that many
    tokens (the frontend on a stop string). Each stream: its tokens, then its finish reason."""
    streams: Stream = {}
    aborted: set[str] = set()
    turn = 0
    while core.has_work() or any(t >= turn for t in arrivals):
        for req in arrivals.get(turn, []):
            assert core.add_request(req) is None
        turn += 1
        outputs: list[EngineCoreOutput] = core.step()
        for o in outputs:
            assert o.request_id not in aborted, "an output after its request was aborted"
            assert PLACEHOLDER not in o.new_token_ids
            s = streams.setdefault(o.request_id, [])
            assert not (s and isinstance(s[-1], str)), "an output after the request finished"
            s.extend(o.new_token_ids)
            if o.new_logprobs is not None:
                s.append(("lp", o.new_logprobs.token_ids, o.new_logprobs.logprobs))
            if o.finished:
                s.append(str(o.finish_reason))
            limit = abort_after.get(o.request_id)
            if limit is not None and not o.finished and sum(isinstance(t, int) for t in s) >= limit:
                core.abort([o.request_id])
                aborted.add(o.request_id)
                s.append("aborted")
    return streams


def workload() -> dict[int, list[EngineCoreRequest]]:
    return {
        0: [
            request("greedy", temperature=0.0),
            request("seeded", temperature=1.0, seed=42, max_tokens=30),
            request("stops", stop_token_ids=[11, 17], max_tokens=40),
            request("eos", max_tokens=60),
            request("ignore-eos", ignore_eos=True, max_tokens=25),
        ],
        2: [
            request("min-tokens", min_tokens=8, stop_token_ids=[11], max_tokens=20),
            request("long-prompt", prompt_len=70, max_tokens=5),  # chunked over several steps
            request("one-token", max_tokens=1),
            request("logprobs", logprobs=3, max_tokens=6),
        ],
        5: [request("stop-string", max_tokens=40)] + [request(f"late-{i}", max_tokens=3 + i) for i in range(3)],
    }


def test_overlapped_streams_equal_the_loop_in_series():
    abort = {"stop-string": 4}
    series = serve(make_core(False), workload(), abort)
    overlapped = serve(make_core(True), workload(), abort)
    assert overlapped == series
    reasons = {s[-1] for s in series.values()}
    assert {"FinishReason.LENGTH", "FinishReason.STOP", "aborted"} <= reasons  # every way to end was taken
    assert series["stops"][-1] == "FinishReason.STOP" and series["stops"][-2] in (11, 17)
    assert len([t for t in series["one-token"] if isinstance(t, int)]) == 1


@pytest.mark.parametrize("overlapped", [False, True])
def test_streams_do_not_depend_on_batching(overlapped):
    """Alone or in a crowd, a request's tokens are the same: what makes the two loops comparable at all."""
    alone = serve(make_core(overlapped), {0: [request("stops", stop_token_ids=[11, 17], max_tokens=40)]}, {})
    crowd = serve(make_core(overlapped), workload(), {})
    assert alone["stops"] == crowd["stops"]


def test_an_id_taken_again_while_its_step_runs_gets_none_of_the_old_tokens():
    core = make_core(True)
    assert core.add_request(request("x", max_tokens=50)) is None
    got: list[int] = []
    for _ in range(4):
        got += [t for o in core.step() for t in o.new_token_ids]
    assert core._inflight is not None  # a step holding "x" is on the device
    core.abort(["x"])
    assert core.add_request(request("x", prompt_len=3, max_tokens=2)) is None
    new: list[EngineCoreOutput] = []
    while core.has_work():
        new += core.step()
    fresh = serve(make_core(True), {0: [request("x", prompt_len=3, max_tokens=2)]}, {})
    assert [t for o in new for t in o.new_token_ids] + [str(new[-1].finish_reason)] == fresh["x"]


def test_the_step_after_a_finish_carries_a_wasted_row_not_sent():
    """A stop token in step N: N+1 was scheduled with that request's row before N's token was known."""
    core = make_core(True)
    assert core.add_request(request("stops", stop_token_ids=[11, 17], max_tokens=40)) is None
    assert core.add_request(request("other", ignore_eos=True, max_tokens=60)) is None
    rows_after_finish = None
    while core.has_work():
        outputs = core.step()
        if any(o.request_id == "stops" and o.finished for o in outputs):
            rows_after_finish = [c.request_id for c in core.last_step.chunks] if core.last_step else []
    assert rows_after_finish is not None and "stops" in rows_after_finish


def test_max_tokens_needs_no_wasted_row():
    core = make_core(True)
    assert core.add_request(request("short", max_tokens=3, ignore_eos=True)) is None
    steps = 0
    while core.has_work():
        core.step()
        steps += 1
    assert core.step_index == 3  # the prefill and two decodes, nothing past the last token


def test_the_device_counts_busy_exactly_and_idle_only_between_steps_with_work():
    core = make_core(True, sim_step_fixed_ms=0.5)
    serve(core, {0: [request("a", max_tokens=6, ignore_eos=True)]}, {})
    stats = core.device_stats()
    assert stats is not None
    assert stats.steps == core.step_index == 6
    assert stats.busy_ns == 6 * 500_000
    assert stats.gaps == 5  # the first step follows no other
    serve(core, {0: [request("b", max_tokens=2, ignore_eos=True)]}, {})
    assert stats.gaps == 5 + 1  # the idle time before "b" arrived is not counted


def test_a_device_error_reaches_the_host():
    device = DeviceThread()

    def broken() -> None:
        raise RuntimeError("boom")

    handle: StepHandle[None] = device.launch(0.0, broken, continuous=False)
    with pytest.raises(RuntimeError, match="boom"):
        handle.wait()
    assert device.launch(0.0, lambda: 5, continuous=True).wait() == 5


@pytest.mark.parametrize("setting", [True, False])
def test_torch_overlaps_on_the_cpu_only_when_told(setting):
    core = EngineCore(EngineConfig(executor="torch", device="cpu", async_scheduling=setting, max_num_seqs=2))
    assert core.overlapped is False  # its forward needs the host's cores
    told = EngineConfig(executor="torch", device="cpu", async_scheduling=setting, overlap_on_cpu=True, max_num_seqs=2)
    assert EngineCore(told).overlapped is setting


def test_a_runs_gpu_idle_share_comes_from_its_batches_and_is_printed():
    batches = [
        {"seq": 12, "device_busy": 90_000_000, "device_idle": 4_000_000},
        {"seq": 10, "device_busy": 50_000_000, "device_idle": 3_000_000},
        {"seq": 11, "device_busy": 0, "device_idle": 0},  # an engine without a modelled GPU says nothing
    ]
    device = device_time(batches)
    assert device == {"busy_ms": 40.0, "idle_ms": 1.0}
    assert device_time(batches[2:]) == {}
    engine = engine_info.with_device_time({"executor": "sim", "sim_step": "llama8b-h100: 4 ms"}, device)
    assert engine is not None
    rows = dict(engine_info.report_rows(engine))
    assert rows["Modelled GPU idle between steps:"].startswith("2.5% of its busy time")
    assert engine_info.with_device_time({"executor": "torch"}, {}) == {"executor": "torch"}
    # torch says how it timed the device; the label survives /metrics and names it.
    for timing, label in (("cuda-events", "GPU (CUDA events)"), ("device-thread", "Engine device thread")):
        scrape = prometheus.render(engine_info.metric_samples({"executor": "torch", "device_time": timing}))
        engine = engine_info.with_device_time(engine_info.from_metrics(scrape), device)
        assert engine is not None and f"{label} idle between steps:" in dict(engine_info.report_rows(engine))


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_streams_equal_when_the_paged_cache_preempts(prefix_caching):
    """Too few KV blocks for everyone: the newest requests are preempted and recomputed, in both loops."""
    kw = dict(kv_cache_tokens=160, kv_block_size=8, prefix_caching=prefix_caching, max_model_len=96)

    def load() -> dict[int, list[EngineCoreRequest]]:
        shared = dict(prompt_len=20, ignore_eos=True)
        return {
            0: [request(f"p{i}", max_tokens=40 + i, **shared) for i in range(4)],
            3: [request("q", max_tokens=30, stop_token_ids=[11])],
        }

    series_core, overlapped_core = make_core(False, **kw), make_core(True, **kw)
    series = serve(series_core, load(), {})
    overlapped = serve(overlapped_core, load(), {})
    assert overlapped == series
    assert series_core.scheduler.preemptions > 0 and overlapped_core.scheduler.preemptions > 0


def test_a_trace_shows_the_modelled_gpu_as_a_track_of_its_own():
    steps = [{"index": 1, "start": 5_000, "end": 9_000, "device_start": 4_000, "device_end": 8_000}]
    doc = trace_events([], [], steps, 10, 20)
    gpu = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "gpu step"]
    assert [(e["pid"], e["tid"], e["ts"], e["dur"]) for e in gpu] == [(20, 4, 4.0, 4.0)]
    torch_doc = trace_events([], [], [{"index": 1, "start": 5, "end": 9}], 10, 20)
    assert not [e for e in torch_doc["traceEvents"] if e.get("name") in ("gpu step", "thread_name") and e["tid"] == 4]


def test_runs_compare_by_the_loop_they_ran():
    """The loop the engine says it ran; before it said so, torch ran in series, and so did sim runs
    recorded before the setting came."""

    def loop(flags: dict[str, Any], engine: dict[str, Any] | None = None) -> Any:
        doc = {"metadata": {"flags": flags, **({"engine": engine} if engine else {})}}
        return run_settings(RunEntry("msgspec", 0, "ok", "", None, doc, None)).get("no_async_scheduling")

    assert loop({"executor": "torch"}, {"overlapped": True}) is False
    assert loop({"executor": "torch", "no_async_scheduling": True}, {"overlapped": False}) is True

    assert loop({"executor": "sim"}) is True  # an older sim run
    assert loop({"executor": "sim", "no_async_scheduling": False}) is False
    assert loop({"executor": "torch", "no_async_scheduling": False}) is True
    assert loop({"endpoint": "/v1/completions"}) is None  # older still: nothing to say
