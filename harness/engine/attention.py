"""The model's attention over the paged KV cache, through torch's ``scaled_dot_product_attention``
(SDPA), and the kernel torch picks for each call.

A step attends in at most two calls per layer, whatever the number of sequences
(``harness.engine.model.Attention`` makes them):

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
(blocks x block size).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

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
