"""Blocks of requests, and the rounds they make up, as the data of a sequential comparison
(``--until-resolved``).

In blocks (``--block-size N``) the arms take turns N requests at a time, and block b of every arm
holds the same N prompts, sent within seconds of each other: a pair of blocks is a paired
measurement, many of them per round. Each block's figure is the mean over its requests, or for the
codec + wire of each output step the mean over the output batches its server encoded within the
block's time (batches are shared by requests, so they are placed by time when the run is made:
``harness.loadgen.ipc``); a block with a failed request has none. Two arms pair on the (round,
block) both measured.

The blocks of one round are not independent: they share that round's servers and its minutes of the
machine, so a round's offset moves all of them together (an intra-round correlation of 0.02-0.06 in
recorded A/A runs). A test that took each block pair as independent would call differences too
easily. The unit of the test is therefore the round: the mean of its block differences
(``round_means``); rounds start their own servers. ``intra_round_correlation`` measures the clustering
a run showed, reported beside its verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.analysis.documents import as_float
from harness.loadgen.ipc import STEP_BLOCK_FIGURE

# The figures measured per block: the primary, and the codec alone and with the wire on the first-token
# path, each a key of run_figures and the field of a request's record it is the block's mean of.
BLOCK_FIGURES = {
    "mean_ttft_ms": "ttft",
    "first_token_path_us": "codec_us",
    "first_token_codec_wire_us": "codec_wire_us",
}
SECONDS_TO_MS = {"ttft": 1000.0}
# The figures kept per block when the run was made, in the run document's ``ipc.blocks`` (one value a
# block sent, in order): the codec + wire of each output step. A file written before has none.
STORED_BLOCK_FIGURES = (STEP_BLOCK_FIGURE,)
# Every figure a sequential comparison can judge from block pairs.
ALL_BLOCK_FIGURES = (*BLOCK_FIGURES, *STORED_BLOCK_FIGURES)


def _block_size(doc: dict[str, Any]) -> int:
    flags = (doc.get("metadata") or {}).get("flags") or {}
    size = flags.get("block_size")
    return size if isinstance(size, int) and size > 0 else 0


def block_values(doc: dict[str, Any]) -> dict[str, list[float]] | None:
    """Per figure of ``ALL_BLOCK_FIGURES`` the run has, each block's value in workload order (NaN for a
    block with a failed request or without the figure); None for a run not made in blocks or without
    records."""
    size = _block_size(doc)
    records = [r for r in doc.get("records") or () if isinstance(r, dict) and isinstance(r.get("index"), int)]
    if not size or not records:
        return None
    blocks: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        blocks.setdefault(record["index"] // size, []).append(record)
    whole = [bool(m) and all(r.get("success") for r in m) for m in (blocks.get(b, []) for b in range(max(blocks) + 1))]
    out: dict[str, list[float]] = {key: [] for key in BLOCK_FIGURES}
    for b, complete in enumerate(whole):
        for key, field in BLOCK_FIGURES.items():
            scale = SECONDS_TO_MS.get(field, 1.0)
            out[key].append(_mean([as_float(r.get(field)) * scale for r in blocks[b]]) if complete else math.nan)
    out.update(_stored_values(doc, whole))
    return {key: values for key, values in out.items() if any(math.isfinite(v) for v in values)}


def _stored_values(doc: dict[str, Any], whole: Sequence[bool]) -> dict[str, list[float]]:
    """The ``STORED_BLOCK_FIGURES`` the run kept, one value a block (NaN for a block with a failed
    request, or one it never sent); none from a file written before they were kept."""
    stored = (doc.get("ipc") or {}).get("blocks")
    out: dict[str, list[float]] = {}
    for key in STORED_BLOCK_FIGURES:
        values = stored.get(key) if isinstance(stored, dict) else None
        if isinstance(values, list):
            kept = [as_float(v) for v in values[: len(whole)]]
            kept += [math.nan] * (len(whole) - len(kept))
            out[key] = [v if complete else math.nan for v, complete in zip(kept, whole, strict=True)]
    return out


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values and all(math.isfinite(v) for v in values) else math.nan


def paired_log_diffs(
    reference: Sequence[tuple[int | None, dict[str, list[float]] | None]],
    candidate: Sequence[tuple[int | None, dict[str, list[float]] | None]],
    key: str,
) -> list[list[float]]:
    """ln(candidate / reference) per block both measured, one list a round both measured, in round order
    (blocks in the order they ran). Each side is its runs as (round, block values); runs without a round
    or blocks are left out, and so is a round with no block both measured."""
    ref = {rnd: blocks[key] for rnd, blocks in reference if rnd is not None and blocks and key in blocks}
    rounds: list[list[float]] = []
    for rnd, blocks in sorted(((r, b) for r, b in candidate if r is not None and b), key=lambda rb: rb[0]):
        if rnd not in ref or key not in blocks:
            continue
        diffs = [
            math.log(b / a)
            for a, b in zip(ref[rnd], blocks[key])  # runs of unequal length pair as far as both went
            if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0
        ]
        if diffs:
            rounds.append(diffs)
    return rounds


def round_means(rounds: Sequence[Sequence[float]]) -> list[float]:
    """One paired difference a round: the mean of its block differences, the sequential test's unit."""
    return [math.fsum(diffs) / len(diffs) for diffs in rounds if diffs]


def intra_round_correlation(rounds: Sequence[Sequence[float]]) -> float:
    """The share of the block differences' variance that lies between rounds (one-way ANOVA estimate of
    the intra-class correlation; rounds of unequal size allowed). NaN below two rounds or with no spread
    within them; it can come out below 0 when the rounds agree better than chance would have them."""
    groups = [list(g) for g in rounds if g]
    k, total = len(groups), sum(len(g) for g in groups)
    if k < 2 or total <= k:
        return math.nan
    grand = math.fsum(math.fsum(g) for g in groups) / total
    means = [math.fsum(g) / len(g) for g in groups]
    between = math.fsum(len(g) * (m - grand) ** 2 for g, m in zip(groups, means, strict=True)) / (k - 1)
    within = math.fsum((x - m) ** 2 for g, m in zip(groups, means, strict=True) for x in g) / (total - k)
    size = (total - math.fsum(len(g) ** 2 for g in groups) / total) / (k - 1)  # the rounds' typical size
    denominator = between + (size - 1) * within
    return (between - within) / denominator if denominator > 0 else math.nan
