"""Scheduler: budget, chunking, limits, admission control, aborts, stops, validation.

The steps here are driven by a tiny stand-in for the executor that returns
chosen token ids, so each test controls exactly what gets sampled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from harness.engine.config import EngineConfig
from harness.engine.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput
from harness.wire.messages import EngineCoreOutput, EngineCoreRequest, FinishReason, PlaceholderRange, SamplingParams

EOS = 2


def make_config(**kw) -> EngineConfig:
    base: dict[str, Any] = dict(
        vocab_size=100,
        eos_token_id=EOS,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        kv_cache_tokens=10_000,
        long_prefill_token_threshold=0,
        image_tokens=4,
    )
    base.update(kw)
    return EngineConfig(**base)


def req(
    rid: str,
    n: int = 10,
    eos: int | None = None,
    mm: list | None = None,
    ph: list[PlaceholderRange] | None = None,
    **sp,
) -> EngineCoreRequest:
    sp.setdefault("max_tokens", 5)
    return EngineCoreRequest(
        rid, None, [7 + i % 50 for i in range(n)], SamplingParams(**sp), eos, 0.0, mm_inputs=mm, mm_placeholders=ph
    )


TokenFn = Callable[[str, int], int]  # (request id, output index) -> token


def step(s: Scheduler, token: TokenFn = lambda rid, i: 10) -> tuple[SchedulerOutput, list[EngineCoreOutput]]:
    out = s.schedule()
    sampled = {}
    for c in out.chunks:
        if c.sample:
            r = s.requests[c.request_id]
            sampled[c.request_id] = token(c.request_id, r.num_output_tokens)
    return out, s.update_from_output(out, ModelRunnerOutput(sampled))


def run_all(s: Scheduler, token: TokenFn = lambda rid, i: 10, max_steps: int = 2000):
    outputs: dict[str, list[EngineCoreOutput]] = {}
    steps = []
    for _ in range(max_steps):
        if not s.has_unfinished_requests():
            break
        out, outs = step(s, token)
        steps.append(out)
        for o in outs:
            outputs.setdefault(o.request_id, []).append(o)
    assert not s.has_unfinished_requests()
    return outputs, steps


def tokens_of(outs: list[EngineCoreOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def test_budget_and_max_num_seqs_respected_and_all_finish():
    s = Scheduler(make_config(max_num_batched_tokens=50, max_num_seqs=3))
    for i in range(8):
        s.add_request(req(f"r{i}", n=20 + 7 * i, max_tokens=6))
    assert s.num_waiting == 8 and s.num_running == 0
    outputs, steps = run_all(s)
    for out in steps:
        assert 0 < out.total_num_tokens <= 50
        assert out.total_num_tokens == sum(len(c.token_ids) for c in out.chunks)
        live = {c.request_id for c in out.chunks}
        assert len(live) <= 3 and len({c.slot for c in out.chunks}) == len(live)
        assert all(0 <= c.slot < 3 for c in out.chunks)
        assert all(len(c.token_ids) == 1 and c.sample for c in out.decodes)
    assert sorted(outputs) == [f"r{i}" for i in range(8)]
    for outs in outputs.values():
        assert all(len(o.new_token_ids) == 1 for o in outs)
        assert len(outs) == 6 and outs[-1].finished and outs[-1].finish_reason == FinishReason.LENGTH
        assert not any(o.finished for o in outs[:-1])
    assert s.kv_tokens_used == 0


def test_long_prompt_is_chunked_across_steps():
    s = Scheduler(make_config(max_num_batched_tokens=64))
    s.add_request(req("long", n=150, max_tokens=2))
    chunks = []
    for _ in range(3):
        out, outs = step(s)
        chunks += out.prefills
        assert out.new_requests == [] or out.new_requests[0].request_id == "long"
    assert [(c.start_pos, len(c.token_ids), c.sample) for c in chunks] == [
        (0, 64, False),
        (64, 64, False),
        (128, 22, True),
    ]
    assert outs and outs[0].new_token_ids == [10]
    # The prompt tokens travel in order, chunk by chunk.
    assert sum((list(c.token_ids) for c in chunks), []) == s.requests["long"].token_ids[:150]


def test_long_prefill_threshold_caps_chunks_only_when_others_present():
    s = Scheduler(make_config(max_num_batched_tokens=200, long_prefill_token_threshold=40))
    s.add_request(req("alone", n=150))
    out, _ = step(s)
    assert [len(c.token_ids) for c in out.prefills] == [150]  # alone: whole budget
    s.add_request(req("a", n=100))
    s.add_request(req("b", n=100))
    _, steps = run_all(s)
    prefills = [c for out in steps for c in out.prefills]
    assert prefills and max(len(c.token_ids) for c in prefills) <= 40


def test_decodes_are_scheduled_before_prefills():
    s = Scheduler(make_config(max_num_batched_tokens=20))
    s.add_request(req("first", n=5, max_tokens=10))
    step(s)
    s.add_request(req("big", n=100, max_tokens=2))
    out, _ = step(s)
    assert [c.request_id for c in out.decodes] == ["first"]
    assert [(c.request_id, len(c.token_ids)) for c in out.prefills] == [("big", 19)]


def test_admission_control_under_tiny_kv_cache():
    # Six blocks of 16: a 30-token prompt takes two, so three run at once; at position 32 each
    # needs a third, which preempts the newest. Every request still completes, admitted FCFS.
    s = Scheduler(make_config(kv_cache_tokens=96, max_num_seqs=8, prefix_caching=False))
    for i in range(6):
        s.add_request(req(f"r{i}", n=30, max_tokens=10))
    outputs, steps = run_all(s)
    for out in steps:
        assert len({c.request_id for c in out.chunks}) <= 3
    assert all(len(tokens_of(o)) == 10 for o in outputs.values()) and len(outputs) == 6
    starts = [nr.request_id for out in steps for nr in out.new_requests]
    assert starts == [f"r{i}" for i in range(6)]
    assert s.preemptions > 0 and s.pool.num_used == 0
    with pytest.raises(ValueError, match="never fit in the KV cache of 96"):
        s.add_request(req("huge", n=95, max_tokens=10))


def test_kv_capacity_defaults_to_what_the_cache_holds():
    # None: max_num_seqs x max_model_len, so only max_num_seqs limits admission.
    s = Scheduler(make_config(kv_cache_tokens=None, max_num_seqs=4, max_model_len=256, max_num_batched_tokens=1000))
    assert s.admission_stats()["kv_cache_tokens"] == 4 * 256
    for i in range(6):
        s.add_request(req(f"r{i}", n=200, max_tokens=50))  # 250 each: four fill the cache exactly
    out, _ = step(s)
    assert len(out.new_requests) == 4
    stats = s.admission_stats()
    assert stats["admission_blocked_by"] == {"kv_cache": 0, "max_num_seqs": 1, "token_budget": 0}
    # An explicit value is rounded down to whole blocks.
    assert Scheduler(make_config(kv_cache_tokens=300)).admission_stats()["kv_cache_tokens"] == 288
    with pytest.raises(ValueError, match="never fit in the KV cache of 192"):
        Scheduler(make_config(kv_cache_tokens=200)).add_request(req("big", n=150, max_tokens=51))


def test_admission_counters_say_what_kept_requests_waiting():
    # KV: a 30-token prompt takes two blocks of 16; two fit in four while slots are free.
    s = Scheduler(make_config(kv_cache_tokens=64, max_num_seqs=8, prefix_caching=False))
    for i in range(3):
        s.add_request(req(f"k{i}", n=30, max_tokens=10))
    step(s)
    assert s.admission_stats()["admission_blocked_by"]["kv_cache"] == 1
    assert s.admission_stats()["admission_blocked_steps"] == 1
    assert s.step_counts() == {
        "steps": 1,
        "blocked_kv_cache": 1,
        "blocked_max_num_seqs": 0,
        "blocked_token_budget": 0,
        "preemptions": 0,
        "prefix_cache_hit_tokens": 0,
        "prefix_cache_query_tokens": 60,
    }
    # The token budget, not admission: the budget runs out on the first prompt.
    s = Scheduler(make_config(max_num_batched_tokens=16, max_num_seqs=8))
    s.add_request(req("t0", n=40))
    s.add_request(req("t1", n=40))
    step(s)
    stats = s.admission_stats()
    assert stats["admission_blocked_by"] == {"kv_cache": 0, "max_num_seqs": 0, "token_budget": 1}
    assert stats["admission_blocked_steps"] == 0 and stats["waiting_peak"] == 2
    run_all(s)
    assert s.admission_stats()["steps"] > 1


def test_abort_waiting_and_running_frees_kv_and_tells_executor():
    s = Scheduler(make_config(max_num_seqs=1))
    s.add_request(req("run", n=10, max_tokens=50))
    s.add_request(req("wait", n=10))
    step(s)
    assert s.num_running == 1 and s.num_waiting == 1 and s.kv_tokens_used == 16  # one block of 16
    assert s.abort_requests(["wait", "nope"]) == ["wait"]
    assert s.num_waiting == 0
    assert s.abort_requests(["run", "run"]) == ["run"]  # an id listed twice is aborted once
    assert s.kv_tokens_used == 0 and not s.has_unfinished_requests()
    assert s.schedule().total_num_tokens == 0  # nothing to run: finished ids are kept for a real step
    s.add_request(req("run", n=4))  # the id is free again
    out = s.schedule()
    assert out.finished_req_ids == ["run"]  # only the one the executor knew
    assert [nr.request_id for nr in out.new_requests] == ["run"] and out.new_requests[0].slot == 0


def test_update_ignores_request_aborted_after_schedule():
    s = Scheduler(make_config())
    s.add_request(req("x", n=4))
    out = s.schedule()
    s.abort_requests(["x"])
    assert s.update_from_output(out, ModelRunnerOutput({"x": 11})) == []


def test_eos_stops_and_ignore_eos_runs_to_max_tokens():
    s = Scheduler(make_config())
    s.add_request(req("stop", max_tokens=10))
    s.add_request(req("ignore", max_tokens=10, ignore_eos=True))
    outputs, _ = run_all(s, token=lambda rid, i: EOS if i == 2 else 10)
    stop = outputs["stop"]
    assert tokens_of(stop) == [10, 10, EOS]
    assert stop[-1].finish_reason == FinishReason.STOP and stop[-1].stop_reason is None
    assert len(tokens_of(outputs["ignore"])) == 10 and outputs["ignore"][-1].finish_reason == FinishReason.LENGTH


def test_request_eos_overrides_config_and_none_means_no_eos():
    s = Scheduler(make_config(eos_token_id=None))
    s.add_request(req("own", eos=42, max_tokens=5))
    s.add_request(req("none", max_tokens=5))
    outputs, _ = run_all(s, token=lambda rid, i: 42 if i == 1 else EOS)
    assert tokens_of(outputs["own"]) == [EOS, 42] and outputs["own"][-1].finish_reason == FinishReason.STOP
    assert len(tokens_of(outputs["none"])) == 5


def test_stop_token_ids_and_min_tokens():
    s = Scheduler(make_config())
    s.add_request(req("stopid", max_tokens=10, stop_token_ids=[33, 34]))
    s.add_request(req("min", max_tokens=10, min_tokens=4, stop_token_ids=[33]))
    seen_suppress: dict[str, list] = {}
    outputs: dict[str, list] = {}
    while s.has_unfinished_requests():
        out = s.schedule()
        for c in out.chunks:
            if c.sample:
                seen_suppress.setdefault(c.request_id, []).append(c.suppress_token_ids)
        sampled = {
            c.request_id: (
                34
                if c.request_id == "stopid" and s.requests[c.request_id].num_output_tokens == 1
                else 33
                if c.request_id == "min"
                else 10
            )
            for c in out.chunks
            if c.sample
        }
        for o in s.update_from_output(out, ModelRunnerOutput(sampled)):
            outputs.setdefault(o.request_id, []).append(o)
    last = outputs["stopid"][-1]
    assert tokens_of(outputs["stopid"]) == [10, 34]
    assert (last.finish_reason, last.stop_reason) == (FinishReason.STOP, 34)
    # min_tokens=4: a stop token before the 4th output doesn't stop; the sampler is told to avoid it.
    assert tokens_of(outputs["min"]) == [33, 33, 33, 33]
    assert outputs["min"][-1].finish_reason == FinishReason.STOP and outputs["min"][-1].stop_reason == 33
    assert seen_suppress["min"] == [[33, EOS]] * 4
    assert seen_suppress["stopid"] == [None, None]


def test_max_tokens_none_fills_the_context():
    s = Scheduler(make_config(max_model_len=40))
    s.add_request(req("r", n=30, max_tokens=None, ignore_eos=True))
    outputs, _ = run_all(s)
    assert len(tokens_of(outputs["r"])) == 10


def test_executor_errors_become_error_outputs():
    s = Scheduler(make_config())
    s.add_request(req("bad"))
    s.add_request(req("good", max_tokens=1))
    out = s.schedule()
    outs = s.update_from_output(out, ModelRunnerOutput({"good": 5}, errors={"bad": "broken image"}))
    by_id = {o.request_id: o for o in outs}
    assert by_id["bad"].finish_reason == FinishReason.ERROR and by_id["bad"].error == "broken image"
    assert by_id["good"].new_token_ids == [5] and by_id["good"].finish_reason == FinishReason.LENGTH
    assert not s.has_unfinished_requests() and s.kv_tokens_used == 0


def test_missing_token_fails_the_request_instead_of_hanging():
    s = Scheduler(make_config())
    s.add_request(req("x"))
    out = s.schedule()
    (o,) = s.update_from_output(out, ModelRunnerOutput({}))
    assert o.finish_reason == FinishReason.ERROR and not s.has_unfinished_requests()


IMG = {"pixel_values": np.zeros((3, 8, 8), np.float32)}


@pytest.mark.parametrize(
    "bad, match",
    [
        (req("e", n=0), "empty"),
        (req("l", n=200, max_tokens=100), r"200 tokens \+ max_tokens 100 = 300 exceeds max_model_len 256"),
        (req("l2", n=256, max_tokens=None), "no room"),
        (req("m", max_tokens=0), "max_tokens must be >= 1"),
        (EngineCoreRequest("n", None, [1, 2], SamplingParams(n=2), None, 0.0), "only n=1"),
        (EngineCoreRequest("v", None, [1, 100], SamplingParams(), None, 0.0), r"100 outside the vocabulary \[0, 100\)"),
        (EngineCoreRequest("v2", None, [-1], SamplingParams(), None, 0.0), "-1 outside"),
        (req("mt", max_tokens=3, min_tokens=4), "min_tokens"),
        (req("t", temperature=-1.0), "temperature"),
        (req("p", top_p=0.0), "top_p"),
        (req("k", top_k=-2), "top_k"),
        (req("mp", min_p=1.5), "min_p"),
        (req("t2", temperature=float("nan")), "temperature must be a finite number"),
        (req("t3", temperature=float("inf")), "temperature"),
        (req("t4", temperature=1000.5), r"temperature must be a finite number in \[0, 1000\]"),
        (req("p2", top_p=float("nan")), "top_p"),
        (req("p3", top_p=1.5), "top_p"),
        (req("k2", top_k=1 << 63), "top_k"),
        (req("mp2", min_p=float("nan")), "min_p"),
        (req("mp3", min_p=-0.1), "min_p"),
        (req("s", seed=1 << 63), "seed must fit in a signed 64-bit integer"),
        (req("s2", seed=-(1 << 63) - 1), "seed"),
        (req("ph", mm=[IMG], ph=None), "1 multimodal inputs but 0 placeholder"),
        (req("ph2", mm=[IMG], ph=[PlaceholderRange(8, 4)]), "outside the prompt"),
        (req("ph3", mm=[IMG], ph=[PlaceholderRange(0, 3)]), "image_tokens"),
        (req("ph4", mm=[IMG, IMG], ph=[PlaceholderRange(0, 4), PlaceholderRange(2, 4)]), "overlaps"),
        (req("ph5", mm=["x"], ph=[PlaceholderRange(0, 4)]), "PIL image or a dict"),
    ],
)
def test_validation_errors(bad, match):
    s = Scheduler(make_config())
    with pytest.raises(ValueError, match=match):
        s.add_request(bad)
    assert not s.has_unfinished_requests()


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.0),
        dict(temperature=1000.0),
        dict(top_k=-1),
        dict(top_k=0),
        dict(top_k=10**6),
        dict(top_p=1e-9),
        dict(min_p=0.0),
        dict(min_p=1.0),
        dict(seed=(1 << 63) - 1),
        dict(seed=-(1 << 63)),
    ],
)
def test_sampling_values_at_the_limits_are_accepted(params):
    s = Scheduler(make_config())
    s.add_request(req("ok", **params))
    assert s.num_waiting == 1


def test_duplicate_id_and_valid_multimodal_request():
    s = Scheduler(make_config())
    s.add_request(req("a", mm=[IMG, IMG], ph=[PlaceholderRange(5, 4), PlaceholderRange(0, 4)]))
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        s.add_request(req("a"))
    assert s.num_waiting == 1


def test_bad_limits_rejected():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(make_config(max_num_batched_tokens=3, max_num_seqs=4))


@pytest.mark.parametrize(
    "field,value",
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", float("nan")),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", float("inf")),
        ("logit_bias", {5: 1e9}),
    ],
)
def test_out_of_range_penalties_are_rejected(field, value):
    from harness.engine.config import EngineConfig
    from harness.engine.scheduler import Scheduler
    from harness.wire.messages import EngineCoreRequest, SamplingParams

    s = Scheduler(EngineConfig(vocab_size=64, max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32))
    req = EngineCoreRequest("r", None, [1, 2, 3], SamplingParams(max_tokens=2, **{field: value}), None, 0.0)
    with pytest.raises(ValueError, match=field):
        s.add_request(req)
