"""Executors end to end: schedule -> execute -> update with the real scheduler."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from harness.engine.config import EngineConfig
from harness.engine.core import make_executor
from harness.engine.device_thread import sleep_until_ns
from harness.engine.executor import TorchExecutor
from harness.engine.scheduler import Scheduler
from harness.engine.sim_executor import SimExecutor
from harness.engine.vision import splice_images
from harness.wire.messages import EngineCoreOutput, EngineCoreRequest, FinishReason, PlaceholderRange, SamplingParams

EOS = 1


def make_config(**kw) -> EngineConfig:
    base: dict[str, Any] = dict(
        device="cpu",
        vocab_size=128,
        eos_token_id=EOS,
        max_num_seqs=4,
        max_num_batched_tokens=48,
        max_model_len=128,
        kv_cache_tokens=400,
        long_prefill_token_threshold=24,
        image_tokens=8,
        sim_step_fixed_ms=0.2,
        sim_step_per_token_ms=0.001,
        num_threads=1,
    )
    base.update(kw)
    return EngineConfig(**base)


@pytest.fixture(scope="module")
def torch_executor() -> TorchExecutor:
    # One model for the module; requests use fresh ids so executor state never clashes.
    return TorchExecutor(make_config())


def request(rid: str, n: int = 20, seed_tokens: int = 0, vocab: int = 128, **sp) -> EngineCoreRequest:
    toks = torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed_tokens)).tolist()
    mm = sp.pop("mm", None)
    ph = sp.pop("ph", None)
    return EngineCoreRequest(rid, None, toks, SamplingParams(**sp), None, 0.0, mm_inputs=mm, mm_placeholders=ph)


def serve(config: EngineConfig, executor, requests: list[EngineCoreRequest]) -> dict[str, list[EngineCoreOutput]]:
    s = Scheduler(config)
    for r in requests:
        s.add_request(r)
    outputs: dict[str, list[EngineCoreOutput]] = {}
    for _ in range(1000):
        if not s.has_unfinished_requests():
            break
        out = s.schedule()
        assert out.total_num_tokens > 0
        for o in s.update_from_output(out, executor.execute(out)):
            outputs.setdefault(o.request_id, []).append(o)
    assert not s.has_unfinished_requests()
    return outputs


def tokens(outs: list[EngineCoreOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def _check_all_finished(outputs, reqs, vocab):
    assert sorted(outputs) == sorted(r.request_id for r in reqs)
    for r in reqs:
        outs = outputs[r.request_id]
        toks = tokens(outs)
        assert len(toks) == r.sampling_params.max_tokens
        assert all(0 <= t < vocab for t in toks)
        assert outs[-1].finished and outs[-1].finish_reason == FinishReason.LENGTH


@pytest.mark.parametrize("kind", ["torch", "sim"])
def test_concurrent_requests_finish_with_exact_max_tokens(kind, torch_executor):
    cfg = make_config(executor=kind)
    executor = torch_executor if kind == "torch" else make_executor(cfg)
    assert isinstance(executor, TorchExecutor if kind == "torch" else SimExecutor)
    reqs = [
        request(
            f"{kind}-e2e-{i}",
            n=10 + 13 * i,
            seed_tokens=i,
            max_tokens=5 + 3 * i,
            ignore_eos=True,
            temperature=[0.0, 1.0, 0.7][i % 3],
            top_p=0.9,
            seed=i if i % 2 else None,
        )
        for i in range(7)
    ]
    _check_all_finished(serve(cfg, executor, reqs), reqs, cfg.vocab_size)
    info = executor.info()
    assert info["executor"] == kind


def test_sim_tokens_are_deterministic_and_never_eos():
    cfg = make_config(executor="sim", vocab_size=4, eos_token_id=0)  # small vocab: EOS would come up often
    reqs = [request(f"s{i}", max_tokens=30, vocab=4) for i in range(3)]
    a = serve(cfg, SimExecutor(cfg), reqs)
    b = serve(cfg, SimExecutor(cfg), reqs)
    assert {k: tokens(v) for k, v in a.items()} == {k: tokens(v) for k, v in b.items()}
    for outs in a.values():
        assert 0 not in tokens(outs) and len(tokens(outs)) == 30


def test_wait_until_never_returns_early():
    import time

    deadline = time.monotonic_ns() + 3_000_000
    sleep_until_ns(deadline)
    assert time.monotonic_ns() >= deadline


def test_greedy_tokens_match_a_model_prefill(torch_executor):
    """The executor's greedy tokens are the argmax of a fresh one-shot prefill of the sequence."""
    cfg = make_config()
    r = request("greedy-ref", n=30, seed_tokens=5, max_tokens=6, temperature=0.0, ignore_eos=True)
    toks = tokens(serve(cfg, torch_executor, [r])["greedy-ref"])
    model = torch_executor.model
    seq = list(r.prompt_token_ids)
    with torch.inference_mode():
        for t in toks:
            logits = model.prefill(model.embed(torch.tensor(seq)), slot=2, start=0)
            assert int(logits[: cfg.vocab_size].argmax()) == t
            seq.append(t)


def test_seeded_request_reproducible_regardless_of_batch(torch_executor):
    cfg = make_config()
    kw: dict[str, Any] = dict(n=25, seed_tokens=9, max_tokens=8, temperature=1.0, seed=77, ignore_eos=True)
    alone = serve(cfg, torch_executor, [request("seeded-a", **kw)])
    crowd = [request(f"crowd-{i}", n=15 + i, seed_tokens=i, max_tokens=10, ignore_eos=True) for i in range(3)]
    together = serve(cfg, torch_executor, crowd[:2] + [request("seeded-b", **kw)] + crowd[2:])
    assert tokens(alone["seeded-a"]) == tokens(together["seeded-b"])


def _image(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8))


def test_images_are_placed_at_placeholders(torch_executor):
    cfg = make_config()
    # The image sits right before the generated tokens, where it matters most;
    # every input is seeded, so the outcome is fixed.
    ph = [PlaceholderRange(6, 8)]
    kw: dict[str, Any] = dict(n=16, seed_tokens=3, max_tokens=8, temperature=0.0, ignore_eos=True)
    pixels = torch.randn(3, 20, 20, generator=torch.Generator().manual_seed(4))
    plain = tokens(serve(cfg, torch_executor, [request("img-none", **kw)])["img-none"])
    img_a = tokens(serve(cfg, torch_executor, [request("img-a", mm=[_image(0)], ph=ph, **kw)])["img-a"])
    img_a2 = tokens(serve(cfg, torch_executor, [request("img-a2", mm=[_image(0)], ph=ph, **kw)])["img-a2"])
    img_b = tokens(serve(cfg, torch_executor, [request("img-b", mm=[{"pixel_values": pixels}], ph=ph, **kw)])["img-b"])
    assert img_a == img_a2
    assert plain != img_a and img_a != img_b


@torch.inference_mode()
def test_placeholder_spanning_chunks_matches_one_shot(torch_executor):
    model, vision = torch_executor.model, torch_executor.vision
    toks = torch.randint(2, 128, (40,), generator=torch.Generator().manual_seed(1))
    images = [(10, vision.encode(_image(1))), (25, vision.encode(_image(2)))]  # [10, 18) and [25, 33)
    x = model.embed(toks)
    splice_images(x, 0, images)
    one_shot = model.prefill(x, slot=0, start=0, all_logits=True)
    parts, start = [], 0
    for n in (14, 15, 11):  # boundaries at 14 and 29 cut both placeholders
        xc = model.embed(toks[start : start + n])
        splice_images(xc, start, images)
        parts.append(model.prefill(xc, slot=1, start=start, all_logits=True))
        start += n
    torch.testing.assert_close(torch.cat(parts), one_shot, atol=1e-4, rtol=1e-4)
    plain = model.prefill(model.embed(toks), slot=2, start=0, all_logits=True)
    assert not torch.allclose(plain[12], one_shot[12])


@pytest.mark.parametrize("kind", ["torch", "sim"])
def test_undecodable_image_fails_only_its_request(kind, torch_executor):
    cfg = make_config(executor=kind)
    executor = torch_executor if kind == "torch" else make_executor(cfg)
    buf = io.BytesIO()
    _image(3).save(buf, format="PNG")
    broken = Image.open(io.BytesIO(buf.getvalue()[:60]))  # header parses, pixel data is missing
    bad = request(f"{kind}-broken", mm=[broken], ph=[PlaceholderRange(0, 8)], max_tokens=3)
    good = request(f"{kind}-fine", max_tokens=3, ignore_eos=True)
    outputs = serve(cfg, executor, [bad, good])
    (err,) = outputs[bad.request_id]
    assert err.finish_reason == FinishReason.ERROR and "could not process" in err.error
    assert len(tokens(outputs[good.request_id])) == 3


def test_make_executor_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown executor"):
        make_executor(make_config(executor="gpu-magic"))


def _reference_pick(logits: torch.Tensor, sp: SamplingParams, prompt: list[int], outputs: list[int]) -> int:
    """Greedy pick after logit bias and penalties, written out the plain way."""
    x = logits.clone()
    for tok, b in (sp.logit_bias or {}).items():
        x[tok] += b
    for tok in set(prompt) | set(outputs):
        x[tok] = x[tok] / sp.repetition_penalty if x[tok] > 0 else x[tok] * sp.repetition_penalty
    for tok in set(outputs):
        x[tok] -= sp.presence_penalty + sp.frequency_penalty * outputs.count(tok)
    return int(x.argmax())


def test_penalties_follow_the_token_history(torch_executor):
    """Greedy tokens with penalties match a fresh prefill plus the penalties over prompt+outputs so far.

    Served beside another request, so the prompt is prefilled in chunks
    (long_prefill_token_threshold=24) and later tokens come from batched decodes.
    """
    cfg = make_config()
    kw: dict[str, Any] = dict(n=40, seed_tokens=6, max_tokens=10, temperature=0.0, ignore_eos=True)
    pen: dict[str, Any] = dict(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3, logit_bias={5: 0.5})
    r = request("pen-a", **kw, **pen)
    other = request("pen-other", n=30, seed_tokens=2, max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = serve(cfg, torch_executor, [other, r])
    toks = tokens(outputs["pen-a"])
    assert toks != tokens(serve(cfg, torch_executor, [request("pen-plain", **kw)])["pen-plain"])
    model = torch_executor.model
    prompt = list(r.prompt_token_ids)
    with torch.inference_mode():
        for i, t in enumerate(toks):
            logits = model.prefill(model.embed(torch.tensor(prompt + toks[:i])), slot=2, start=0)
            assert _reference_pick(logits[: cfg.vocab_size], r.sampling_params, prompt, toks[:i]) == t
    # The default request beside it is unaffected, and keeps no token history.
    alone = serve(
        cfg,
        torch_executor,
        [request("pen-other-2", n=30, seed_tokens=2, max_tokens=12, temperature=0.0, ignore_eos=True)],
    )
    assert tokens(alone["pen-other-2"]) == tokens(outputs["pen-other"])


def test_presence_penalty_stops_repeats_and_defaults_keep_no_history():
    cfg = make_config()
    ex = TorchExecutor(cfg)
    s = Scheduler(cfg)
    s.add_request(
        request(
            "np", n=12, max_tokens=30, temperature=0.0, ignore_eos=True, presence_penalty=2.0, frequency_penalty=2.0
        )
    )
    s.add_request(request("plain", n=12, max_tokens=30, temperature=0.0, ignore_eos=True))
    outs: dict[str, list[EngineCoreOutput]] = {}
    while s.has_unfinished_requests():
        sched = s.schedule()
        for o in s.update_from_output(sched, ex.execute(sched)):
            outs.setdefault(o.request_id, []).append(o)
        if "np" in ex.states and "plain" in ex.states:
            assert ex.states["plain"].output_ids is None and ex.states["plain"].prompt_ids is None
            assert ex.states["np"].output_ids == tokens(outs.get("np", []))[:-1]  # all but the newest, unfed
    np_toks = tokens(outs["np"])
    assert len(np_toks) == 30 and len(set(np_toks)) == 30  # no output token repeats
