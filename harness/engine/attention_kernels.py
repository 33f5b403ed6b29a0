"""The CUDA kernels behind ``attention.paged_attention``, and the choice among them at model build.

Each attends the whole step (decode rows and prefill chunks) in one kernel launch per layer:

- ``flash-varlen-paged``: vLLM's FlashAttention build (``vllm.vllm_flash_attn``), reading keys in
  place through the block tables (``block_table`` with ``seqused_k``), 16-token blocks included
  (the upstream ``flash_attn`` package wants pages of 256 tokens, so it is not tried);
- ``torch-flash-varlen``: torch's own varlen flash forward (``aten::_flash_attention_forward``)
  over each layer's keys gathered packed through ``AttentionMeta.key_slots``.

Both align causality bottom-right (a chunk after a cached prefix sees the prefix, a decode row
sees its whole sequence) and read shared K/V heads natively (GQA). ``select`` tries them in that
order, on CUDA in float16/bfloat16 only: a kernel is chosen when it imports, runs and agrees
with the torch reference on a small mixed step (``probe``); else the reference serves, and
``Kernel.note`` says why. Importing vLLM's build imports the ``vllm`` package, whose import sets
a few environment variables and patches torch inductor internals in the engine process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from harness.engine.attention import REFERENCE, AttentionMeta, Kernel, reference, step_meta
from harness.engine.staging import Stager
from harness.engine.step_plan import Chunk, StepPlan, blocks_for

PROBE_TOLERANCE = 2e-2  # fp16/bf16 against the reference's SDPA in the same dtype


def vllm_paged(block_size: int) -> Kernel:
    """vLLM's varlen flash over the paged cache in place (raises ImportError where it is absent)."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    def run(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta) -> Tensor:
        n, h, d = q.shape
        pages = (-1, block_size, *k_cache.shape[1:])  # [blocks, block size, K, D]: a view
        out = flash_attn_varlen_func(
            q,
            k_cache.view(pages),
            v_cache.view(pages),
            max_seqlen_q=meta.max_q,
            cu_seqlens_q=meta.cu_seqlens_q,
            max_seqlen_k=meta.max_k,
            seqused_k=meta.seqlens_k,
            causal=True,
            block_table=meta.block_table,
        )
        return out.reshape(n, h * d)

    return Kernel("flash-varlen-paged", run, calls_per_layer=1, varlen=True, reference_fields=False)


def torch_varlen(block_size: int) -> Kernel:
    """torch's varlen flash forward over packed gathered keys (``block_size`` is not needed: the
    step's ``key_slots`` already resolve the blocks)."""
    op = torch.ops.aten._flash_attention_forward

    def run(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta) -> Tensor:
        assert meta.key_slots is not None
        n, h, d = q.shape
        keys, values = k_cache.index_select(0, meta.key_slots), v_cache.index_select(0, meta.key_slots)
        # (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask)
        out = op(
            q.contiguous(), keys, values, meta.cu_seqlens_q, meta.cu_seqlens_k, meta.max_q, meta.max_k, 0.0, True, False
        )[0]
        return out.reshape(n, h * d)

    return Kernel("torch-flash-varlen", run, calls_per_layer=1, varlen=True, packed_keys=True, reference_fields=False)


CANDIDATES: tuple[Callable[[int], Kernel], ...] = (vllm_paged, torch_varlen)


def probe_plan(block_size: int) -> StepPlan:
    """A small mixed step: two decode rows of different lengths, a chunk from position 0 and a
    chunk after a cached prefix, every block table out of order (blocks handed out backwards)."""
    lens = [21, 6, 11, 39]  # keys each sequence sees
    need = [blocks_for(n, block_size) for n in lens]
    ids = list(reversed(range(sum(need))))
    tables: list[Sequence[int]] = [ids[sum(need[:i]) : sum(need[: i + 1])] for i in range(len(need))]
    return StepPlan(tables[:2], [20, 5], [Chunk(tables[2], 0, 11), Chunk(tables[3], 19, 20)])


def probe(
    kernel: Kernel, device: torch.device, dtype: torch.dtype, n_heads: int, n_kv: int, head_dim: int, block_size: int
) -> None:
    """Raise unless ``kernel`` gives the reference's output on ``probe_plan``'s step."""
    plan = probe_plan(block_size)
    gen = torch.Generator(device=device).manual_seed(0)
    slots = (1 + max(max(t) for t in [*plan.decode_blocks, *(c.blocks for c in plan.chunks)])) * block_size
    k_cache, v_cache = (torch.randn(slots, n_kv, head_dim, generator=gen, device=device, dtype=dtype) for _ in range(2))
    q = torch.randn(plan.n_rows, n_heads, head_dim, generator=gen, device=device, dtype=dtype)
    staged = Stager(device).ints(*plan.index_lists(block_size), *plan.varlen_lists(block_size))
    # The reference's fields too, to run both on one meta.
    meta = step_meta(plan, staged, block_size, dtype, n_heads // n_kv, replace(kernel, reference_fields=True))
    torch.testing.assert_close(
        kernel.run(q, k_cache, v_cache, meta).float(),
        reference(q, k_cache, v_cache, meta).float(),
        atol=PROBE_TOLERANCE,
        rtol=PROBE_TOLERANCE,
    )


def select(device: torch.device, dtype: torch.dtype, n_heads: int, n_kv: int, head_dim: int, block_size: int) -> Kernel:
    """The kernel a model on ``device`` in ``dtype`` attends with: the first of ``CANDIDATES`` that
    passes ``probe`` on CUDA, else the reference (with why in its ``note`` on CUDA)."""
    if device.type != "cuda":
        return REFERENCE
    if dtype not in (torch.float16, torch.bfloat16):
        return replace(REFERENCE, note=f"flash kernels take float16 or bfloat16, not {dtype}")
    return first_passing(CANDIDATES, device, dtype, n_heads, n_kv, head_dim, block_size)


def first_passing(
    candidates: Sequence[Callable[[int], Kernel]],
    device: torch.device,
    dtype: torch.dtype,
    n_heads: int,
    n_kv: int,
    head_dim: int,
    block_size: int,
) -> Kernel:
    """The first of ``candidates`` that builds and passes ``probe``; else the reference, its note
    naming each candidate and why it was not kept."""
    notes = []
    for make in candidates:
        try:
            kernel = make(block_size)
            probe(kernel, device, dtype, n_heads, n_kv, head_dim, block_size)
        except Exception as exc:  # an import, a launch or a mismatch: never fail the build over it
            first = (str(exc).strip().splitlines() or [""])[0][:160]
            notes.append(f"{make.__name__}: {type(exc).__name__}: {first}")
            continue
        return kernel
    return replace(REFERENCE, note="; ".join(notes))
