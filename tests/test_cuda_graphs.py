"""CUDA graphs for decode steps (harness.engine.cuda_graphs) and the sampler's fixed-shape path.

On a CPU the graphs run emulated (``decode_graphs(..., emulate=True)``): capture keeps each
bucket's step callable and a replay calls it on the same static buffers, so bucketing, padding,
the scratch block and the buffer plumbing run for real against the eager executor; only
``torch.cuda.CUDAGraph`` is left to the test that needs a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness.engine import attention_kernels, cuda_graphs
from harness.engine import executor as executor_module
from harness.engine.attention import AttentionMeta, Kernel
from harness.engine.config import EngineConfig
from harness.engine.cuda_graphs import DecodeGraphs, bucket_sizes, refusal
from harness.engine.executor import TorchExecutor
from harness.engine.sampler import SampleColumns, Sampler, SampleRow
from harness.engine.scheduler import Scheduler
from harness.wire.messages import EngineCoreRequest, SamplingParams

VOCAB = 128
REPO = Path(__file__).resolve().parents[1]


def make_config(**kw: Any) -> EngineConfig:
    base: dict[str, Any] = dict(
        device="cpu",
        vocab_size=VOCAB,
        eos_token_id=1,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=96,
        kv_cache_tokens=1024,
        num_threads=1,
    )
    base.update(kw)
    return EngineConfig(**base)


def emulated(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> TorchExecutor:
    """A torch executor whose decode graphs are emulated (the CPU has no CUDA graphs)."""
    monkeypatch.setattr(executor_module, "decode_graphs", partial(cuda_graphs.decode_graphs, emulate=True))
    return TorchExecutor(make_config(cuda_graphs=True, **kw))


def request(rid: str, n: int, max_tokens: int, seed_tokens: int = 0, **sp: Any) -> EngineCoreRequest:
    toks = torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(seed_tokens)).tolist()
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sp)
    return EngineCoreRequest(rid, None, toks, params, None, 0.0)


def serve(executor: TorchExecutor, requests: list[EngineCoreRequest]) -> dict[str, list[int]]:
    """Every request's tokens, run to the end by the real scheduler."""
    s = Scheduler(executor.config)
    for r in requests:
        s.add_request(r)
    out: dict[str, list[int]] = {}
    for _ in range(2000):
        if not s.has_unfinished_requests():
            break
        sched = s.schedule()
        for o in s.update_from_output(sched, executor.execute(sched)):
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert not s.has_unfinished_requests()
    return out


def batch_of(count: int, tag: str, **sp: Any) -> list[EngineCoreRequest]:
    # Different prompt and output lengths: the decode batch shrinks one request at a time.
    return [request(f"{tag}-{i}", 5 + 7 * i, 6 + 3 * i, seed_tokens=i, **sp) for i in range(count)]


@pytest.fixture(scope="module")
def eager() -> TorchExecutor:
    return TorchExecutor(make_config())


def test_buckets_are_powers_of_two_then_multiples_of_eight() -> None:
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(3) == [1, 2, 4]
    assert bucket_sizes(8) == [1, 2, 4, 8]
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 24]
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_bucket_choice_is_the_smallest_that_holds_the_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    graphs = emulated(monkeypatch, max_num_seqs=20).graphs
    assert graphs is not None
    assert [graphs.bucket_for(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 20)] == [1, 2, 4, 8, 8, 16, 16, 24, 24]
    assert graphs.bucket_for(25) is None
    assert graphs.info()["captured"] == [1, 2, 4, 8, 16, 24]


@pytest.mark.parametrize("count", [3, 5, 7])
def test_greedy_streams_with_graphs_equal_the_eager_ones(
    count: int, eager: TorchExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    graphs = emulated(monkeypatch)
    staged: list[int] = []
    stage = graphs.model.stage

    def counted_stage(*args: Any, **kwargs: Any) -> Any:
        staged.append(1)
        return stage(*args, **kwargs)

    monkeypatch.setattr(graphs.model, "stage", counted_stage)
    reqs = batch_of(count, f"greedy{count}", temperature=0.0)
    assert serve(graphs, reqs) == serve(eager, reqs)
    info = graphs.info()["cuda_graphs"]
    assert info["enabled"] and info["emulated"] and info["captured"] == [1, 2, 4, 8]
    assert info["replays"] > 0 and info["eager_by_reason"]["prefill"] > 0
    assert len(staged) == info["eager_steps"]  # a replayed step stages its token ids alone
    # The batch shrank through sizes that need padding: 7 rows in 8, 5 or 3 in 4.
    assert any(b in info["replays_by_bucket"] for b in ("4", "8"))
    assert set(info["replays_by_variant"]) == {"greedy"}  # an argmax alone: no softmax, no noise


def test_sampled_streams_with_graphs_equal_the_eager_ones(
    eager: TorchExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded and unseeded, filtered and not: the noise is drawn by the eager sampler's calls."""
    graphs = emulated(monkeypatch)
    reqs = [
        request("mix-0", 9, 12, 0, temperature=0.8, seed=7),
        request("mix-1", 14, 10, 1, temperature=1.0),
        request("mix-2", 6, 5, 2, temperature=0.7, top_p=0.9, top_k=20, seed=3),
        request("mix-3", 11, 8, 3, temperature=0.0),
        request("mix-4", 7, 4, 4, temperature=1.2, min_p=0.05),
    ]
    assert serve(graphs, reqs) == serve(eager, reqs)
    info = graphs.info()["cuda_graphs"]
    assert info["replays"] > 0 and {"filtered", "plain"} <= set(info["replays_by_variant"]), info


def test_padding_rows_write_only_the_scratch_block(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = emulated(monkeypatch)
    graphs = ex.graphs
    assert isinstance(graphs, DecodeGraphs)
    cfg = ex.config
    # The scheduler hands out blocks [0, num_kv_blocks); the model holds one more, the scratch one.
    assert graphs.scratch_block == cfg.num_kv_blocks == ex.model.num_blocks - 1
    reqs = batch_of(3, "scratch", temperature=0.0)
    s = Scheduler(cfg)
    for r in reqs:
        s.add_request(r)
    owned: set[int] = set()
    while s.has_unfinished_requests():
        sched = s.schedule()
        for c in sched.chunks:
            owned.update(c.block_ids)
        s.update_from_output(sched, ex.execute(sched))
    assert graphs.scratch_block not in owned
    bk = graphs.buckets[4]  # 3 rows decode in the bucket of 4
    assert graphs.replays[4] > 0
    bs = cfg.kv_block_size
    slots = bk.part("slots")
    assert int(slots[3]) == graphs.scratch_block * bs  # the padding row's K/V slot
    assert all(int(x) // bs != graphs.scratch_block for x in slots[:3])
    tables = bk.part("tables").view(4, -1)
    assert bool((tables[3] == graphs.scratch_block).all())
    assert graphs.scratch_block not in tables[:3].unique().tolist()


def test_requests_with_penalties_or_suppressed_ids_run_eagerly(
    eager: TorchExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    graphs = emulated(monkeypatch)
    reqs = [
        request("pen-0", 8, 8, 0, temperature=0.0, repetition_penalty=1.3),
        request("pen-1", 10, 12, 1, temperature=0.0),
        request("pen-2", 6, 16, 2, temperature=0.0, min_tokens=12, stop_token_ids=[9]),  # 9 suppressed
    ]
    assert serve(graphs, reqs) == serve(eager, reqs)
    info = graphs.info()["cuda_graphs"]
    assert info["eager_by_reason"]["bias_penalties_logprobs"] > 0
    assert info["eager_by_reason"]["suppressed_ids"] > 0
    assert info["replays"] > 0  # once pen-0 finished and pen-2 has its 12 tokens
    assert info["eager_steps"] == sum(info["eager_by_reason"].values())


def columns(rows: list[SampleRow]) -> SampleColumns:
    return SampleColumns.of_rows(rows)


def fixed(sampler: Sampler, logits: torch.Tensor, cols: SampleColumns, bucket: int) -> torch.Tensor:
    """``sample_fixed`` on ``cols`` padded to ``bucket`` rows (padding logits: zeros)."""
    ints, floats, variant = sampler.fixed_inputs(cols, bucket)
    noise = torch.ones(bucket, sampler.vocab_size)
    sampler.draw_fixed_noise(cols, noise)
    padded = torch.zeros(bucket, logits.shape[1])
    padded[: logits.shape[0]] = logits
    out = sampler.sample_fixed(
        padded, torch.from_numpy(ints), torch.from_numpy(floats.astype(np.float32)), noise, variant
    )
    return out[: len(cols)]


def test_fixed_sampler_is_greedy_where_the_eager_one_is() -> None:
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(1))
    rows = [SampleRow(SamplingParams(temperature=0.0)) for _ in range(5)]
    eager = Sampler(VOCAB, 0, torch.device("cpu")).sample_columns(logits, columns(rows))
    assert torch.equal(fixed(Sampler(VOCAB, 0, torch.device("cpu")), logits, columns(rows), 8), eager)
    assert torch.equal(eager, logits.argmax(dim=-1))


@pytest.mark.parametrize("filters", [{}, {"top_k": 10, "top_p": 0.8}, {"min_p": 0.1}])
def test_fixed_sampler_draws_what_the_eager_one_draws(filters: dict[str, Any]) -> None:
    """Same generators, same noise calls: the same tokens, seeded rows and shared ones."""
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(temperature=0.9, seed=11, **filters),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.1, **filters),
        SamplingParams(temperature=0.6, seed=5),
        SamplingParams(temperature=1.0, **filters),
        SamplingParams(temperature=0.0, top_k=3),
    ]
    picks = []
    for path in ("eager", "fixed"):
        sampler = Sampler(VOCAB, 0, torch.device("cpu"))
        rows = [SampleRow(p, sampler.request_generator(p)) for p in params]
        for _ in range(4):  # several steps: the generators advance alike
            cols = columns(rows)
            picks.append(
                (path, sampler.sample_columns(logits, cols) if path == "eager" else fixed(sampler, logits, cols, 8))
            )
    eager = [t for p, t in picks if p == "eager"]
    graph = [t for p, t in picks if p == "fixed"]
    assert all(torch.equal(a, b) for a, b in zip(eager, graph, strict=True))


def test_fixed_sampler_follows_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05] + [0.0] * (VOCAB - 4))
    logits = probs.clamp_min(1e-30).log()[None].expand(4000, -1).contiguous()
    sampler = Sampler(VOCAB, 3, torch.device("cpu"))
    cols = columns([SampleRow(SamplingParams(temperature=1.0)) for _ in range(4000)])
    counts = torch.bincount(fixed(sampler, logits, cols, 4000), minlength=VOCAB).float() / 4000
    assert counts[4:].sum() == 0
    assert torch.allclose(counts[:4], probs[:4], atol=0.03), counts[:4]
    # top-k 2 renormalises over the two most likely tokens: 5/8 and 3/8.
    cols = columns([SampleRow(SamplingParams(temperature=1.0, top_k=2)) for _ in range(4000)])
    counts = torch.bincount(fixed(sampler, logits, cols, 4000), minlength=VOCAB).float() / 4000
    assert counts[2:].sum() == 0 and abs(float(counts[0]) - 0.625) < 0.03


def test_refusal_without_cuda() -> None:
    assert refusal(make_config()) is None
    assert refusal(make_config(cuda_graphs=True)) == "--cuda-graphs needs a CUDA device; --device cpu runs on the CPU"
    if not torch.cuda.is_available():
        assert refusal(make_config(cuda_graphs=True, device="auto")) == (
            "--cuda-graphs needs a CUDA device; this machine has none"
        )
        with pytest.raises(ValueError, match="needs a CUDA device"):
            TorchExecutor(make_config(cuda_graphs=True))


def test_bench_serve_refuses_cuda_graphs_in_one_line_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--cuda-graphs"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    # A start first sweeps what dead processes left (a test beside this one may have killed a server): logged.
    said = [line for line in done.stderr.strip().splitlines() if " WARNING removed " not in line]
    assert said == ["bench serve: --cuda-graphs needs a CUDA device; this machine has none"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs where one is lent)")
def test_captured_graphs_replay_the_eager_streams() -> None:
    cfg = dict(device="cuda", dtype="float32")
    eager = TorchExecutor(make_config(**cfg))
    graphs = TorchExecutor(make_config(cuda_graphs=True, **cfg))
    reqs = batch_of(5, "cuda", temperature=0.0) + [request("cuda-s", 9, 12, 9, temperature=0.8, seed=4, top_p=0.9)]
    got, want = serve(graphs, reqs), serve(eager, reqs)
    info = graphs.info()["cuda_graphs"]
    assert info["captured"] == [1, 2, 4, 8] and not info["emulated"] and info["replays"] > 0
    # Greedy rows pick the same tokens unless the padded batch's kernels round a near tie apart.
    same = sum(got[r.request_id] == want[r.request_id] for r in reqs)
    assert same >= len(reqs) - 1, (got, want)


def test_the_seed_summary_says_which_batch_sizes_were_captured(tmp_path: Path) -> None:
    """scripts/gpu_check_seed.py reads the engine's cuda_graphs info from a run file."""
    spec = importlib.util.spec_from_file_location("gpu_check_seed", REPO / "scripts" / "gpu_check_seed.py")
    assert spec is not None and spec.loader is not None
    seed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed)
    engine = {"device": "cuda:0", "cuda_graphs": {"enabled": True, "captured": [1, 2, 4, 8], "replays": 0}}
    (tmp_path / "run.json").write_text(json.dumps({"completed": 4, "failed": 0, "metadata": {"engine": engine}}))
    bad: list[str] = []
    out = seed.arm_summary(str(tmp_path), "msgspec", [{"status": "ok", "result_file": "run.json"}], "cuda", bad)
    assert out["cuda_graphs_captured"] == [1, 2, 4, 8] and bad == []
    engine["cuda_graphs"] = {"enabled": True, "captured": [], "error": "RuntimeError: out of memory"}
    (tmp_path / "run.json").write_text(json.dumps({"completed": 4, "failed": 0, "metadata": {"engine": engine}}))
    out = seed.arm_summary(str(tmp_path), "msgspec", [{"status": "ok", "result_file": "run.json"}], "cuda", bad)
    assert out["cuda_graphs_captured"] == [] and out["cuda_graphs_error"] == "RuntimeError: out of memory"
    engine["cuda_graphs"] = {"enabled": False}
    (tmp_path / "run.json").write_text(json.dumps({"completed": 4, "failed": 0, "metadata": {"engine": engine}}))
    out = seed.arm_summary(str(tmp_path), "msgspec", [{"status": "ok", "result_file": "run.json"}], "cuda", bad)
    assert "cuda_graphs_captured" not in out


def test_overlapped_engine_with_graphs_streams_what_the_eager_series_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's default loop (one step of overlap: a decode's input token is filled on the
    device) with emulated graphs, against the loop in series without them: stops, EOS, min_tokens,
    logprobs, chunked prefills and aborts on test_torch_overlap's workload (unseeded requests greedy:
    a wasted row of the overlapped loop draws from the shared generator too)."""
    from test_overlap import serve as serve_core
    from test_torch_overlap import rounded, seeded_workload, torch_core

    abort = {"stop-string": 4}
    series = rounded(serve_core(torch_core(False), seeded_workload(), abort))
    monkeypatch.setattr(executor_module, "decode_graphs", partial(cuda_graphs.decode_graphs, emulate=True))
    core = torch_core(True, cuda_graphs=True)
    assert rounded(serve_core(core, seeded_workload(), abort)) == series
    info = core.executor.info()["cuda_graphs"]
    assert info["replays"] > 0
    assert {"prefill", "bias_penalties_logprobs"} <= set(info["eager_by_reason"]), info


def test_a_failed_capture_leaves_every_step_eager(eager: TorchExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: DecodeGraphs, bk: Any, variant: str) -> torch.Tensor:
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(DecodeGraphs, "_step", refuse)
    graphs = emulated(monkeypatch)
    reqs = batch_of(3, "failed", temperature=0.0)
    assert serve(graphs, reqs) == serve(eager, reqs)
    info = graphs.info()["cuda_graphs"]
    assert info["error"] == "RuntimeError: operation not permitted when stream is capturing"
    assert info["captured"] == [] and info["replays"] == 0
    assert info["eager_by_reason"]["capture_failed"] > 0


def paged_varlen(block_size: int) -> Kernel:
    """FlashAttention's paged varlen semantics on the CPU, a sequence at a time: each sequence's
    ``seqlens_k`` keys read through its ``block_table`` row, causal bottom-right. Stands in for
    vLLM's kernel (CUDA only) so the graphs' varlen lists are checked against the eager ones."""

    def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        assert meta.cu_seqlens_q is not None and meta.seqlens_k is not None and meta.block_table is not None
        n, h, d = q.shape
        group = h // k_cache.shape[1]
        cu, lens = meta.cu_seqlens_q.tolist(), meta.seqlens_k.tolist()
        out = torch.zeros(n, h, d)
        for s, keys in enumerate(lens):
            lo, hi = cu[s], cu[s + 1]
            blocks = meta.block_table[s].long()
            slots = (blocks[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:keys]
            k = k_cache[slots].float().repeat_interleave(group, dim=1)  # [L, H, D]
            v = v_cache[slots].float().repeat_interleave(group, dim=1)
            t = hi - lo
            seen = torch.arange(keys)[None, :] <= (keys - t + torch.arange(t))[:, None]  # [T, L]
            scores = torch.einsum("thd,lhd->htl", q[lo:hi].float(), k) / d**0.5
            att = scores.masked_fill(~seen[None], float("-inf")).softmax(dim=-1)
            out[lo:hi] = torch.einsum("htl,lhd->thd", att, v)
        return out.to(q.dtype).reshape(n, h * d)

    return Kernel("test-paged-varlen", run, calls_per_layer=1, varlen=True)


def test_graphs_attend_with_a_paged_varlen_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that reads the cache in place through block tables serves the graphs too (its
    lists have fixed shapes); the streams equal the eager steps' with the same kernel."""
    monkeypatch.setattr(attention_kernels, "select", lambda *args: paged_varlen(16))
    eager = TorchExecutor(make_config())
    assert eager.model.attention_kernel.name == "test-paged-varlen"
    graphs = emulated(monkeypatch)
    reqs = batch_of(5, "varlen", temperature=0.0) + [request("varlen-s", 9, 10, 7, temperature=0.9, seed=2)]
    assert serve(graphs, reqs) == serve(eager, reqs)
    info = graphs.info()["cuda_graphs"]
    assert info["attention"] == "test-paged-varlen" and info["replays"] > 0


def test_a_kernel_that_packs_the_steps_keys_leaves_the_graphs_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    packed = replace(paged_varlen(16), name="test-packed", packed_keys=True)
    monkeypatch.setattr(attention_kernels, "select", lambda *args: packed)
    assert emulated(monkeypatch).info()["cuda_graphs"]["attention"] == "torch-reference"
