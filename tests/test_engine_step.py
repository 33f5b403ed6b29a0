"""The torch executor's step as a GPU would see it, checked on the CPU.

- No op that makes the host wait (``harness.engine.opcount``) is dispatched in a
  decode, prefill or mixed step, whatever the sampling parameters; the sampled
  ids come back in exactly one fetch per step.
- Prefill chunks of several requests run in one forward pass, and greedy
  tokens are identical to serving each request alone.
- What the engine reports about itself: device, dtype, parameters, KV capacity,
  SDPA kernels, and a loud warning when ``--device auto`` left a visible GPU unused.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from harness.engine import device as device_mod
from harness.engine.config import EngineConfig
from harness.engine.device import MemoryPlan, check_fits, count_params, visible_gpu
from harness.engine.executor import TorchExecutor
from harness.engine.model import get_model_config
from harness.engine.opcount import OpCounter
from harness.engine.scheduler import Scheduler
from harness.engine.sim_executor import SimExecutor
from harness.engine.staging import Stager
from harness.engine.vision import IMAGE_SIZE, raw_pixels, to_pixels
from harness.wire.messages import EngineCoreOutput, EngineCoreRequest, FinishReason, SamplingParams

EOS = 1
VOCAB = 128


def make_config(**kw: Any) -> EngineConfig:
    base: dict[str, Any] = dict(
        device="cpu",
        vocab_size=VOCAB,
        eos_token_id=EOS,
        max_num_seqs=10,
        max_num_batched_tokens=256,
        max_model_len=128,
        long_prefill_token_threshold=0,
        image_tokens=8,
        num_threads=1,
    )
    base.update(kw)
    return EngineConfig(**base)


@pytest.fixture(scope="module")
def executor() -> TorchExecutor:
    return TorchExecutor(make_config())


def request(rid: str, n: int = 20, seed_tokens: int = 0, **sp: Any) -> EngineCoreRequest:
    toks = torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(seed_tokens)).tolist()
    sp.setdefault("max_tokens", 6)
    return EngineCoreRequest(rid, None, toks, SamplingParams(**sp), None, 0.0)


def serve(config: EngineConfig, ex: TorchExecutor, reqs: list[EngineCoreRequest]) -> tuple[dict, list]:
    s = Scheduler(config)
    for r in reqs:
        s.add_request(r)
    outputs: dict[str, list[EngineCoreOutput]] = {}
    steps = []
    while s.has_unfinished_requests():
        out = s.schedule()
        steps.append(out)
        for o in s.update_from_output(out, ex.execute(out)):
            outputs.setdefault(o.request_id, []).append(o)
        assert len(steps) < 500
    return outputs, steps


def tokens(outs: list[EngineCoreOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


# -- no hidden host syncs ---------------------------------------------------------

SAMPLING_KINDS: list[dict[str, Any]] = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05),
    dict(temperature=1.0, seed=7),
    dict(temperature=0.7, top_p=0.8, seed=11),
    dict(temperature=0.0, min_tokens=3, stop_token_ids=[3], ignore_eos=False),  # EOS and 3 suppressed
    dict(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2),
    dict(temperature=0.0, logit_bias={5: 2.0, 9: -1.0}),
]


def _step_counted(ex: TorchExecutor, s: Scheduler) -> tuple[Any, OpCounter, int]:
    out = s.schedule()
    before = ex.stager.fetches
    with OpCounter() as ops:
        result = ex.execute(out)
    s.update_from_output(out, result)
    return out, ops, ex.stager.fetches - before


@pytest.mark.parametrize("kinds", [SAMPLING_KINDS[:1], SAMPLING_KINDS], ids=["greedy", "every-kind"])
def test_steps_dispatch_no_host_sync_and_fetch_once(executor, kinds):
    cfg = executor.config
    s = Scheduler(cfg)
    for i, sp in enumerate(kinds):
        sp = {"ignore_eos": True, **sp}  # every request stays for the three steps
        s.add_request(request(f"sync-{len(kinds)}-{i}", n=15 + 3 * i, seed_tokens=i, max_tokens=8, **sp))
    prefill, ops, fetches = _step_counted(executor, s)
    assert len(prefill.prefills) == len(kinds) and not prefill.decodes
    assert not ops.syncs, f"prefill step: {dict(ops.syncs)}"
    assert fetches == 1
    decode, ops, fetches = _step_counted(executor, s)
    assert len(decode.decodes) == len(kinds) and not decode.prefills
    assert not ops.syncs, f"decode step: {dict(ops.syncs)}"
    assert fetches == 1
    # a mixed step: decodes plus a new request's prefill
    s.add_request(request(f"sync-late-{len(kinds)}", n=30, seed_tokens=99, max_tokens=4, **kinds[-1]))
    mixed, ops, fetches = _step_counted(executor, s)
    assert mixed.decodes and mixed.prefills
    assert not ops.syncs, f"mixed step: {dict(ops.syncs)}"
    assert fetches == 1
    s.abort_requests(list(s.requests))
    executor.execute(s.schedule())  # let the executor drop their state


def test_the_counter_sees_what_syncs():
    with OpCounter() as ops:
        x = torch.arange(6)
        int(x.max())
        bool(x.any())
        x.nonzero()
        torch.tensor([1, 2, 3])
        x.repeat_interleave(torch.tensor([1, 1, 1, 1, 1, 2]))
        x.repeat_interleave(2)  # an int repeat: no sync
        Stager(torch.device("cpu")).ints([1, 2], [3])  # staging: no sync
    assert ops.syncs["aten::nonzero"] == 1
    assert ops.syncs["aten::lift_fresh"] == 2
    assert ops.syncs["aten::repeat_interleave"] == 1
    assert ops.num_syncs == 6


def test_stager_packs_lists_in_one_buffer():
    st = Stager(torch.device("cpu"))
    a, b, c = st.ints([1, 2, 3], [], [7])
    assert a.tolist() == [1, 2, 3] and b.tolist() == [] and c.tolist() == [7]
    assert a.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()  # one transfer
    (f,) = st.floats([0.5, float("inf")])
    assert f.dtype == torch.float32 and f.tolist() == [0.5, float("inf")]
    assert st.fetch(torch.tensor([4, 5])) == [4, 5] and st.fetches == 1


# -- batched prefill ---------------------------------------------------------------


def test_batched_prefill_tokens_identical_to_one_at_a_time(executor):
    cfg = make_config(long_prefill_token_threshold=16)  # long prompts continue over a cached prefix
    specs = [(11, 0), (40, 1), (5, 2), (27, 3), (33, 4), (16, 5)]

    def reqs(tag: str) -> list[EngineCoreRequest]:
        return [
            request(f"{tag}-{i}", n=n, seed_tokens=seed, max_tokens=7, temperature=0.0, ignore_eos=True)
            for i, (n, seed) in enumerate(specs)
        ]

    batched, steps = serve(cfg, executor, reqs("batched"))
    assert max(len(st.prefills) for st in steps) >= 3  # several requests' chunks in one step ...
    assert any(c.start_pos > 0 for st in steps for c in st.prefills if len(st.prefills) > 1)  # ... some continued
    assert any(st.decodes and st.prefills for st in steps)  # and decodes beside prefills
    for i, r in enumerate(reqs("alone")):
        alone, alone_steps = serve(make_config(long_prefill_token_threshold=0), executor, [r])
        assert all(len(st.prefills) <= 1 for st in alone_steps)
        assert tokens(alone[r.request_id]) == tokens(batched[f"batched-{i}"])
        assert batched[f"batched-{i}"][-1].finish_reason == FinishReason.LENGTH


def test_images_in_a_batched_prefill_match_alone(executor):
    cfg = make_config(max_num_batched_tokens=256)
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8))
    from harness.wire.messages import PlaceholderRange

    def with_image(rid: str) -> EngineCoreRequest:
        r = request(rid, n=30, seed_tokens=3, max_tokens=5, temperature=0.0, ignore_eos=True)
        r.mm_inputs, r.mm_placeholders = [img], [PlaceholderRange(offset=4, length=8)]
        return r

    together, steps = serve(cfg, executor, [request("img-other", n=25, seed_tokens=8), with_image("img-batched")])
    assert any(len(st.prefills) == 2 for st in steps)
    alone, _ = serve(cfg, executor, [with_image("img-alone")])
    assert tokens(together["img-batched"]) == tokens(alone["img-alone"])


# -- images cross as raw bytes -------------------------------------------------------


def test_raw_pixels_keep_the_arriving_dtype_and_convert_like_before():
    rgb = np.random.default_rng(1).integers(0, 256, (12, 10, 3), dtype=np.uint8)
    raw = raw_pixels(Image.fromarray(rgb))
    # A PIL image becomes a tensor at the model's size, resized by PIL (not at the image's size).
    assert raw.data.dtype == torch.uint8 and tuple(raw.data.shape) == (IMAGE_SIZE, IMAGE_SIZE, 3)
    resized = np.array(Image.fromarray(rgb).resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR))
    expected = torch.from_numpy(resized).permute(2, 0, 1).float() / 127.5 - 1.0
    torch.testing.assert_close(raw.to_float(), expected)
    pv = torch.rand(1, 3, 8, 8).to(torch.bfloat16)
    raw = raw_pixels({"pixel_values": pv})
    assert raw.data.dtype == torch.bfloat16 and tuple(raw.data.shape) == (3, 8, 8)
    u8 = raw_pixels({"pixel_values": np.full((3, 4, 4), 255, np.uint8)})
    assert u8.data.dtype == torch.uint8 and torch.equal(u8.to_float(), torch.ones(3, 4, 4))
    assert to_pixels({"pixel_values": np.zeros((3, 4, 4), np.float16)}).dtype == torch.float32


def test_a_large_pil_image_becomes_a_tensor_at_the_models_size_not_its_own():
    """A 4096² image once cost the engine ~0.5 GB converted at full size; now PIL resizes it first.
    tracemalloc sees numpy's allocations: the array made is the model's 224² x 3 bytes."""
    import tracemalloc

    big = Image.new("RGB", (4096, 4096), (200, 30, 90))
    tracemalloc.start()
    try:
        raw = raw_pixels(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tuple(raw.data.shape) == (IMAGE_SIZE, IMAGE_SIZE, 3)
    assert peak < 4 * IMAGE_SIZE * IMAGE_SIZE * 3, peak  # a full-size array alone would be 50 MB


# -- what the engine says about itself -------------------------------------------------


def test_info_reports_device_model_kv_and_sdpa(executor):
    info = executor.info()
    assert info["device"] == "cpu" and info["dtype"] == "float32" and info["model_preset"] == "tiny"
    assert info["num_params"] == count_params(get_model_config("tiny", VOCAB))
    assert info["kv_cache_tokens"] == 10 * 128 and info["kv_cache_tokens_set"] is False
    assert info["max_seqs_at_max_model_len"] == 10
    assert info["kv_cache_bytes"] == 2 * 2 * 10 * 1 * 128 * 32 * 4  # K+V x layers x slots x kv heads x len x D x fp32
    assert set(info["sdpa"]) == {"prefill", "prefill_cached", "decode", "attention", "attention_calls_per_layer"}
    assert all(v != "unknown" for v in info["sdpa"].values()), info["sdpa"]
    assert info["compile"] is False and "device_warning" not in info
    sim = SimExecutor(make_config(kv_cache_tokens=300)).info()
    assert sim["kv_cache_tokens"] == 288 and sim["kv_cache_tokens_set"] is True  # whole blocks of 16
    assert sim["max_seqs_at_max_model_len"] == 2


def test_count_params_matches_the_built_model():
    for preset in ("tiny", "small"):
        ex = TorchExecutor(make_config(model_preset=preset, max_num_seqs=1, max_model_len=8))
        assert count_params(ex.model_config) == sum(p.numel() for p in ex.model.parameters())
    assert count_params(get_model_config("llama-8b", 4096)) == 8_030_261_248  # Llama 3 8B


def test_auto_device_on_cpu_warns_loudly_when_a_gpu_is_visible(monkeypatch, caplog):
    monkeypatch.setattr(device_mod, "visible_gpu", lambda: "nvidia-smi -L lists GPU 0: NVIDIA H200 (UUID: x)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="wirebench.engine"):
        ex = TorchExecutor(make_config(device="auto", max_num_seqs=1, max_model_len=8))
    warning = ex.info()["device_warning"]
    assert "fell back to the CPU" in warning and "H200" in warning
    assert any("fell back to the CPU" in r.getMessage() for r in caplog.records)
    # An explicit --device cpu is meant: no warning.
    assert "device_warning" not in TorchExecutor(make_config(device="cpu", max_num_seqs=1, max_model_len=8)).info()


def test_visible_gpu_reads_nvidia_smi_and_device_nodes(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("WIREBENCH_NVIDIA_DEV_GLOB", str(tmp_path / "nvidia[0-9]*"))
    assert visible_gpu() is None
    (tmp_path / "nvidia0").write_text("")
    assert "nvidia0" in (visible_gpu() or "")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    smi.chmod(0o755)
    assert "GPU 0: NVIDIA H200" in (visible_gpu() or "")


def test_memory_plan_says_what_fits_and_what_to_lower():
    gib = 1 << 30
    plan = MemoryPlan(weights=16 * gib, kv_cache=64 * gib, workspace=3 * gib, kv_tokens=256 * 2048)
    assert plan.shortfall("cuda:0") is None  # free unknown
    assert check_fits(plan, torch.device("cpu")) is plan
    roomy = MemoryPlan(16 * gib, 64 * gib, 3 * gib, 256 * 2048, free=139 * gib, total=140 * gib)
    assert roomy.shortfall("cuda:0") is None
    assert roomy.as_gib()["kv_cache_gib"] == 64.0 and roomy.as_gib()["free_gib_at_start"] == 139.0
    tight = MemoryPlan(16 * gib, 64 * gib, 3 * gib, 256 * 2048, free=79 * gib, total=80 * gib)
    msg = tight.shortfall("cuda:0") or ""
    assert "needs 83.0 GiB on cuda:0 but 79.0 GiB" in msg and "128 KiB a token" in msg
    assert f"About {60 * gib // (128 * 1024)} KV tokens fit" in msg and "--max-num-seqs" in msg


# -- torch.compile ------------------------------------------------------------------------


def test_compile_flag_is_wired(monkeypatch):
    compiled: list[Any] = []

    def fake_compile(fn, **kw):
        compiled.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    ex = TorchExecutor(make_config(compile=True, max_num_seqs=2, max_model_len=16))
    assert ex.model.compiled and len(compiled) == 2
    info = ex.info()
    assert info["compile"] is True and info["compile_s"] >= 0


@pytest.mark.slow  # inductor compiles C++ (20-35 s on a 2-core machine)
def test_compiled_steps_match_eager():
    eager_ex = TorchExecutor(make_config(max_num_seqs=4))
    try:
        compiled_ex = TorchExecutor(make_config(max_num_seqs=4, compile=True))
    except Exception as exc:  # no C++ compiler, or inductor unsupported here
        pytest.skip(f"torch.compile does not work on this machine: {type(exc).__name__}: {exc}")
    reqs = [request(f"c-{i}", n=9 + 7 * i, seed_tokens=i, max_tokens=6, temperature=0.0) for i in range(4)]
    eager, _ = serve(eager_ex.config, eager_ex, reqs)
    compiled, _ = serve(compiled_ex.config, compiled_ex, reqs)
    assert {k: tokens(v) for k, v in compiled.items()} == {k: tokens(v) for k, v in eager.items()}
