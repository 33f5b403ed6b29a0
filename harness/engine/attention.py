"""The model's attention over the paged KV cache, through torch's ``scaled_dot_product_attention``
(SDPA), and the kernel torch picks for each call.

A step attends in at most two calls per layer, whatever the number of sequences
(``harness.engine.model.Attention`` makes them):

- ``decode``: every decode row at once, each over its own keys gathered from the
  cache through its block table (ragged lengths through one mask);
- ``chunks``: every prefill chunk at once (varlen): queries padded to the longest
  chunk, keys gathered through each chunk's block table, one causal mask offset
  by each chunk's start (a chunk after a cached prefix sees the prefix).

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


def key_slots(tables: Tensor, block_size: int, length: int) -> Tensor:
    """Cache slots of positions [0, length) of each sequence: tables [n, nb] -> [n, length]."""
    n, nb = tables.shape
    offsets = torch.arange(block_size, device=tables.device)
    return (tables[:, :, None] * block_size + offsets).reshape(n, nb * block_size)[:, :length]


def decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, mask: Tensor) -> Tensor:
    """One new token per sequence: q [B, H, D] over the cache [S, K, D] at ``slots`` [B, L],
    mask [B, 1, 1, L] -> [B, H*D]. GQA without repeating K/V: each kv head's G query heads
    are its query rows."""
    b, h, d = q.shape
    n_kv = k_cache.shape[1]
    keys, values = k_cache[slots].transpose(1, 2), v_cache[slots].transpose(1, 2)  # [B, K, L, D]
    out = F.scaled_dot_product_attention(q.view(b, n_kv, h // n_kv, d), keys, values, attn_mask=mask)
    return out.reshape(b, h * d)  # [B, K, G, D] -> [B, H*D]


def chunks(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, mask: Tensor, dst: Tensor, width: int) -> Tensor:
    """Every prefill chunk at once: q [Nc, H, D] (the chunks' rows, concatenated) over the cache
    [S, K, D] at ``slots`` [C, L], mask [C, 1, G*T, L]; ``dst`` [Nc] is each row's place among the
    C x T padded queries (T = ``width``) -> [Nc, H*D].

    GQA without repeating K/V: each kv head's G query heads fold into the query length, row
    g*T + t of chunk c being its query t of head g.
    """
    _, h, d = q.shape
    c, n_kv = slots.shape[0], k_cache.shape[1]
    g = h // n_kv
    padded = q.new_zeros(c * width, h, d).index_copy_(0, dst, q)
    qf = padded.view(c, width, n_kv, g, d).permute(0, 2, 3, 1, 4).reshape(c, n_kv, g * width, d)
    keys, values = k_cache[slots].transpose(1, 2), v_cache[slots].transpose(1, 2)  # [C, K, L, D]
    out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=mask)  # [C, K, G*T, D]
    out = out.view(c, n_kv, g, width, d).permute(0, 3, 1, 2, 4).reshape(c * width, h * d)
    return out.index_select(0, dst)


def decode_mask(positions: Tensor, length: int) -> Tensor:
    """``decode``'s mask [B, 1, 1, length]: row b sees keys [0, positions[b]]."""
    return (torch.arange(length, device=positions.device)[None, :] <= positions[:, None])[:, None, None, :]


def chunks_mask(q_pos: Tensor, group: int, length: int) -> Tensor:
    """``chunks``' mask [C, 1, G*T, length] from the padded queries' positions q_pos [C, T]: query t
    sees keys j <= its position (a padding query, at position 0, sees key 0 and is dropped)."""
    c, t = q_pos.shape
    seen = torch.arange(length, device=q_pos.device)[None, None, :] <= q_pos[:, :, None]  # [C, T, L]
    return seen[:, None].expand(c, group, t, length).reshape(c, 1, group * t, length)


def sdpa_backends(k_cache: Tensor, n_heads: int) -> dict[str, str]:
    """The SDPA kernel torch picks for each call above, on the device and dtype of ``k_cache`` [S, K, D].

    ``prefill`` and ``prefill_cached``: ``chunks`` (one call serves both now); ``decode``: ``decode``.
    'math' on CUDA means the slow fallback that materializes the scores.
    """
    try:
        from torch.nn.attention import SDPBackend

        choose = torch._fused_sdp_choice
    except (ImportError, AttributeError):
        return {"prefill": "unknown", "prefill_cached": "unknown", "decode": "unknown"}
    _, k, d = k_cache.shape
    dev, dt = k_cache.device, k_cache.dtype
    g, t, n_len, n = n_heads // k, 16, 32, 4

    def name(*args: Any, **kwargs: Any) -> str:
        try:
            return SDPBackend(choose(*args, **kwargs)).name.lower()
        except Exception:  # a private API: never fail the engine over a report
            return "unknown"

    keys = torch.zeros(n, k, n_len, d, device=dev, dtype=dt)
    qf = torch.zeros(n, k, g * t, d, device=dev, dtype=dt)
    mask = torch.ones(n, 1, g * t, n_len, device=dev, dtype=torch.bool)
    prefill = name(qf, keys, keys, mask, 0.0, False)
    qd = torch.zeros(n, k, g, d, device=dev, dtype=dt)
    mask = torch.ones(n, 1, 1, n_len, device=dev, dtype=torch.bool)
    decoded = name(qd, keys, keys, mask, 0.0, False)
    return {"prefill": prefill, "prefill_cached": prefill, "decode": decoded}
