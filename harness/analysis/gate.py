"""The CI gate: did the head build (or codec) regress against the base, measured in the same job?

    bench run --arm base='--python ../base/.venv/bin/python' --arm head='--python .venv/bin/python' ...
    bench compare results/compare-*.json --gate [--primary mean_ttft_ms] [--threshold-pct 5]

Latency is judged only between arms interleaved in one job: each arm against
the first (the base), per-round log ratios paired on the rounds both ran, so
whatever the shared machine does lands on both alike. A latency baseline from
another session is not judged: session-to-session swings read as regressions
(the committed A/A pair ``aa-sequential-1``/``-2`` gave 9 false REGRESSIONs
that way). Deterministic figures (instruction counts) are what a committed
baseline gates: ``bench micro --count instructions --baseline``.

The verdicts are ``harness.analysis.verdicts``'s, with gatekeeping: the primary
figure (TTFT mean by default) of every arm is tested first (Holm across the
arms), and only it decides. A regression is a "slower" verdict on it whose
estimated change exceeds ``--threshold-pct``. The other figures are tested once
an arm's primary is resolved and are listed, failing nothing (their error rate
is the gatekeeping's, not the gate's).

Exit status:
  0  pass: the primary figure of every arm rules out a regression above the threshold
  1  regression
  2  unusable or incomparable input: an unreadable file, fewer than two arms, a primary
     figure not measured, arms that did not run interleaved, or arms whose runs differ in
     the settings that shape latency (each named, ``harness.analysis.like_for_like``)
  3  the gate cannot say: the primary too noisy to rule out a regression above the
     threshold, too few rounds, an arm with no clean run, or runs left out because they
     had failed requests or were interrupted
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.analysis import stats
from harness.analysis import table as text_table
from harness.analysis.documents import ResultsError, jsonable
from harness.analysis.verdicts import (
    DEFAULT_PRIMARY,
    Arm,
    Comparison,
    VerdictCell,
    common_rounds,
    compare,
    median_cell,
    method_line,
    verdict_dict,
)

EXIT_PASS, EXIT_REGRESSION, EXIT_UNUSABLE, EXIT_NOISY = 0, 1, 2, 3
REGRESSION, NOISY, OK, MISSING = "REGRESSION", "noisy", "ok", "missing"

CROSS_SESSION = (
    "a latency baseline from another session is not judged: session-to-session swings of a shared "
    "machine read as regressions (the committed A/A pair results/baselines/aa-sequential-1.json and "
    "-2.json gave 9 false REGRESSIONs that way). Run base and head as two arms of one job "
    "(bench run --arm base='--python ../base/.venv/bin/python' --arm head=...) and gate that file: "
    "bench compare FILE --gate. A committed baseline gates instruction counts: "
    "bench micro --count instructions --baseline FILE"
)


@dataclass
class ArmOutcome:
    """One arm against the base: its primary verdict's outcome and the secondary figures it reports."""

    arm: str
    primary: VerdictCell | None
    secondary: list[VerdictCell]
    outcome: str
    excluded: int  # runs left out of the verdicts (failed requests, interrupted)


@dataclass
class GateResult:
    base: str
    comparison: Comparison
    arms: list[ArmOutcome]
    threshold_pct: float

    @property
    def regressions(self) -> list[ArmOutcome]:
        return [a for a in self.arms if a.outcome == REGRESSION]

    @property
    def undecided(self) -> list[ArmOutcome]:
        return [a for a in self.arms if a.outcome in (NOISY, MISSING)]

    @property
    def excluded(self) -> dict[str, int]:
        return dict(self.comparison.excluded)

    def exit_code(self) -> int:
        if self.regressions:
            return EXIT_REGRESSION
        return EXIT_NOISY if self.undecided or self.excluded else EXIT_PASS


def run_gate(
    arms: Sequence[Arm],
    *,
    threshold_pct: float = 5.0,
    primary: str = DEFAULT_PRIMARY,
    margin_pct: float = stats.DEFAULT_MARGIN_PCT,
    alpha: float = stats.ALPHA,
) -> GateResult:
    """Judge every arm after the first against it; ResultsError when the arms cannot be gated."""
    if len(arms) < 2:
        raise ResultsError(f"the gate needs two arms (base, then head); got {len(arms)}")
    base = arms[0]
    if not base.judged().runs:
        raise ResultsError(f"the base arm {base.label!r} has no clean run to compare with")
    for arm in arms[1:]:
        if arm.judged().runs and common_rounds(base.judged(), arm.judged()) is None:
            raise ResultsError(
                f"{arm.label} and {base.label} share no round: the gate judges arms interleaved in one job. "
                + CROSS_SESSION
            )
    try:
        comparison = compare(arms, paired=None, primary=primary, margin_pct=margin_pct, alpha=alpha)
    except ValueError as exc:
        raise ResultsError(str(exc)) from None
    outcomes = []
    for arm in arms[1:]:
        cells = [c for c in comparison.cells if c.arm == arm.label]
        first = next((c for c in cells if c.role == "primary"), None)
        outcome = MISSING if first is None or not arm.judged().runs else _outcome(first, threshold_pct)
        outcomes.append(
            ArmOutcome(
                arm.label,
                first,
                [c for c in cells if c.role != "primary"],
                outcome,
                comparison.excluded.get(arm.label, 0),
            )
        )
    return GateResult(base.label, comparison, outcomes, threshold_pct)


def _worse_pct(cell: VerdictCell, pct: float) -> float:
    """A change in % read in the figure's bad direction (a latency up, a throughput down)."""
    return -pct if cell.figure.higher_is_better else pct


def _outcome(cell: VerdictCell, threshold_pct: float) -> str:
    v = cell.verdict
    if v.verdict == "slower":
        return REGRESSION if _worse_pct(cell, v.change_pct) > threshold_pct else OK
    if v.verdict in ("faster", "equivalent"):
        return OK
    if v.verdict == "inconclusive":
        reach = _worse_pct(cell, v.ci_low_pct if cell.figure.higher_is_better else v.ci_high_pct)
        return NOISY if not math.isfinite(reach) or reach > threshold_pct else OK
    return NOISY  # too few rounds, not comparable


def secondary_regressions(result: GateResult) -> list[VerdictCell]:
    """Secondary figures found slower beyond the threshold: reported, failing nothing."""
    return [
        c
        for a in result.arms
        for c in a.secondary
        if c.verdict.verdict == "slower" and _worse_pct(c, c.verdict.change_pct) > result.threshold_pct
    ]


# --- output ----------------------------------------------------------------------------------

HEADERS = ["arm", "primary figure", "base", "arm's", "verdict (arm vs base)", "gate"]


def _cells(result: GateResult, a: ArmOutcome) -> list[str]:
    arm = next(x for x in result.comparison.arms if x.label == a.arm)
    base = result.comparison.reference
    key = result.comparison.primary.key if result.comparison.primary else ""
    label = result.comparison.primary.label if result.comparison.primary else "-"
    verdict = a.primary.verdict.text if a.primary else "-"
    return [a.arm, label, median_cell(base, key), median_cell(arm, key), verdict, a.outcome]


def summary(result: GateResult) -> str:
    head = f"gate: {len(result.arms)} arm(s) against {result.base}, threshold {result.threshold_pct:g}%: "
    if result.regressions:
        return head + "REGRESSION: " + ", ".join(a.arm for a in result.regressions)
    parts = []
    if result.undecided:
        parts.append(
            "cannot rule out a regression for "
            + ", ".join(f"{a.arm} ({a.outcome})" for a in result.undecided)
            + " (a new run with more rounds would decide; see the verdict)"
        )
    if result.excluded:
        parts.append(
            "runs with failed requests or interrupted were left out: "
            + ", ".join(f"{label} {n}" for label, n in result.excluded.items())
        )
    return head + ("; ".join(parts) if parts else "pass")


def format_text(result: GateResult, wide: bool = False) -> str:
    """The gate as text: within ``table.WIDTH`` columns, each arm's verdict on a line of its own under
    the table; ``wide``: the verdict a column of the table and no line wrapped."""
    rows = [_cells(result, a) for a in result.arms]
    if wide:
        lines = text_table.format_table(HEADERS, rows, left=5)
    else:
        verdict = HEADERS.index("verdict (arm vs base)")
        narrow = [h for i, h in enumerate(HEADERS) if i != verdict]
        lines = text_table.format_table(narrow, [[c for i, c in enumerate(r) if i != verdict] for r in rows], left=4)
        lines += ["verdict (arm vs base):", *(f"  {r[0]}: {r[verdict]}" for r in rows)]
    lines.append(f"({method_line(result.comparison)})")
    for c in secondary_regressions(result):
        lines.append(f"secondary, reported only: {c.arm} {c.figure.label} {c.verdict.text}")
    lines += ["", summary(result)]
    return "\n".join(lines if wide else text_table.wrapped(lines))


def to_markdown(result: GateResult) -> str:
    lines = ["### wirebench regression gate", "", summary(result), "", "| " + " | ".join(HEADERS) + " |"]
    lines.append("|" + "---|" * len(HEADERS))
    for a in result.arms:
        cells = _cells(result, a)
        if a.outcome == REGRESSION:
            cells[-1] = "**REGRESSION**"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{method_line(result.comparison)}."]
    for c in secondary_regressions(result):
        lines.append(f"- secondary, reported only: {c.arm} {c.figure.label} {c.verdict.text}")
    return "\n".join(lines) + "\n"


def to_json(result: GateResult) -> dict[str, Any]:
    return jsonable(
        {
            "kind": "gate",
            "base": result.base,
            "primary": result.comparison.primary.key if result.comparison.primary else None,
            "threshold_pct": result.threshold_pct,
            "exit_code": result.exit_code(),
            "summary": summary(result),
            "method": method_line(result.comparison),
            "excluded_runs": result.excluded,
            "arms": [
                {
                    "arm": a.arm,
                    "outcome": a.outcome,
                    "excluded_runs": a.excluded,
                    "primary": verdict_dict(a.primary.verdict) if a.primary else None,
                    "secondary": {c.figure.key: verdict_dict(c.verdict) for c in a.secondary},
                }
                for a in result.arms
            ],
        }
    )
