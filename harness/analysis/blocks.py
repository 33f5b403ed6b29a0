"""Blocks of requests as the unit of a sequential comparison (``--until-resolved``).

In blocks (``--block-size N``) the arms take turns N requests at a time, and block b of every arm
holds the same N prompts, sent within seconds of each other: a pair of blocks is a paired
measurement, many of them per round. Each block's figure is the mean over its requests (a block
with a failed request has none); two arms pair on the (round, block) both measured, in the order
they ran, as a sequential test needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.analysis.documents import as_float

# The figures measured per block: the primary, and the codec alone and with the wire on the first-token
# path, each a key of run_figures and the field of a request's record it is the block's mean of.
BLOCK_FIGURES = {
    "mean_ttft_ms": "ttft",
    "first_token_path_us": "codec_us",
    "first_token_codec_wire_us": "codec_wire_us",
}
SECONDS_TO_MS = {"ttft": 1000.0}


def _block_size(doc: dict[str, Any]) -> int:
    flags = (doc.get("metadata") or {}).get("flags") or {}
    size = flags.get("block_size")
    return size if isinstance(size, int) and size > 0 else 0


def block_values(doc: dict[str, Any]) -> dict[str, list[float]] | None:
    """Per figure of ``BLOCK_FIGURES``, each block's mean in workload order (NaN for a block with a
    failed request or without the figure); None for a run not made in blocks or without records."""
    size = _block_size(doc)
    records = [r for r in doc.get("records") or () if isinstance(r, dict) and isinstance(r.get("index"), int)]
    if not size or not records:
        return None
    blocks: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        blocks.setdefault(record["index"] // size, []).append(record)
    out: dict[str, list[float]] = {key: [] for key in BLOCK_FIGURES}
    for b in range(max(blocks) + 1):
        members = blocks.get(b, [])
        whole = bool(members) and all(r.get("success") for r in members)
        for key, field in BLOCK_FIGURES.items():
            scale = SECONDS_TO_MS.get(field, 1.0)
            out[key].append(_mean([as_float(r.get(field)) * scale for r in members]) if whole else math.nan)
    return {key: values for key, values in out.items() if any(math.isfinite(v) for v in values)}


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values and all(math.isfinite(v) for v in values) else math.nan


def paired_log_diffs(
    reference: Sequence[tuple[int | None, dict[str, list[float]] | None]],
    candidate: Sequence[tuple[int | None, dict[str, list[float]] | None]],
    key: str,
) -> list[float]:
    """ln(candidate / reference) per block both measured, round by round then block by block.
    Each side is its runs as (round, block values); runs without a round or blocks are left out."""
    ref = {rnd: blocks[key] for rnd, blocks in reference if rnd is not None and blocks and key in blocks}
    diffs: list[float] = []
    for rnd, blocks in sorted(((r, b) for r, b in candidate if r is not None and b), key=lambda rb: rb[0]):
        if rnd not in ref or key not in blocks:
            continue
        for a, b in zip(ref[rnd], blocks[key]):  # runs of unequal length pair as far as both went
            if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0:
                diffs.append(math.log(b / a))
    return diffs
