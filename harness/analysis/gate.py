"""The CI gate: did anything regress against a committed baseline, with a statistical verdict and beyond a threshold?

    bench compare results/compare-NEW.json --baseline results/baselines/text.json [--threshold-pct 5]

Both files are compare documents (``bench run``'s, or ``bench compare
--json``'s; a compact baseline carries per-round figures and no run files).
Two checks per codec measured on both sides, judged together (one Holm family):

- its **own figures** against its own baseline rounds (Welch on log values:
  the two files are independent samples). This catches a regression of the
  reference codec itself, which ratios alone never can; it assumes both files
  come from the same kind of machine (``--ratios-only`` skips it across machines);
- its **ratio to the reference codec** (the first codec of the current file),
  per round within each file, current ratios against baseline ratios. Machine
  speed cancels in a ratio, so this holds across machines.

A row fails only when its verdict is "slower" (Holm-adjusted p < alpha) *and*
the estimated change exceeds ``--threshold-pct``. A row whose 95% CI reaches
past the threshold without a verdict is "noisy": the data cannot rule out such
a regression; more rounds would (the table says how many).

Exit status: 0 pass; 1 at least one regression; 2 unusable or incomparable
input (unreadable file, reference codec missing from the baseline, or settings
that differ: workload, rate, executor, block size, machine — each named, see
``harness.analysis.comparable``); 3 when nothing regressed but the gate cannot
say so: a figure too noisy or with too few rounds to rule out a regression above
the threshold, or a codec of the baseline not measured now.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.analysis import stats
from harness.analysis import table as text_table
from harness.analysis.compare import Arm, fmt_value, judged_figures, verdict_dict
from harness.analysis.documents import ResultsError, jsonable
from harness.analysis.figures import Figure
from harness.analysis.stats import PairStats, Verdict

EXIT_PASS, EXIT_REGRESSION, EXIT_UNUSABLE, EXIT_NOISY = 0, 1, 2, 3
REGRESSION, NOISY, OK = "REGRESSION", "noisy", "ok"


@dataclass
class Row:
    codec: str
    figure: Figure
    kind: str  # "own" or "vs <reference>"
    baseline: list[float]
    current: list[float]
    pair: PairStats | None
    verdict: Verdict | None = None
    outcome: str = OK

    @property
    def baseline_median(self) -> float:
        return _median(self.baseline)

    @property
    def current_median(self) -> float:
        return _median(self.current)


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def _ratios(arm: Arm, ref: Arm, key: str) -> list[float]:
    """arm / reference per round, for rounds both measured."""
    ref_by_round = dict(zip(ref.rounds(), ref.values(key)))
    out = []
    for rnd, value in zip(arm.rounds(), arm.values(key)):
        base = ref_by_round.get(rnd)
        if base is not None and base > 0 and math.isfinite(value):
            out.append(value / base)
    return out


@dataclass
class GateResult:
    reference: str
    rows: list[Row]
    only_current: list[str]
    only_baseline: list[str]
    threshold_pct: float

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.outcome == REGRESSION]

    @property
    def noisy(self) -> list[Row]:
        return [r for r in self.rows if r.outcome == NOISY]

    def exit_code(self) -> int:
        """1 for a regression; 3 when the gate cannot rule one out (noise, too few rounds, a missing codec)."""
        if self.regressions:
            return EXIT_REGRESSION
        return EXIT_NOISY if self.noisy or self.only_baseline else EXIT_PASS


def run_gate(
    current: list[Arm],
    baseline: list[Arm],
    *,
    threshold_pct: float = 5.0,
    margin_pct: float = stats.DEFAULT_MARGIN_PCT,
    alpha: float = stats.ALPHA,
    ratios_only: bool = False,
) -> GateResult:
    """Judge every codec of ``current`` against ``baseline``; raises ResultsError when they can't be compared."""
    if not current:
        raise ResultsError("the current file has no measured codec")
    by_label = {a.label: a for a in baseline}
    ref = current[0]
    if not ref.measured:
        raise ResultsError(f"reference codec {ref.label!r} (the current file's first) has no measured round")
    if ref.label not in by_label or not by_label[ref.label].measured:
        raise ResultsError(f"reference codec {ref.label!r} (the current file's first) was not measured in the baseline")
    base_ref = by_label[ref.label]
    figures = judged_figures([r for arm in (*current, *baseline) for r in arm.measured])
    rows: list[Row] = []
    for arm in current:
        old = by_label.get(arm.label)
        if old is None or not old.measured or not arm.measured:
            continue
        for fig in figures:
            if not ratios_only:
                rows.append(_row(arm.label, fig, "own", old.values(fig.key), arm.values(fig.key)))
            if arm is not ref:
                kind = f"vs {ref.label}"
                rows.append(_row(arm.label, fig, kind, _ratios(old, base_ref, fig.key), _ratios(arm, ref, fig.key)))
    verdicts = stats.judge(
        [r.pair for r in rows],
        higher_is_better=[r.figure.higher_is_better for r in rows],
        alpha=alpha,
        margin_pct=margin_pct,
    )
    for row, verdict in zip(rows, verdicts, strict=True):
        row.verdict = verdict
        row.outcome = _outcome(row, verdict, threshold_pct)
    current_labels = {a.label for a in current if a.measured}
    baseline_labels = {a.label for a in baseline if a.measured}
    return GateResult(
        ref.label,
        rows,
        sorted(current_labels - baseline_labels),
        sorted(baseline_labels - current_labels),
        threshold_pct,
    )


def _row(codec: str, fig: Figure, kind: str, old: list[float], new: list[float]) -> Row:
    pair = stats.compare_arms(old, new, paired=False) if old and new else None
    return Row(codec, fig, kind, old, new, pair)


def _outcome(row: Row, v: Verdict, threshold_pct: float) -> str:
    # "Worse" in the figure's own direction: a latency up, a throughput down.
    worse_pct = -v.change_pct if row.figure.higher_is_better else v.change_pct
    if v.verdict == "slower" and worse_pct > threshold_pct:
        return REGRESSION
    if v.verdict in ("slower", "faster", "equivalent"):
        return OK
    reach = -v.ci_low_pct if row.figure.higher_is_better else v.ci_high_pct
    if v.verdict in ("too few rounds", "not comparable") or not math.isfinite(reach) or reach > threshold_pct:
        return NOISY
    return OK


# --- output ----------------------------------------------------------------------------------


def _cells(row: Row) -> list[str]:
    v = row.verdict
    unit = "ratio" if row.kind != "own" else ""
    return [
        row.codec,
        row.figure.label,
        row.kind,
        fmt_value(row.baseline_median) + (f" {unit}" if unit else ""),
        fmt_value(row.current_median),
        v.text if v else "-",
        row.outcome,
    ]


HEADERS = ["codec", "figure", "check", "baseline", "current", "verdict (current vs baseline)", "gate"]


def format_text(result: GateResult) -> str:
    lines = text_table.format_table(HEADERS, [_cells(r) for r in result.rows], left=3)
    lines.append("")
    lines.append(_summary(result))
    if result.only_current:
        lines.append(f"not measured in baseline: {', '.join(result.only_current)}")
    if result.only_baseline:
        lines.append(f"not measured now (in baseline only): {', '.join(result.only_baseline)}")
    return "\n".join(lines)


def _summary(result: GateResult) -> str:
    regs, noisy = result.regressions, result.noisy
    head = f"{len(result.rows)} checks against the baseline, threshold {result.threshold_pct:g}%: "
    if regs:
        names = ", ".join(f"{r.codec} {r.figure.label} ({r.kind})" for r in regs)
        return head + f"{len(regs)} REGRESSION(S): {names}"
    text = head + "no regression"
    if noisy:
        text += f"; {len(noisy)} too noisy to rule one out (see 'noisy': more rounds would decide)"
    return text


def to_markdown(result: GateResult) -> str:
    lines = [
        "### wirebench regression gate",
        "",
        _summary(result),
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for row in result.rows:
        cells = _cells(row)
        if row.outcome == REGRESSION:
            cells[-1] = "**REGRESSION**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_json(result: GateResult) -> dict[str, Any]:
    return jsonable(
        {
            "reference": result.reference,
            "threshold_pct": result.threshold_pct,
            "regressions": len(result.regressions),
            "noisy": len(result.noisy),
            "only_current": result.only_current,
            "only_baseline": result.only_baseline,
            "rows": [
                {
                    "codec": r.codec,
                    "figure": r.figure.key,
                    "check": r.kind,
                    "baseline_median": r.baseline_median,
                    "current_median": r.current_median,
                    "outcome": r.outcome,
                    **(verdict_dict(r.verdict) if r.verdict else {}),
                }
                for r in result.rows
            ],
        }
    )
