"""One attention call per layer over the paged KV cache: the torch reference against a naive
definition, the step's varlen metadata against FlashAttention's convention, and the CUDA kernel
against the reference where a GPU is lent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from harness.engine import attention_kernels
from harness.engine.attention import REFERENCE, AttentionMeta, Kernel, paged_attention, reference, step_meta
from harness.engine.model import Transformer, get_model_config
from harness.engine.opcount import OpCounter
from harness.engine.staging import Stager
from harness.engine.step_plan import Chunk, StepPlan

CPU = torch.device("cpu")
BS = 16
ATOL = 1e-5
# Builds every varlen field (the packed keys too) for the CPU checks below.
ALL_FIELDS = replace(REFERENCE, varlen=True, packed_keys=True)


def make_plan(decode_lens: Sequence[int], chunks: Sequence[tuple[int, int]], seed: int = 0) -> StepPlan:
    """Decode rows seeing ``decode_lens`` keys and (start, length) chunks, their blocks drawn at random
    from the pool: no table is contiguous or in order."""
    lens = [*decode_lens, *(s + n for s, n in chunks)]
    need = [-(-n // BS) for n in lens]
    ids = np.random.default_rng(seed).permutation(sum(need) + 3).tolist()
    tables = [ids[sum(need[:i]) : sum(need[: i + 1])] for i in range(len(need))]
    b = len(decode_lens)
    return StepPlan(
        tables[:b], [n - 1 for n in decode_lens], [Chunk(t, s, n) for t, (s, n) in zip(tables[b:], chunks, strict=True)]
    )


def make_inputs(plan: StepPlan, n_heads: int, n_kv: int, head_dim: int = 16) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    n_blocks = 1 + max(max(t) for t in [*plan.decode_blocks, *(c.blocks for c in plan.chunks)])
    k_cache, v_cache = (torch.randn(n_blocks * BS, n_kv, head_dim, generator=gen) for _ in range(2))
    return torch.randn(plan.n_rows, n_heads, head_dim, generator=gen), k_cache, v_cache


def meta_of(plan: StepPlan, n_heads: int, n_kv: int, kernel: Kernel = ALL_FIELDS) -> AttentionMeta:
    staged = Stager(CPU).ints(*plan.index_lists(BS), *plan.varlen_lists(BS))
    return step_meta(plan, staged, BS, torch.float32, n_heads // n_kv, kernel)


def attend(q: Tensor, keys: Tensor, values: Tensor, start: int) -> Tensor:
    """q [n, H, D] at positions [start, start+n) over keys/values [L, K, D] from position 0 -> [n, H*D]."""
    n, h, d = q.shape
    g = h // keys.shape[1]
    seen = torch.arange(keys.shape[0])[None, :] <= start + torch.arange(n)[:, None]
    kh, vh = (x.transpose(0, 1).repeat_interleave(g, dim=0) for x in (keys, values))
    return F.scaled_dot_product_attention(q.transpose(0, 1), kh, vh, attn_mask=seen).transpose(0, 1).reshape(n, h * d)


def naive(q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: StepPlan) -> Tensor:
    """The definition: one SDPA per sequence over its keys gathered position by position, causal
    from the sequence's start."""
    seqs = [(t, p, 1) for t, p in zip(plan.decode_blocks, plan.decode_positions, strict=True)]
    seqs += [(c.blocks, c.start, c.length) for c in plan.chunks]
    out, row = [], 0
    for blocks, start, n in seqs:
        slots = torch.tensor([blocks[p // BS] * BS + p % BS for p in range(start + n)])
        out.append(attend(q[row : row + n], k_cache[slots], v_cache[slots], start))
        row += n
    return torch.cat(out)


def varlen_emulated(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta) -> Tensor:
    """What a varlen flash kernel computes from the metadata alone, one sequence at a time: sequence s
    has rows [cu_q[s], cu_q[s+1]) and sees seqlens_k[s] keys through its block table, query t seeing
    keys up to seqlens_k[s] - rows + t (causal aligned bottom-right)."""
    assert meta.cu_seqlens_q is not None and meta.seqlens_k is not None and meta.block_table is not None
    cu, k_lens = meta.cu_seqlens_q.tolist(), meta.seqlens_k.tolist()
    out = []
    for s, k_len in enumerate(k_lens):
        rows = q[cu[s] : cu[s + 1]]
        pos = torch.arange(k_len)
        slots = meta.block_table[s, pos // BS].long() * BS + pos % BS
        out.append(attend(rows, k_cache[slots], v_cache[slots], k_len - rows.shape[0]))
    return torch.cat(out)


CASES = {
    "mixed": ([5, 20, 33], [(0, 7), (0, 17), (19, 12)]),
    "decode only": ([1, 16, 17, 40], []),
    "chunks from 0": ([], [(0, 3), (0, 31), (0, 16)]),
    "chunks after prefixes": ([], [(16, 5), (3, 30)]),
    "one decode, one cached chunk": ([9], [(40, 1)]),
}
HEADS = [(4, 4), (8, 2), (4, 1)]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("n_heads", "n_kv"), HEADS)
def test_reference_equals_the_naive_definition(case: str, n_heads: int, n_kv: int) -> None:
    plan = make_plan(*CASES[case])
    q, k_cache, v_cache = make_inputs(plan, n_heads, n_kv)
    want = naive(q, k_cache, v_cache, plan)
    meta = meta_of(plan, n_heads, n_kv)
    torch.testing.assert_close(paged_attention(q, k_cache, v_cache, meta), want, atol=ATOL, rtol=1e-5)
    # The varlen metadata describes the same attention.
    torch.testing.assert_close(varlen_emulated(q, k_cache, v_cache, meta), want, atol=ATOL, rtol=1e-5)


def test_varlen_metadata_follows_flash_attention() -> None:
    decode_lens, chunks = CASES["mixed"]
    plan = make_plan(decode_lens, chunks)
    meta = meta_of(plan, 8, 2)
    assert meta.cu_seqlens_q is not None and meta.seqlens_k is not None and meta.block_table is not None
    assert meta.cu_seqlens_k is not None and meta.key_slots is not None
    for index in (meta.cu_seqlens_q, meta.seqlens_k, meta.block_table, meta.cu_seqlens_k):
        assert index.dtype == torch.int32
    q_lens = [1, 1, 1, 7, 17, 12]
    k_lens = [*decode_lens, 7, 17, 31]
    assert meta.cu_seqlens_q.tolist() == np.cumsum([0, *q_lens]).tolist()
    assert meta.seqlens_k.tolist() == k_lens and meta.cu_seqlens_k.tolist() == np.cumsum([0, *k_lens]).tolist()
    assert (meta.max_q, meta.max_k) == (17, 33)
    tables = [*plan.decode_blocks, *(c.blocks for c in plan.chunks)]
    assert meta.block_table.shape == (6, 3)  # blocks of the longest: 33 keys
    for row, table in zip(meta.block_table.tolist(), tables, strict=True):
        assert row[: len(table)] == list(table)
    slots = [t[p // BS] * BS + p % BS for t, n in zip(tables, k_lens, strict=True) for p in range(n)]
    assert meta.key_slots.tolist() == slots
    # A persistent batch's decode table (wider than needed) gives the same block table.
    given = np.zeros((3, 5), dtype=np.int64)
    for i, blocks in enumerate(plan.decode_blocks):
        given[i, : len(blocks)] = blocks
    same = replace(plan, decode_table=given, decode_table_lens=np.array([len(t) for t in plan.decode_blocks]))
    assert all((a == b).all() for a, b in zip(same.varlen_lists(BS), plan.varlen_lists(BS), strict=True))


def test_the_reference_reads_no_varlen_fields() -> None:
    plan = make_plan(*CASES["mixed"])
    meta = meta_of(plan, 8, 2, kernel=REFERENCE)
    assert meta.cu_seqlens_q is None and meta.block_table is None and meta.key_slots is None


@torch.inference_mode()
def test_ops_per_layer_do_not_grow_with_the_number_of_chunks() -> None:
    def count(chunks: list[tuple[int, int]]) -> int:
        plan = make_plan([4, 30], chunks)
        q, k_cache, v_cache = make_inputs(plan, 8, 2)
        staged = Stager(CPU).ints(*plan.index_lists(BS), *plan.varlen_lists(BS))
        with OpCounter() as ops:
            meta = step_meta(plan, staged, BS, torch.float32, 4, ALL_FIELDS)
            paged_attention(q, k_cache, v_cache, meta)
        assert ops.num_syncs == 0, ops.syncs
        return ops.num_ops

    assert count([(5, 3)]) == count([(5, 3), (0, 9), (17, 20), (0, 1), (2, 2)])


@torch.inference_mode()
def test_the_model_attends_once_a_layer_and_reads_the_varlen_metadata() -> None:
    """A kernel that reads only the varlen fields (the CPU emulation of a flash kernel), swapped into
    the model, gives the reference model's logits; attention is one call per layer."""
    cfg = get_model_config("tiny", 300)
    model = Transformer(cfg, 4, 64, CPU, torch.float32)
    model.init_weights(0)
    assert model.attention_kernel == REFERENCE and model.sdpa_backends()["attention"] == "torch-reference"
    calls = []

    def emulated(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta) -> Tensor:
        calls.append(q.shape[0])
        return varlen_emulated(q, k_cache, v_cache, meta)

    tb = model.slot_blocks
    prefix = torch.arange(20) % 300
    model.prefill(model.embed(prefix), slot=1, start=0)  # slot 1's first 20 positions, cached
    model.prefill(model.embed(prefix[:9]), slot=3, start=0)
    plan = StepPlan([tb(3)], [9], [Chunk(tb(0), 0, 11), Chunk(tb(1), 20, 6)])
    ids = torch.arange(plan.n_rows) % 300
    want = model.forward_step(model.embed(ids), model.stage(plan)[0])
    model.attention_kernel = Kernel("emulated", emulated, 1, varlen=True, packed_keys=True)
    got = model.forward_step(model.embed(ids), model.stage(plan)[0])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert calls == [plan.n_rows] * cfg.n_layers


def test_the_cpu_selects_the_reference() -> None:
    assert attention_kernels.select(CPU, torch.float32, 8, 2, 16, BS) is REFERENCE


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs where one is lent)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_cuda_kernel_equals_the_reference(dtype: torch.dtype) -> None:
    cuda = torch.device("cuda")
    kernel = attention_kernels.select(cuda, dtype, 8, 2, 64, BS)
    assert kernel.name != REFERENCE.name, f"no kernel on this GPU: {kernel.note}"
    assert kernel.calls_per_layer == 1
    for decode_lens, chunks in CASES.values():
        plan = make_plan(decode_lens, chunks)
        q, k_cache, v_cache = (t.to(cuda, dtype) for t in make_inputs(plan, 8, 2, head_dim=64))
        staged = Stager(cuda).ints(*plan.index_lists(BS), *plan.varlen_lists(BS))
        meta = step_meta(plan, staged, BS, dtype, 4, replace(kernel, reference_fields=True))
        got = paged_attention(q, k_cache, v_cache, meta, kernel)
        torch.testing.assert_close(got.float(), reference(q, k_cache, v_cache, meta).float(), atol=2e-2, rtol=2e-2)


def test_a_kernel_is_kept_only_when_it_builds_and_matches_the_reference() -> None:
    """``select``'s fallback on CUDA, run on the CPU: a kernel that fails to import or disagrees
    with the reference is passed over, and the reference's note says why."""

    def absent(block_size: int) -> Kernel:
        raise ImportError("no module named 'flash'")

    def wrong(block_size: int) -> Kernel:
        return Kernel("wrong", lambda q, k, v, meta: reference(q, k, v, meta) + 1, 1, varlen=True)

    def emulated(block_size: int) -> Kernel:
        return Kernel("emulated", varlen_emulated, 1, varlen=True)

    args = (CPU, torch.float32, 8, 2, 16, BS)
    kept = attention_kernels.first_passing([absent, wrong, emulated], *args)
    assert kept.name == "emulated"
    fallback = attention_kernels.first_passing([absent, wrong], *args)
    assert fallback.name == REFERENCE.name and fallback.calls_per_layer == 2
    assert "absent: ImportError" in fallback.note and "wrong: AssertionError" in fallback.note
