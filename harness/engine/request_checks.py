"""What the engine checks on every request it decodes, before the scheduler takes it.

The frontend checks the same bounds first; the engine checks again because a peer that skips the
frontend (another build, a buggy or compromised one) must get an error for its request, not slow
the others down. The per-request bounds are defined once, in ``harness.wire.limits``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.engine.config import EngineConfig
from harness.engine.vision import check_mm_input
from harness.wire.limits import check_sampling_bounds
from harness.wire.messages import EngineCoreRequest, validate_sampling_params


def _id_range(ids: Sequence[int]) -> tuple[int, int]:
    """The smallest and largest token id, vectorised for an array (a list of non-ints raises TypeError)."""
    if isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "iu" or ids.ndim != 1:
            raise ValueError(f"prompt token ids must be a 1-d integer array, got {ids.dtype} {ids.shape}")
        return int(ids.min()), int(ids.max())
    return min(ids), max(ids)


def check_request(req: EngineCoreRequest, cfg: EngineConfig, kv_capacity: int) -> int:
    """The request's max_tokens once every field is within the engine's bounds; ValueError otherwise."""
    sp = req.sampling_params
    n = len(req.prompt_token_ids)
    if n == 0:
        raise ValueError("the prompt is empty: at least one prompt token is required")
    if n >= cfg.max_model_len:
        raise ValueError(f"prompt of {n} tokens leaves no room to generate within max_model_len {cfg.max_model_len}")
    max_tokens = sp.max_tokens if sp.max_tokens is not None else cfg.max_model_len - n
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if n + max_tokens > cfg.max_model_len:
        raise ValueError(
            f"prompt of {n} tokens + max_tokens {max_tokens} = {n + max_tokens} exceeds "
            f"max_model_len {cfg.max_model_len}"
        )
    if n + max_tokens > kv_capacity:
        raise ValueError(
            f"prompt of {n} tokens + max_tokens {max_tokens} = {n + max_tokens} can never fit "
            f"in the KV cache of {kv_capacity} tokens"
        )
    lo, hi = _id_range(req.prompt_token_ids)
    if lo < 0 or hi >= cfg.vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"prompt token id {bad} outside the vocabulary [0, {cfg.vocab_size})")
    if sp.min_tokens < 0 or sp.min_tokens > max_tokens:
        raise ValueError(f"min_tokens must be in [0, max_tokens={max_tokens}], got {sp.min_tokens}")
    check_sampling_bounds(sp, cfg.request_limits)  # lengths first: validation walks the lists
    validate_sampling_params(sp)
    check_mm(req, cfg, n)
    return max_tokens


def check_mm(req: EngineCoreRequest, cfg: EngineConfig, prompt_len: int) -> None:
    """Images and their placeholder ranges: as many, each image_tokens long, inside the prompt, apart."""
    items = req.mm_inputs or []
    ranges = req.mm_placeholders or []
    if len(items) != len(ranges):
        raise ValueError(f"{len(items)} multimodal inputs but {len(ranges)} placeholder ranges")
    if len(ranges) * cfg.image_tokens > prompt_len:  # before they are sorted and walked
        raise ValueError(f"{len(ranges)} images of {cfg.image_tokens} tokens do not fit a {prompt_len}-token prompt")
    prev_end = 0
    for item, pr in sorted(zip(items, ranges, strict=True), key=lambda pair: pair[1].offset):
        if pr.length != cfg.image_tokens:
            raise ValueError(f"placeholder length {pr.length} != image_tokens {cfg.image_tokens}")
        if pr.offset < prev_end or pr.offset + pr.length > prompt_len:
            raise ValueError(
                f"placeholder [{pr.offset}, {pr.offset + pr.length}) overlaps another or lies "
                f"outside the prompt of {prompt_len} tokens"
            )
        prev_end = pr.offset + pr.length
        check_mm_input(item)
