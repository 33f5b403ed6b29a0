"""The model's attention calls, through torch's ``scaled_dot_product_attention`` (SDPA), and the kernel
torch picks for each.

A step attends in up to three shapes (``harness.engine.model.Attention`` chooses):

- ``decode``: the decode rows attend together over a view of the cache's first
  slots (ragged lengths through one mask, no gather of the cache);
- ``fresh_chunk``: a prefill chunk that starts at position 0 attends to itself
  with ``is_causal=True`` and no mask, which keeps the flash kernel eligible;
- ``cached_chunk``: a chunk that continues a cached prefix attends to the cache
  with a causal mask offset by its start (the efficient kernel takes masks).

``sdpa_backends`` asks torch which kernel each of them gets; it builds the same
shapes as the calls, which is why both live here.

Shape legend: T tokens of a chunk, B decode rows, H query heads, K kv heads,
G = H // K query heads per kv head, D head dim, L keys, S slots.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.engine.step_plan import Chunk

# enable_gqa (torch >= 2.5) lets SDPA read K/V heads shared by G query heads
# without copying them G times.
SDPA_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2] if p.isdigit()) >= (2, 5)


def fresh_chunk(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal self-attention of a chunk from position 0 on its own K/V: q [T, H, D], k/v [T, K, D] -> [T, H*D]."""
    t, group = q.shape[0], q.shape[1] // k.shape[1]
    qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if SDPA_GQA:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=group > 1)
    else:
        if group > 1:
            kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    return out[0].transpose(0, 1).reshape(t, -1)


def cached_chunk(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """A chunk after a cached prefix: q [T, H, D] over its slot's keys/values [K, L, D], mask [G*T, L] -> [T, H*D].

    GQA without repeating K/V: each kv head's G query heads fold into the query
    length, q -> [K, G*T, D] where row g*T + i is query i of head g.
    """
    t, h, d = q.shape
    n_kv = keys.shape[0]
    group = h // n_kv
    qf = q.reshape(t, n_kv, group, d).permute(1, 2, 0, 3).reshape(n_kv, group * t, d)
    out = F.scaled_dot_product_attention(qf[None], keys[None], values[None], attn_mask=mask)[0]
    return out.view(n_kv, group, t, d).permute(2, 0, 1, 3).reshape(t, -1)  # [K, G*T, D] -> [T, H*D]


def decode(q: Tensor, keys: Tensor, values: Tensor, slots: Tensor, mask: Tensor | None) -> Tensor:
    """One new token per sequence: q [B, H, D] of the sequences in ``slots`` [B] over keys/values
    [S, K, L, D] (a view of the cache's first S slots), mask [S, 1, 1, L] -> [B, H*D].

    Rows of slots not in the batch get a dummy query (their mask shows them one key) and are
    dropped afterwards: cheaper than gathering the batch's slots out of the cache.
    """
    b, h, d = q.shape
    n_slots, n_kv = keys.shape[0], keys.shape[1]
    q_all = q.new_zeros(n_slots, n_kv, h // n_kv, d)
    q_all[slots] = q.reshape(b, n_kv, h // n_kv, d)
    out = F.scaled_dot_product_attention(q_all, keys, values, attn_mask=mask)
    return out[slots].reshape(b, -1)  # [S, K, G, D] -> [B, H*D]


def decode_mask(lengths: Tensor, max_len: int) -> Tensor:
    """``decode``'s mask [S, 1, 1, max_len]: slot s's query sees its first ``lengths[s]`` keys."""
    return (torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None])[:, None, None, :]


def cached_chunk_mask(chunk: Chunk, group: int, device: torch.device) -> Tensor:
    """``cached_chunk``'s mask [G*T, end]: query i (position start+i) sees keys j <= start+i, its
    rows repeated per folded head (row g*T + i, as ``cached_chunk`` folds the queries)."""
    q_pos = torch.arange(chunk.start, chunk.end, device=device)
    return (torch.arange(chunk.end, device=device)[None, :] <= q_pos[:, None]).repeat(group, 1)


def sdpa_backends(k_cache: Tensor, n_heads: int) -> dict[str, str]:
    """The SDPA kernel torch picks for each call above, on the device and dtype of ``k_cache``
    [max_num_seqs, K, max_model_len, D] (views of it, as the real calls take).

    ``prefill``: ``fresh_chunk``; ``prefill_cached``: ``cached_chunk``; ``decode``: ``decode``.
    'math' on CUDA means the slow fallback that materializes the scores.
    """
    try:
        from torch.nn.attention import SDPBackend

        choose = torch._fused_sdp_choice
    except (ImportError, AttributeError):
        return {"prefill": "unknown", "prefill_cached": "unknown", "decode": "unknown"}
    max_num_seqs, k, max_model_len, d = k_cache.shape
    dev, dt = k_cache.device, k_cache.dtype
    g, t = n_heads // k, 16
    n_len = min(2 * t, max_model_len)
    n_slots = min(4, max_num_seqs)

    def name(*args: Any, **kwargs: Any) -> str:
        try:
            return SDPBackend(choose(*args, **kwargs)).name.lower()
        except Exception:  # a private API: never fail the engine over a report
            return "unknown"

    q = torch.zeros(1, n_heads, t, d, device=dev, dtype=dt)
    kv = torch.zeros(1, k, t, d, device=dev, dtype=dt)
    gqa = {"enable_gqa": g > 1} if SDPA_GQA else {}
    if not SDPA_GQA:
        kv = kv.repeat_interleave(g, dim=1)
    prefill = name(q, kv, kv, None, 0.0, True, **gqa)
    qf = torch.zeros(1, k, g * t, d, device=dev, dtype=dt)
    keys = k_cache[0, :, :n_len][None]
    mask = torch.ones(g * t, n_len, device=dev, dtype=torch.bool)
    cached = name(qf, keys, keys, mask, 0.0, False)
    qd = torch.zeros(n_slots, k, g, d, device=dev, dtype=dt)
    keys = k_cache[:n_slots, :, :n_len]
    mask = torch.ones(n_slots, 1, 1, n_len, device=dev, dtype=torch.bool)
    decoded = name(qd, keys, keys, mask, 0.0, False)
    return {"prefill": prefill, "prefill_cached": cached, "decode": decoded}
