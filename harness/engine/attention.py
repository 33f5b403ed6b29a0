"""The model's attention over the paged KV cache: one ``paged_attention`` call per layer for the
whole step (decode rows and prefill chunks), and its torch reference.

``paged_attention`` runs the ``Kernel`` the model chose when it was built
(``harness.engine.attention_kernels``): a varlen flash kernel on CUDA where one imports and
agrees with the reference, else the reference here. The step's ``AttentionMeta`` is built
once per step (``step_meta``), in FlashAttention's varlen convention plus what the reference reads.

The reference attends through torch's ``scaled_dot_product_attention`` (SDPA) in at most
two calls, whatever the number of sequences:

- ``decode``: every decode row at once, each over its own keys gathered from the
  cache through its block table (ragged lengths through one mask);
- ``chunks``: every prefill chunk at once (varlen): queries padded to the longest
  chunk, keys gathered through each chunk's block table, one causal mask offset
  by each chunk's start (a chunk after a cached prefix sees the prefix); when
  every chunk starts at position 0, ``is_causal`` and no mask at all (padding
  rows and keys sit past each chunk's end, where causality hides them).

Masks are additive floats made once per step, so no layer converts a boolean one.

The gathers are the torch reference for a paged-attention kernel: they copy each
sequence's keys out of the blocks, which a fused kernel would read in place.
``sdpa_backends`` asks torch which kernel each call gets; it builds the same shapes
as the calls, which is why both live here.

Shape legend: N rows, B decode rows, C chunks, T the longest chunk, H query heads,
K kv heads, G = H // K query heads per kv head, D head dim, L keys, S cache slots
(blocks x block size), Q sequences of a step (B + C).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.engine.step_plan import StepPlan

# enable_gqa (torch >= 2.5) lets SDPA read K/V heads shared by G query heads
# without copying them G times.
SDPA_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2] if p.isdigit()) >= (2, 5)


def key_slots(tables: Tensor, block_size: int, length: int) -> Tensor:
    """Cache slots of positions [0, length) of each sequence: tables [n, nb] -> [n, length]."""
    n, nb = tables.shape
    offsets = torch.arange(block_size, device=tables.device)
    return (tables[:, :, None] * block_size + offsets).reshape(n, nb * block_size)[:, :length]


def gather(cache: Tensor, slots: Tensor) -> Tensor:
    """The cache's rows at ``slots`` [n, L] as [n, K, L, D] (``index_select``: a row copy each,
    several times faster on the CPU than advanced indexing)."""
    n, length = slots.shape
    return cache.index_select(0, slots.reshape(-1)).view(n, length, *cache.shape[1:]).transpose(1, 2)


def decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, mask: Tensor) -> Tensor:
    """One new token per sequence: q [B, H, D] over the cache [S, K, D] at ``slots`` [B, L],
    mask [B, 1, 1, L] -> [B, H*D]. GQA without repeating K/V: each kv head's G query heads
    are its query rows."""
    b, h, d = q.shape
    n_kv = k_cache.shape[1]
    keys, values = gather(k_cache, slots), gather(v_cache, slots)  # [B, K, L, D]
    out = F.scaled_dot_product_attention(q.view(b, n_kv, h // n_kv, d), keys, values, attn_mask=mask)
    return out.reshape(b, h * d)  # [B, K, G, D] -> [B, H*D]


def chunks(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, mask: Tensor | None, dst: Tensor, width: int
) -> Tensor:
    """Every prefill chunk at once: q [Nc, H, D] (the chunks' rows, concatenated) over the cache
    [S, K, D] at ``slots`` [C, L], mask [C, 1, G*T, L] (``chunks_mask``) or None (every chunk from
    position 0: causal); ``dst`` [Nc] is each row's place among the C x T padded queries
    (T = ``width``) -> [Nc, H*D].

    Causal, SDPA reads shared K/V heads itself (``enable_gqa``, which the flash kernel takes).
    Masked, each kv head's G query heads fold into the query length instead (row g*T + t is
    query t of head g), so GQA needs no repeat and the efficient kernel, which takes masks but
    not ``enable_gqa``, stays eligible on CUDA.
    """
    _, h, d = q.shape
    c, n_kv = slots.shape[0], k_cache.shape[1]
    g = h // n_kv
    padded = q.new_zeros(c * width, h, d).index_copy_(0, dst, q)
    keys, values = gather(k_cache, slots), gather(v_cache, slots)  # [C, K, L, D]
    if mask is None:
        qh = padded.view(c, width, h, d).transpose(1, 2)  # [C, H, T, D]
        gqa: dict[str, Any] = {"enable_gqa": g > 1} if SDPA_GQA else {}
        if g > 1 and not SDPA_GQA:
            keys, values = keys.repeat_interleave(g, dim=1), values.repeat_interleave(g, dim=1)
        out = F.scaled_dot_product_attention(qh, keys, values, is_causal=True, **gqa).transpose(1, 2)
    else:
        qf = padded.view(c, width, n_kv, g, d).permute(0, 2, 3, 1, 4).reshape(c, n_kv, g * width, d)
        out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=mask)  # [C, K, G*T, D]
        out = out.view(c, n_kv, g, width, d).permute(0, 3, 1, 2, 4)  # [C, T, K, G, D]
    return out.reshape(c * width, h * d).index_select(0, dst)


def _additive(seen: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as SDPA's additive one: 0 where seen, -inf elsewhere."""
    return torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, float("-inf"))


def decode_mask(positions: Tensor, length: int, dtype: torch.dtype) -> Tensor:
    """``decode``'s mask [B, 1, 1, length]: row b sees keys [0, positions[b]]."""
    seen = torch.arange(length, device=positions.device)[None, :] <= positions[:, None]
    return _additive(seen, dtype)[:, None, None, :]


def chunks_mask(q_pos: Tensor, group: int, length: int, dtype: torch.dtype) -> Tensor:
    """``chunks``' mask [C, 1, G*T, length] from the padded queries' positions q_pos [C, T]: query t
    sees keys j <= its position (a padding query, at position 0, sees key 0 and is dropped), its
    row repeated per folded head (row g*T + t)."""
    c, t = q_pos.shape
    seen = torch.arange(length, device=q_pos.device)[None, None, :] <= q_pos[:, :, None]  # [C, T, L]
    return _additive(seen[:, None].expand(c, group, t, length).reshape(c, 1, group * t, length), dtype)


def sdpa_backends(k_cache: Tensor, n_heads: int) -> dict[str, str]:
    """The SDPA kernel torch picks for each call above, on the device and dtype of ``k_cache`` [S, K, D].

    ``prefill``: ``chunks`` when every chunk starts at 0 (causal); ``prefill_cached``: ``chunks``
    with a mask; ``decode``: ``decode``.
    'math' on CUDA means the slow fallback that materializes the scores.
    """
    try:
        from torch.nn.attention import SDPBackend

        choose = torch._fused_sdp_choice
    except (ImportError, AttributeError):
        return {"prefill": "unknown", "prefill_cached": "unknown", "decode": "unknown"}
    _, k, d = k_cache.shape
    dev, dt = k_cache.device, k_cache.dtype
    g, n_len, n = n_heads // k, 32, 4

    def name(*args: Any, **kwargs: Any) -> str:
        try:
            return SDPBackend(choose(*args, **kwargs)).name.lower()
        except Exception:  # a private API: never fail the engine over a report
            return "unknown"

    keys = torch.zeros(n, k, n_len, d, device=dev, dtype=dt)
    qh = torch.zeros(n, n_heads, n_len, d, device=dev, dtype=dt)
    if SDPA_GQA:
        gqa = {"enable_gqa": g > 1}
        kv = keys
    else:
        gqa, kv = {}, keys.repeat_interleave(g, dim=1)
    prefill = name(qh, kv, kv, None, 0.0, True, **gqa)
    qf = torch.zeros(n, k, g * n_len, d, device=dev, dtype=dt)
    mask = torch.zeros(n, 1, g * n_len, n_len, device=dev, dtype=dt)
    cached = name(qf, keys, keys, mask, 0.0, False)
    qd = torch.zeros(n, k, g, d, device=dev, dtype=dt)
    mask = torch.zeros(n, 1, 1, n_len, device=dev, dtype=dt)
    decoded = name(qd, keys, keys, mask, 0.0, False)
    return {"prefill": prefill, "prefill_cached": cached, "decode": decoded}


# -- one call per layer ---------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionMeta:
    """What a step's attention reads, built once per step (``step_meta``), shared by every layer.

    The varlen fields are FlashAttention's convention, Q sequences in the step's row order (each
    decode row a sequence of one query, then each chunk), present when the model's kernel reads
    them; the reference reads the decode/chunk fields.
    """

    n_decode: int  # B: rows [0, B) decode, the rest the chunks' rows
    chunk_width: int  # T, the longest chunk
    decode_slots: Tensor | None  # [B, L] cache slots of each decode row's keys
    decode_mask: Tensor | None  # [B, 1, 1, L]
    chunk_slots: Tensor | None  # [C, L] cache slots of each chunk's keys
    chunk_mask: Tensor | None  # [C, 1, G*T, L]; None with every chunk from position 0 (causal)
    chunk_dst: Tensor | None  # [Nc] each chunk row's place among the C x T padded queries
    max_q: int = 0  # the most query rows of a sequence
    max_k: int = 0  # the most keys a sequence sees
    cu_seqlens_q: Tensor | None = None  # [Q+1] int32: sequence s's rows are [cu[s], cu[s+1])
    seqlens_k: Tensor | None = None  # [Q] int32: keys sequence s sees (its start + its rows)
    block_table: Tensor | None = None  # [Q, max_blocks] int32
    cu_seqlens_k: Tensor | None = None  # [Q+1] int32: seqlens_k laid end to end (packed keys)
    key_slots: Tensor | None = None  # [total keys] cache slot of each packed key


@dataclass(frozen=True)
class Kernel:
    """An implementation of ``paged_attention``: q [N, H, D], caches [S, K, D], meta -> [N, H*D]."""

    name: str
    run: Callable[[Tensor, Tensor, Tensor, AttentionMeta], Tensor]
    calls_per_layer: int  # kernel launches of attention proper per layer (at most, the reference)
    varlen: bool = False  # reads cu_seqlens_q, seqlens_k, block_table
    packed_keys: bool = False  # reads cu_seqlens_k, key_slots
    # reads the reference's key slots and masks: a varlen kernel does not, and skips building them
    reference_fields: bool = True
    note: str = ""  # why not a kernel, where one was looked for


def reference(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta) -> Tensor:
    """The torch reference: ``decode`` over the decode rows and ``chunks`` over the chunks' rows."""
    parts = []
    row = meta.n_decode
    if meta.decode_slots is not None and meta.decode_mask is not None:
        parts.append(decode(q[:row], k_cache, v_cache, meta.decode_slots, meta.decode_mask))
    if meta.chunk_slots is not None and meta.chunk_dst is not None:
        parts.append(
            chunks(q[row:], k_cache, v_cache, meta.chunk_slots, meta.chunk_mask, meta.chunk_dst, meta.chunk_width)
        )
    return parts[0] if len(parts) == 1 else torch.cat(parts)


REFERENCE = Kernel("torch-reference", reference, calls_per_layer=2)


def paged_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMeta, kernel: Kernel = REFERENCE
) -> Tensor:
    """The whole step's attention, one call per layer: q [N, H, D] (decode rows, then the chunks'
    rows) over the cache [S, K, D], each row seeing its sequence's keys up to its position -> [N, H*D]."""
    return kernel.run(q, k_cache, v_cache, meta)


def step_meta(
    plan: StepPlan, staged: list[Tensor], block_size: int, dtype: torch.dtype, group: int, kernel: Kernel
) -> AttentionMeta:
    """The step's ``AttentionMeta`` from its ``index_lists`` on the device (``staged[:5]``), then
    its ``varlen_lists`` (``staged[5:9]``) where ``kernel`` reads them.

    A fixed number of device ops whatever the number of sequences, none reading a value back.
    """
    _, pos_rows, decode_tables, chunk_tables, dst = staged[:5]
    bs = block_size
    decode_slots = d_mask = chunk_slots = c_mask = chunk_dst = None
    b = plan.n_decode
    if b and kernel.reference_fields:
        length = plan.max_len
        decode_slots = key_slots(decode_tables.view(b, -1), bs, length)
        d_mask = decode_mask(pos_rows[:b], length, dtype)
    if plan.chunks and kernel.reference_fields:
        c, width, length = len(plan.chunks), plan.chunk_width, plan.chunk_span
        chunk_slots = key_slots(chunk_tables.view(c, -1), bs, length)
        if any(ch.start for ch in plan.chunks):  # else causal: no mask
            q_pos = pos_rows.new_zeros(c * width).index_copy_(0, dst, pos_rows[b:])
            c_mask = chunks_mask(q_pos.view(c, width), group, length, dtype)
        chunk_dst = dst
    meta = AttentionMeta(b, plan.chunk_width, decode_slots, d_mask, chunk_slots, c_mask, chunk_dst)
    if not kernel.varlen:
        return meta
    cu_q, k_lens, cu_k, tables = staged[5:9]
    n_seqs = k_lens.shape[0]
    max_k = max(plan.max_len, plan.chunk_span)
    i32 = torch.int32  # FlashAttention's index type
    varlen: dict[str, Any] = {
        "max_q": max(plan.chunk_width, 1 if b else 0),
        "max_k": max_k,
        "cu_seqlens_q": cu_q.to(i32),
        "seqlens_k": k_lens.to(i32),
        "block_table": tables.view(n_seqs, -1).to(i32),
    }
    if kernel.packed_keys:
        varlen["cu_seqlens_k"] = cu_k.to(i32)
        varlen["key_slots"] = packed_key_slots(tables.view(n_seqs, -1), k_lens, cu_k, bs, plan)
    return replace(meta, **varlen)


def packed_key_slots(tables: Tensor, k_lens: Tensor, cu_k: Tensor, block_size: int, plan: StepPlan) -> Tensor:
    """The cache slot of every key of every sequence, laid end to end: [sum of k_lens]. The total
    comes from the plan (the host), so no device value is read back."""
    total = sum(p + 1 for p in plan.decode_positions) + sum(c.end for c in plan.chunks)
    dev = tables.device
    seq = torch.repeat_interleave(torch.arange(k_lens.shape[0], device=dev), k_lens, output_size=total)
    offset = torch.arange(total, device=dev) - cu_k[:-1].index_select(0, seq)
    return tables[seq, torch.div(offset, block_size, rounding_mode="floor")] * block_size + offset % block_size
