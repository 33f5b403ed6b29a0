"""An experiment's comparison as text: the figures, the IPC budget and the verdicts, as ``bench run``,
``bench calibrate`` and ``bench sweep`` print them.

Figures are rows and arms are columns (as pyperf's ``compare_to --table``), so four arms fit a
100-column terminal however many figures there are; each row names its unit once.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import replace

from harness.analysis import table as text_table
from harness.analysis.figures import (
    CODEC_FIGURES,
    IPC_FIGURES,
    IPC_SPAN_FIGURES,
    LATENCY_FIGURES,
    SGLANG_HOP_FIGURES,
    SHOWN_FIGURES,
    Figure,
)
from harness.analysis.verdicts import Arm, Comparison, compare, median_cell, verdict_lines

WIDTH = text_table.WIDTH  # the widest line printed (a terminal's); a verdict longer than this wraps


def judge_arms(
    arm_list: list[Arm], margin_pct: float, *, sequential: bool | None = None
) -> tuple[Comparison | None, Comparison]:
    """The verdicts among the measured arms (None with fewer than two), and the table of every arm,
    unmeasured ones included, that the compare document holds."""
    measured = [a for a in arm_list if a.measured]
    comparison = compare(measured, margin_pct=margin_pct, sequential=sequential) if len(measured) >= 2 else None
    full = Comparison(arm_list, comparison.figures if comparison else [*LATENCY_FIGURES, *CODEC_FIGURES])
    if comparison is not None:
        full.cells, full.margin_pct, full.sequential = comparison.cells, comparison.margin_pct, comparison.sequential
    return comparison, full


# The IPC total and the spans it sums that a server may not expose (a real vLLM's queues).
IPC_TOTAL = "ipc_ipc_mean_us"
QUEUE_FIGURES = ("ipc_request_queue_p50_us", "ipc_output_queue_p50_us")
# Rows shown only where some arm has them: a codec adapter's time (vllm's; 0 for every other codec).
ONLY_WHEN_NONZERO = ("ipc_request_adapt_p50_us", "ipc_output_adapt_p50_us")


def _measured(arm_list: Sequence[Arm], key: str, nonzero: bool = False) -> bool:
    return any(math.isfinite(v) and (v != 0 or not nonzero) for a in arm_list for v in a.values(key))


def row_label(figure: Figure) -> str:
    """A figure's row: its long label and its unit, once (codec figures are per message)."""
    label = figure.long_label
    if figure in CODEC_FIGURES:
        return f"{label}, µs/message"
    if figure.unit in label.split() or figure.unit == "%" and "%" in label:
        return label
    return f"{label}, {figure.unit}"


def figure_rows(
    arm_list: Sequence[Arm], figures: Sequence[Figure], rounds: bool = True, always: Collection[str] = ()
) -> list[str]:
    """One row per figure some arm measured (or named in ``always``, then ``-`` where none did), one
    column per arm: median over rounds ± half the range. Arms that would make a line wider than WIDTH
    go on to a table of their own below, the rows repeated."""
    rows = [["rounds", *(str(len(a.measured)) for a in arm_list)]] if rounds else []
    for figure in figures:
        cells = [median_cell(a, figure.key) for a in arm_list]
        if all(c == "-" for c in cells) and figure.key not in always:
            continue
        if figure.key in ONLY_WHEN_NONZERO and not _measured(arm_list, figure.key, nonzero=True):
            continue
        rows.append([row_label(figure), *cells])
    headers = ["", *(a.label for a in arm_list)]
    widths = text_table.column_widths(headers, rows)
    lines: list[str] = []
    for group in _groups(widths[0], widths[1:]):
        columns = [0, *(1 + i for i in group)]
        lines += [""] if lines else []
        lines += text_table.format_table([headers[c] for c in columns], [[r[c] for c in columns] for r in rows])
    return lines


def _groups(label_width: int, widths: Sequence[int]) -> list[list[int]]:
    """The arms' column indices in runs that fit WIDTH beside the label column (at least one arm each)."""
    groups: list[list[int]] = [[]]
    used = label_width
    for i, w in enumerate(widths):
        if groups[-1] and used + 2 + w > WIDTH:
            groups.append([])
            used = label_width
        groups[-1].append(i)
        used += 2 + w
    return groups


def ipc_lines(arm_list: list[Arm]) -> list[str]:
    """The IPC budget, figures as rows; nothing when no run had request timelines. Every span has its
    row: one no arm's server exposes (a real vLLM's queues) shows ``-``, and the total says what it sums."""
    measured = [a for a in arm_list if a.measured]
    if not _measured(measured, "ipc_ipc_mean_us"):
        return []
    title = "IPC budget on the first-token path: p50 over a run's requests, median over rounds"
    notes = ["wire = send → receive; IPC mean = the sum of the spans on a request's way to its first token"]
    queues_seen = [_measured(measured, key) for key in QUEUE_FIGURES]
    if not all(queues_seen):
        notes.append("engine in-queue, out queue: - where the server does not expose them")
    if _measured(measured, SGLANG_HOP_FIGURES[0].key):
        notes.append(
            "SGLang: out = scheduler → detokenizer, ret = detokenizer → tokenizer; its scheduler takes "
            "requests between steps: in-queue = sent → taken (the socket's time inside), req wire -"
        )
    figures = [ipc_total(queues_seen) if f.key == IPC_TOTAL else f for f in IPC_FIGURES]
    spans = {f.key for f in IPC_SPAN_FIGURES}
    return ["", title, *figure_rows(measured, figures, rounds=False, always=spans), *notes]


def ipc_total(queues_seen: Sequence[bool]) -> Figure:
    """The IPC total's figure, labelled by what it sums: the queues only where the server exposed them."""
    total = next(f for f in IPC_FIGURES if f.key == IPC_TOTAL)
    if all(queues_seen):
        return total
    sums = "codec + wire + queues where seen" if any(queues_seen) else "codec + wire"
    return replace(total, detail=f"IPC mean: {sums}")


def _wrapped(lines: Sequence[str]) -> list[str]:
    """Each line within WIDTH, its continuation indented under its start."""
    return text_table.wrapped(lines, WIDTH)


def format_comparison(arm_list: list[Arm], comparison: Comparison | None) -> str:
    """The figures of every arm side by side, failures named, the IPC budget, then the verdicts."""
    lines = ["", "=" * 20 + " Codec comparison " + "=" * 20]
    figures = [*LATENCY_FIGURES, *CODEC_FIGURES] if comparison is None else list(comparison.figures)
    figures += [f for f in SHOWN_FIGURES if f.key not in {g.key for g in figures}]
    lines += figure_rows(arm_list, figures)
    for arm in arm_list:
        failed = [r for r in arm.runs if r.status in ("error", "unsupported")]
        if failed and not arm.measured:
            lines += _wrapped([f"{arm.label}: {failed[0].status}: {failed[0].message}"])
    lines.append("median over rounds ± half the range; codec µs measured in the server's processes")
    lines += ipc_lines(arm_list)
    if comparison is not None and comparison.cells:
        lines += ["", *_wrapped(verdict_lines(comparison))]
    return "\n".join(lines)
