"""An experiment's comparison as text: the figures table, the IPC budget and the verdicts,
as ``bench run``, ``bench calibrate`` and ``bench sweep`` print them."""

from __future__ import annotations

import math

from harness.analysis import table as text_table
from harness.analysis.compare import Arm, Comparison, compare, figures_table, median_cell, verdict_lines
from harness.analysis.figures import CODEC_FIGURES, IPC_FIGURES, LATENCY_FIGURES, SHOWN_FIGURES


def judge_arms(arm_list: list[Arm], margin_pct: float) -> tuple[Comparison | None, Comparison]:
    """The verdicts among the measured arms (None with fewer than two), and the table of every arm,
    unmeasured ones included, that the compare document holds."""
    measured = [a for a in arm_list if a.measured]
    comparison = compare(measured, margin_pct=margin_pct) if len(measured) >= 2 else None
    full = Comparison(arm_list, comparison.figures if comparison else [*LATENCY_FIGURES, *CODEC_FIGURES])
    if comparison is not None:
        full.cells, full.margin_pct = comparison.cells, comparison.margin_pct
    return comparison, full


ONLY_WHEN_MEASURED = ("mm_store_hit_pct",)


def _measured(arm_list: list[Arm], key: str) -> bool:
    return any(math.isfinite(v) for a in arm_list for v in a.values(key))


def ipc_lines(arm_list: list[Arm]) -> list[str]:
    """The IPC budget table; nothing when no run had request timelines."""
    if not _measured(arm_list, "ipc_ipc_mean_us"):
        return []
    # The store's hit rate only where some arm ran a store (--transport shm-store).
    figures = [f for f in IPC_FIGURES if f.key not in ONLY_WHEN_MEASURED or _measured(arm_list, f.key)]
    table = text_table.format_table(
        ["arm", *(f.label for f in figures)],
        [[a.label, *(median_cell(a, f.key) for f in figures)] for a in arm_list if a.measured],
    )
    note = (
        "IPC budget, µs: p50 over each run's requests (first-token path), median over rounds; "
        "wire = send → receive; IPC mean = the sum on a request's path to its first token"
    )
    return ["", *table, note]


def format_comparison(arm_list: list[Arm], comparison: Comparison | None) -> str:
    """The side-by-side table of every arm, failures named, the IPC budget, then the verdicts."""
    lines = ["", "=" * 20 + " Codec comparison " + "=" * 20]
    if comparison is None:  # one arm: nothing to judge, the figures alone
        lines += figures_table(Comparison(arm_list, [*LATENCY_FIGURES, *CODEC_FIGURES]), SHOWN_FIGURES)
    else:
        lines += figures_table(comparison, SHOWN_FIGURES)
    for arm in arm_list:
        failed = [r for r in arm.runs if r.status in ("error", "unsupported")]
        if failed and not arm.measured:
            lines.append(f"{arm.label}: {failed[0].status}: {failed[0].message}")
    lines.append(
        "times in ms unless marked µs; µs columns are codec time per message measured in the server's processes; "
        "median over rounds ± half the range"
    )
    lines += ipc_lines(arm_list)
    if comparison is not None and comparison.cells:
        lines += ["", *verdict_lines(comparison)]
    return "\n".join(lines)
