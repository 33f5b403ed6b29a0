"""Comparisons with verdicts: ``bench run``'s table, ``bench compare``, Markdown and JSON.

An *arm* is one thing being compared (a codec, or a server build measured with
``bench load``) with its runs, one per round. The first arm is the reference;
every other arm is compared with it, figure by figure, with the statistics of
``harness.analysis.stats`` (per-round log ratios paired on the rounds both arms ran
when they were interleaved, Welch otherwise): "slower/faster by X% [CI]",
"equivalent within ±δ", "inconclusive" with the rounds a new run would need,
or "too few rounds". One figure is primary (TTFT mean unless ``primary`` says
otherwise) and is tested first, Holm across the arms; the other figures of an
arm are tested (one Holm family) only once its primary is resolved, else they
are reported "not judged". Runs with failed requests or interrupted are left
out of the verdicts and counted.

Which figures are judged (``judged_figures``), each once: TTFT mean/p50/p99,
TPOT mean, per-chunk ITL p50/p99 (benchmark_serving's ITL; the per-token mean
equals TPOT's and is not judged twice), E2EL mean, the codec's µs per message
in each direction and operation, and the throughputs only when the arrival
rate is infinite (at a finite rate they are set by the schedule, not the server).

The codec and the wire on their own paths (``CODEC_PATH_FIGURES``: per request on
its way to its first token, per output step) are a family of their own, Holm
across arms at the whole alpha whatever the primary found: a run can say what a
codec costs each request while end-to-end TTFT is still inconclusive.

A run that stopped when its answer was known (``--until-resolved``) is judged
sequentially (``sequential=True``): mean TTFT and the codec family (codec and
codec + wire on the first-token path, codec + wire of each output step) with
the anytime-valid test of ``harness.analysis.sequential``, one paired
difference a round (the mean of its block pairs: blocks of a round are not
independent, ``harness.analysis.blocks``); the other figures are shown with
their estimates, not judged (a fixed-sample test at a data-chosen length would
not hold its error rate).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis import sequential as seq
from harness.analysis import stats
from harness.analysis import table as text_table
from harness.analysis.blocks import (
    ALL_BLOCK_FIGURES,
    STORED_BLOCK_FIGURES,
    intra_round_correlation,
    paired_log_diffs,
    round_means,
)
from harness.analysis.documents import COMPARE_SCHEMA, ResultsError, is_compare, jsonable, read_json
from harness.analysis.figures import CODEC_FIGURES, CODEC_PATH_FIGURES, LATENCY_FIGURES, THROUGHPUT_FIGURES, Figure
from harness.analysis.runs import RunEntry, collect_runs
from harness.analysis.stats import PairStats, Verdict
from harness.loadgen.saturation import KEPT_UP_MIN, STALL_RATIO, stalled


def judged_figures(runs: Sequence[RunEntry]) -> list[Figure]:
    """The figures a comparison of these runs judges: throughput only when every run sent at rate inf."""
    figures = [*LATENCY_FIGURES, *CODEC_PATH_FIGURES, *CODEC_FIGURES]
    rates = [r.figures.get("request_rate", math.nan) for r in runs if r.figures]
    if rates and all(math.isinf(rate) for rate in rates):
        figures += THROUGHPUT_FIGURES
    return figures


@dataclass
class Arm:
    """One side of a comparison: a label and its runs (measured ones carry figures), in round order."""

    label: str
    runs: list[RunEntry]

    @property
    def measured(self) -> list[RunEntry]:
        return [r for r in self.runs if r.figures is not None and r.status in ("ok", "failures", "interrupted")]

    def values(self, key: str) -> list[float]:
        return [r.figures.get(key, math.nan) for r in self.measured if r.figures is not None]

    def rounds(self) -> list[int | None]:
        return [r.round for r in self.measured]

    def blocks(self) -> list[tuple[int | None, dict[str, list[float]] | None]]:
        """Each measured run's round and block values (harness.analysis.blocks)."""
        return [(r.round, r.blocks) for r in self.measured]

    def judged(self) -> Arm:
        """The runs verdicts may use: whole and clean. A run with failed requests is excluded (a codec
        that fails its slowest requests would look faster), and so is an interrupted one."""
        return Arm(self.label, [r for r in self.measured if r.status == "ok"])


@dataclass
class VerdictCell:
    """One arm × figure against the reference; role "primary" (tested first, Holm across arms),
    "codec" (the codec + wire family, Holm across arms and its figures) or "secondary" (tested once
    the arm's primary is resolved)."""

    arm: str
    figure: Figure
    pair: PairStats | None
    verdict: Verdict
    role: str = "secondary"


DEFAULT_PRIMARY = "mean_ttft_ms"


@dataclass
class Comparison:
    arms: list[Arm]
    figures: list[Figure]
    cells: list[VerdictCell] = field(default_factory=list)
    margin_pct: float = stats.DEFAULT_MARGIN_PCT
    alpha: float = stats.ALPHA
    primary: Figure | None = None
    excluded: dict[str, int] = field(default_factory=dict)  # arm → runs left out of the verdicts
    sequential: bool = False  # judged from block pairs with the anytime-valid test (--until-resolved)
    # arm → its runs whose server did not keep up with the offered rate (harness.loadgen.saturation)
    saturated: dict[str, int] = field(default_factory=dict)
    # arm → its runs whose mean TTFT a few stalled requests set (harness.loadgen.saturation.stalled)
    stalls: dict[str, int] = field(default_factory=dict)

    def marked_saturated(self, cell: VerdictCell) -> bool:
        """A TTFT verdict where either side's runs were saturated: it compares queues, not serving paths."""
        return "ttft" in cell.figure.key and bool({cell.arm, self.reference.label} & self.saturated.keys())

    def marked_stalls(self, cell: VerdictCell) -> bool:
        """A mean or tail TTFT verdict where either side's runs stalled: it compares the stalls (the median
        is not marked: a few requests do not move it)."""
        key = cell.figure.key
        sides = {cell.arm, self.reference.label} & self.stalls.keys()
        return "ttft" in key and "median" not in key and bool(sides)

    def marks(self, cell: VerdictCell) -> str:
        """The marks a verdict's text carries: `` [saturated]``, `` [stalls]``."""
        saturated = " [saturated]" if self.marked_saturated(cell) else ""
        return saturated + (" [stalls]" if self.marked_stalls(cell) else "")

    @property
    def reference(self) -> Arm:
        return self.arms[0]

    def cell(self, arm: str, key: str) -> VerdictCell | None:
        return next((c for c in self.cells if c.arm == arm and c.figure.key == key), None)


def common_rounds(a: Arm, b: Arm) -> list[int] | None:
    """The rounds two arms pair on: the round numbers both ran (interleaved in one bench run), or None
    when they cannot pair (no round numbers, or a number repeated)."""
    ra, rb = a.rounds(), b.rounds()
    if not ra or not rb or None in ra or None in rb or len(set(ra)) != len(ra) or len(set(rb)) != len(rb):
        return None
    common = sorted(set(ra) & set(rb))  # type: ignore[type-var]
    return common or None  # type: ignore[return-value]


def _on_rounds(arm: Arm, key: str, rounds: list[int] | None) -> list[float]:
    by_round = dict(zip(arm.rounds(), arm.values(key)))
    return arm.values(key) if rounds is None else [by_round[r] for r in rounds]


def primary_figure(figures: Sequence[Figure], key: str) -> Figure:
    found = next((f for f in figures if f.key == key), None)
    if found is None:
        raise ValueError(f"primary figure {key!r} is not judged here; choose from {', '.join(f.key for f in figures)}")
    return found


def compare(
    arms: Sequence[Arm],
    *,
    figures: Sequence[Figure] | None = None,
    paired: bool | None = None,
    margin_pct: float = stats.DEFAULT_MARGIN_PCT,
    alpha: float = stats.ALPHA,
    min_rounds: int = stats.MIN_ROUNDS,
    primary: str = DEFAULT_PRIMARY,
    sequential: bool | None = None,
) -> Comparison:
    """Every arm after the first against the first, with gatekeeping: the primary figure of every arm
    is one Holm family; the other figures of the arms whose primary was resolved (slower, faster,
    equivalent) are a second family at the same alpha; the rest are reported, not judged. The codec
    and wire figures (``CODEC_PATH_FIGURES``) are a family of their own at alpha.

    Verdicts use each arm's whole, clean runs (``Arm.judged``), paired on the rounds both arms ran
    when they were interleaved (``common_rounds``), else Welch; ``sequential``: the block figures
    from block pairs with the anytime-valid test, the rest shown, not judged (default: whether the
    runs were made with --until-resolved).
    """
    if len(arms) < 2:
        raise ValueError("a comparison needs at least two arms")
    if sequential is None:
        sequential = any(r.until_resolved > 0 for arm in arms for r in arm.runs)
    figures = list(figures or judged_figures([r for arm in arms for r in arm.measured]))
    first = primary_figure(figures, primary)
    if sequential and first.key not in ALL_BLOCK_FIGURES:
        raise ValueError(
            f"a sequential comparison judges a block figure first ({', '.join(ALL_BLOCK_FIGURES)}), not {first.key}"
        )
    # A figure no run measured (a server without the counters) is left out of the tables too.
    figures = [f for f in figures if f is first or _measured(arms, f.key)]
    clean = [arm.judged() for arm in arms]
    excluded = {a.label: len(a.measured) - len(c.runs) for a, c in zip(arms, clean) if len(a.measured) > len(c.runs)}
    ref = clean[0]

    def pair(arm: Arm, fig: Figure) -> PairStats | None:
        rounds = common_rounds(ref, arm) if paired is not False else None
        if paired is True and rounds is None:
            raise ValueError(f"{arm.label} and {ref.label} share no round to pair on")
        a, b = _on_rounds(ref, fig.key, rounds), _on_rounds(arm, fig.key, rounds)
        if not a or not b:
            return None
        return stats.compare_arms(a, b, paired=rounds is not None, confidence=1 - alpha)

    # Judged on log ratios: a figure with a missing or zero value in a judged run is shown, not judged.
    judgeable = [f for f in figures if f is not first and _judgeable(clean, f.key)]
    codec_figs = [f for f in judgeable if f in CODEC_PATH_FIGURES]
    others = [f for f in judgeable if f not in CODEC_PATH_FIGURES]
    first_pairs = [pair(arm, first) for arm in clean[1:]]
    other_pairs = [[pair(arm, fig) for fig in others] for arm in clean[1:]]
    codec_pairs = [[pair(arm, fig) for fig in codec_figs] for arm in clean[1:]]
    settings: dict[str, Any] = {"alpha": alpha, "margin_pct": margin_pct, "min_rounds": min_rounds}
    if sequential:
        firsts, codecs = _sequential_verdicts(clean, first, codec_figs, codec_pairs, alpha, margin_pct)
        why = "a sequential run judges block figures only"
        seconds = [[stats.not_judged(p, why, **settings) for p in ps] for ps in other_pairs]
    else:
        firsts, seconds = stats.judge_gatekept(
            first_pairs,
            other_pairs,
            primary_higher_is_better=first.higher_is_better,
            secondary_higher_is_better=[f.higher_is_better for f in others],
            **settings,
        )
        flat = stats.judge(
            [p for ps in codec_pairs for p in ps],
            higher_is_better=[f.higher_is_better for f in codec_figs] * len(codec_pairs),
            **settings,
        )
        codecs = [flat[i * len(codec_figs) : (i + 1) * len(codec_figs)] for i in range(len(codec_pairs))]
    ordered = []
    for i, arm in enumerate(clean[1:]):
        ordered.append(VerdictCell(arm.label, first, first_pairs[i], firsts[i], "primary"))
        ordered += [VerdictCell(arm.label, f, q, w, "codec") for f, q, w in zip(codec_figs, codec_pairs[i], codecs[i])]
        ordered += [VerdictCell(arm.label, f, q, w) for f, q, w in zip(others, other_pairs[i], seconds[i], strict=True)]
    saturated = {a.label: n for a in arms if (n := sum(_saturated(r) for r in a.measured))}
    stalls = {a.label: n for a in arms if (n := sum(_stalled(r) for r in a.measured))}
    return Comparison(list(arms), figures, ordered, margin_pct, alpha, first, excluded, sequential, saturated, stalls)


def _saturated(run: RunEntry) -> bool:
    return (run.figures or {}).get("kept_up_pct", math.nan) < 100.0 * KEPT_UP_MIN


def _stalled(run: RunEntry) -> bool:
    figures = run.figures or {}
    return stalled(figures.get("mean_ttft_ms", math.nan), figures.get("median_ttft_ms", math.nan))


def _sequential_verdicts(
    clean: list[Arm],
    first: Figure,
    codec_figs: list[Figure],
    codec_pairs: list[list[PairStats | None]],
    alpha: float,
    margin_pct: float,
) -> tuple[list[Verdict], list[list[Verdict]]]:
    """The primary family (Holm across arms) and the codec family (Holm across arms and its block
    figures) with the anytime-valid test on one difference a round (its block pairs' mean); a codec
    figure that either arm's runs hold no block values of is shown, not judged (``_why_not_by_block``)."""
    ref, others = clean[0].blocks(), clean[1:]
    settings: dict[str, Any] = {"alpha": alpha, "margin_pct": margin_pct}

    def by_round(arm: Arm, key: str) -> list[list[float]]:
        return paired_log_diffs(ref, arm.blocks(), key)

    def judged(members: list[tuple[Arm, Figure]]) -> list[Verdict]:
        rounds = [by_round(arm, fig.key) for arm, fig in members]
        found = seq.judge_sequential(
            [round_means(r) for r in rounds], higher_is_better=[fig.higher_is_better for _, fig in members], **settings
        )
        return [_as_verdict(v, r) for v, r in zip(found, rounds, strict=True)]

    firsts = judged([(arm, first) for arm in others])
    members = [(i, f) for i in range(len(others)) for f in codec_figs if not _why_not_by_block(clean[0], others[i], f)]
    found = judged([(others[i], f) for i, f in members])
    verdict_of = {(i, f.key): v for (i, f), v in zip(members, found, strict=True)}
    codecs = [
        [
            verdict_of.get((i, f.key)) or stats.not_judged(p, _why_not_by_block(clean[0], others[i], f), **settings)
            for f, p in zip(codec_figs, pairs, strict=True)
        ]
        for i, pairs in enumerate(codec_pairs)
    ]
    return firsts, codecs


def _why_not_by_block(ref: Arm, arm: Arm, fig: Figure) -> str:
    """Why a codec figure cannot be judged from block pairs ("" when it can): not measured per block, or
    either arm's runs without its block values (run files written before they were kept)."""
    if fig.key not in ALL_BLOCK_FIGURES:
        return "measured per run, not per block"
    lacking = [a.label for a in (ref, arm) if not any(blocks and fig.key in blocks for _, blocks in a.blocks())]
    if not lacking:
        return ""
    written_before = " (run files written before they were kept)" if fig.key in STORED_BLOCK_FIGURES else ""
    return f"no block values in the runs of {' and '.join(lacking)}{written_before}"


def _as_verdict(v: seq.SequentialVerdict, rounds: list[list[float]]) -> Verdict:
    """A sequential verdict as a table's verdict, with the block pairs behind its rounds."""
    s = v.stats

    def pct(ratio: float) -> float:
        return 100.0 * (ratio - 1.0) if math.isfinite(ratio) else math.nan

    return Verdict(
        v.verdict,
        s.change_pct,
        pct(s.ci_low),
        pct(s.ci_high),
        s.p_anytime,
        v.p_adjusted,
        None,
        math.nan,
        s.n,
        margin_pct=v.margin_pct,
        sequential=True,
        block_pairs=sum(len(r) for r in rounds),
        intra_round_correlation=intra_round_correlation(rounds),
    )


def _measured(arms: Sequence[Arm], key: str) -> bool:
    return any(math.isfinite(v) for arm in arms for v in arm.values(key))


def _judgeable(arms: Sequence[Arm], key: str) -> bool:
    values = [v for arm in arms for v in arm.values(key)]
    return bool(values) and all(math.isfinite(v) and v > 0 for v in values)


# --- text, Markdown, JSON -----------------------------------------------------------


def fmt_value(value: float) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def median_cell(arm: Arm, key: str) -> str:
    """Median over rounds, with ± half the range in % when there are several."""
    values = [v for v in arm.values(key) if math.isfinite(v)]
    if not values:
        return "-"
    mid = statistics.median(values)
    text = fmt_value(mid)
    if len(values) > 1 and mid:
        text += f" ±{(max(values) - min(values)) / 2 / abs(mid) * 100:.1f}%"
    return text


def figures_table(comparison: Comparison, extra: Sequence[Figure] = ()) -> list[str]:
    """Side by side: per arm, each figure's median over rounds (± half the range)."""
    keys = {f.key for f in comparison.figures}
    figures = [*comparison.figures, *(f for f in extra if f.key not in keys)]
    headers = ["arm", "rounds", *(f.label for f in figures)]
    rows = [[arm.label, str(len(arm.measured)), *(median_cell(arm, f.key) for f in figures)] for arm in comparison.arms]
    return text_table.format_table(headers, rows)


def method_line(comparison: Comparison) -> str:
    """How the verdicts were made, in one sentence: the families, the test, the margin, what was left out."""
    primary = comparison.primary.label if comparison.primary else "?"
    n_first = sum(1 for c in comparison.cells if c.role == "primary")
    n_second = sum(1 for c in comparison.cells if c.role == "secondary" and c.verdict.verdict != "not judged")
    n_codec = sum(1 for c in comparison.cells if c.role == "codec" and c.verdict.verdict != "not judged")
    codec = f"; the codec figures a family of their own (Holm over {n_codec})" if n_codec else ""
    if comparison.sequential:
        firsts = [c.verdict for c in comparison.cells if c.role == "primary"]
        rounds = max((v.n_rounds for v in firsts), default=0)
        pairs = max((v.block_pairs for v in firsts), default=0)
        rho = [v.intra_round_correlation for v in firsts if math.isfinite(v.intra_round_correlation)]
        clustering = f"; intra-round correlation {', '.join(f'{r:.2f}' for r in rho)}" if rho else ""
        text = (
            f"anytime-valid t test on the mean log ratio of each of {rounds} rounds ({pairs} block pairs"
            f"{clustering}), 95% confidence sequences (valid whenever the run stopped); primary figure "
            f"{primary} (Holm over {n_first} arm(s)){codec}; equivalence margin ±{comparison.margin_pct:g}%"
        )
    else:
        text = (
            f"{_method(comparison)}, 95% CI; primary figure {primary} (Holm over {n_first} arm(s)), "
            f"then {n_second} secondary figures of the arms whose primary was resolved (Holm){codec}; "
            f"equivalence margin ±{comparison.margin_pct:g}%"
        )
    text += run_wide_clause(comparison.alpha, families=2 if n_codec else 1)
    if comparison.excluded:
        left = ", ".join(f"{label} {n}" for label, n in comparison.excluded.items())
        text += f"; runs with failed requests or interrupted, left out of the verdicts: {left}"
    return text


def run_wide_clause(alpha: float, families: int) -> str:
    """The chance of any false verdict when nothing changed: each family holds alpha (Holm, with the
    secondary figures inside the primary's through the fallback split), so the run holds families × alpha
    (the union bound). A false "equivalent" needs a real change; it too is held at alpha a family."""
    if families < 2:
        return f"; with no true change, any false verdict ≤ {alpha:.0%}"
    return f"; with no true change, a false verdict ≤ {alpha:.0%} a family, ≤ {families * alpha:.0%} in the run"


ROLE_NOTES = {"primary": " (primary)", "codec": " (codec)"}


def verdict_lines(comparison: Comparison) -> list[str]:
    ref = comparison.reference.label
    lines = [f"verdicts against {ref} ({method_line(comparison)}):"]
    if comparison.saturated:
        counts = ", ".join(
            f"{a.label} {comparison.saturated[a.label]} of {len(a.measured)}"
            for a in comparison.arms
            if a.label in comparison.saturated
        )
        lines.append(
            f" SATURATED runs ({counts}): the server kept up with less than {KEPT_UP_MIN:.0%} of the offered "
            "rate, so its queue, not the codec, set their TTFT; those TTFT verdicts are marked [saturated]"
        )
    if comparison.stalls:
        counts = ", ".join(
            f"{a.label} {n} of {len(a.measured)}" for a in comparison.arms if (n := comparison.stalls.get(a.label))
        )
        lines.append(
            f" STALLS in runs ({counts}): a mean TTFT over {STALL_RATIO:g}x the run's median, set by a few "
            "requests' waits; those mean and tail TTFT verdicts are marked [stalls]"
        )
    for arm in comparison.arms[1:]:
        cells = [c for c in comparison.cells if c.arm == arm.label]
        if comparison.sequential:  # the other figures are in the table above; none has a verdict here
            cells = [c for c in cells if c.role != "secondary"]
        rows = [
            [
                f"  {c.figure.label}" + ROLE_NOTES.get(c.role, ""),
                c.verdict.text + comparison.marks(c),
            ]
            for c in cells
        ]
        lines.append(f" {arm.label}:")
        lines += text_table.format_table(["", ""], rows, left=2)[1:]
    if comparison.sequential:
        lines.append(" the other figures: in the table above, not judged (a sequential run judges block figures only)")
    return lines


def _method(comparison: Comparison) -> str:
    kinds = {c.pair.paired for c in comparison.cells if c.pair is not None}
    if kinds == {True}:
        return "log ratios paired on the rounds both arms ran"
    if kinds == {False}:
        return "Welch t on log values, rounds not paired"
    return "log ratios paired by round where the arms share rounds, else Welch"


def summary_line(comparison: Comparison) -> str:
    counts: dict[str, int] = {}
    for c in comparison.cells:
        counts[c.verdict.verdict] = counts.get(c.verdict.verdict, 0) + 1
    return ", ".join(f"{n} {word}" for word, n in counts.items())


def format_text(comparison: Comparison) -> str:
    return "\n".join(
        [*figures_table(comparison), "", *verdict_lines(comparison), f"in all: {summary_line(comparison)}"]
    )


def to_markdown(comparison: Comparison, title: str = "wirebench comparison") -> str:
    """A GitHub-flavoured Markdown table: one row per figure, one column per non-reference arm."""
    ref = comparison.reference
    others = comparison.arms[1:]
    lines = [
        f"### {title}",
        "",
        f"Reference **{ref.label}** ({len(ref.measured)} rounds); changes are each arm against it: "
        f"{method_line(comparison)}.",
        "",
        "| figure | " + " | ".join([ref.label, *(a.label for a in others)]) + " |",
        "|---|" + "---|" * (1 + len(others)),
    ]
    for fig in comparison.figures:
        row = [fig.label, median_cell(ref, fig.key)]
        for arm in others:
            cell = comparison.cell(arm.label, fig.key)
            row.append(f"{median_cell(arm, fig.key)}<br>{cell.verdict.text}" if cell else median_cell(arm, fig.key))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"In all: {summary_line(comparison)}."]
    return "\n".join(lines) + "\n"


def verdict_dict(v: Verdict) -> dict[str, Any]:
    return {
        "verdict": v.verdict,
        "text": v.text,
        "change_pct": v.change_pct,
        "ci_low_pct": v.ci_low_pct,
        "ci_high_pct": v.ci_high_pct,
        "p_value": v.p_value,
        "p_adjusted": v.p_adjusted,
        "rounds": v.n_rounds,
        "rounds_needed": v.rounds_needed,
        "mde_pct": v.mde_pct,
        **(
            {"block_pairs": v.block_pairs, "intra_round_correlation": v.intra_round_correlation} if v.sequential else {}
        ),
    }


def comparison_dict(comparison: Comparison) -> dict[str, Any]:
    """The verdicts as JSON: ``{arm: {figure key: verdict}}`` plus the settings that made them."""
    out: dict[str, Any] = {
        "reference": comparison.reference.label,
        "margin_pct": comparison.margin_pct,
        "alpha": comparison.alpha,
        "method": method_line(comparison),
        "primary": comparison.primary.key if comparison.primary else None,
        "sequential": comparison.sequential,
        "excluded_runs": comparison.excluded,
        "saturated_runs": comparison.saturated,
        "stalled_runs": comparison.stalls,
        "figures": [
            {"key": f.key, "label": f.label, "higher_is_better": f.higher_is_better} for f in comparison.figures
        ],
        "verdicts": {},
    }
    for c in comparison.cells:
        entry = verdict_dict(c.verdict)
        entry["paired"] = c.pair.paired if c.pair else None
        entry["role"] = c.role
        if comparison.marked_saturated(c):
            entry["saturated"] = True
        if comparison.marked_stalls(c):
            entry["stalls"] = True
        out["verdicts"].setdefault(c.arm, {})[c.figure.key] = entry
    return out


def compare_document(
    comparison: Comparison,
    *,
    folder: Path,
    metadata: dict[str, Any] | None = None,
    repeat: int | None = None,
    order: Sequence[RunEntry] | None = None,
) -> dict[str, Any]:
    """A compare document (schema in harness.analysis.documents): arms, every run with its figures, verdicts.

    ``order``: the runs in the order they ran (default: arm by arm).
    """
    entries = order if order is not None else [r for arm in comparison.arms for r in arm.runs]
    # A run is listed under its arm's label (what the document is read back by), not its own codec:
    # two builds of a server measured with bench load may both say "pickle".
    arm_of = {id(r): arm.label for arm in comparison.arms for r in arm.runs}
    runs = [
        {
            "codec": arm_of.get(id(r), r.codec),
            "round": r.round,
            "status": r.status,
            "message": r.message,
            # Relative to the compare file, so a results folder can move (e.g. into baselines/).
            "result_file": _relative(r.path, folder) if r.path else None,
            "figures": r.figures,
            # A run in blocks: its block figures, so a sequential verdict can be judged again from this file.
            **({"blocks": r.blocks} if r.blocks else {}),
        }
        for r in entries
    ]
    table = {
        arm.label: {
            "runs": len(arm.runs),
            "measured": len(arm.measured),
            "status": _worst_status(arm),
            "message": next((r.message for r in arm.runs if r.message), ""),
            **{f.key: _table_cell(arm, f.key) for f in comparison.figures},
        }
        for arm in comparison.arms
    }
    return jsonable(
        {
            "schema_version": COMPARE_SCHEMA,
            "kind": "compare",
            "codecs": [arm.label for arm in comparison.arms],
            "repeat": repeat if repeat is not None else max((len(a.runs) for a in comparison.arms), default=0),
            "runs": runs,
            "table": table,
            "comparison": comparison_dict(comparison),
            "metadata": metadata or {},
        }
    )


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.resolve().relative_to(folder.resolve()))
    except ValueError:
        import os

        return os.path.relpath(path, folder)


def _table_cell(arm: Arm, key: str) -> dict[str, Any] | None:
    values = [v for v in arm.values(key) if math.isfinite(v)]
    if not values:
        return None
    mid = statistics.median(values)
    spread = (max(values) - min(values)) / 2 / abs(mid) * 100 if mid and len(values) > 1 else None
    return {"median": mid, "spread_pct": spread, "values": values}


STATUS_ORDER = ("error", "unsupported", "failures", "interrupted")


def _worst_status(arm: Arm) -> str:
    statuses = {r.status for r in arm.runs}
    return next((s for s in STATUS_ORDER if s in statuses), "ok")


# --- bench compare --------------------------------------------------------------------------


def arms_from_sources(sources: Sequence[str]) -> list[Arm]:
    """Arms from ``[LABEL=]SOURCE`` arguments.

    One compare file alone: its arms (first = reference). Otherwise each source
    is one arm (a compare file with one arm, a run file, a folder of run files,
    e.g. the rounds of one server build measured with ``bench load``), labelled
    LABEL or the source's name.
    """
    specs = [_split_label(s) for s in sources]
    if len(specs) == 1:
        label, path = specs[0]
        runs = collect_runs(path)
        arms = arms_by_label(runs)
        if len(arms) < 2:
            raise ResultsError(f"{path}: holds one arm ({arms[0].label if arms else 'none'}); give two sources")
        return arms
    arms = []
    for label, path in specs:
        runs = collect_runs(path)
        labels = sorted({r.codec for r in runs})
        if label is None and len(labels) > 1:
            raise ResultsError(
                f"{path}: holds runs of several arms ({', '.join(labels)}); pass a compare file alone, "
                "or one arm's runs per source"
            )
        name = label or (labels[0] if labels and labels[0] != "unknown" else Path(path).stem)
        arms.append(Arm(name, _in_time_order(runs)))
    if len({a.label for a in arms}) != len(arms):
        raise ResultsError(f"two arms share a label ({', '.join(a.label for a in arms)}): name them LABEL=SOURCE")
    return arms


def _split_label(spec: str) -> tuple[str | None, str]:
    label, sep, path = spec.partition("=")
    if sep and label and not Path(spec).exists():
        return label, path
    return None, spec


def arms_by_label(runs: Sequence[RunEntry]) -> list[Arm]:
    """The runs grouped into arms by label, in the order the labels first appear."""
    arms: dict[str, list[RunEntry]] = {}
    for r in runs:
        arms.setdefault(r.codec, []).append(r)
    return [Arm(label, rs) for label, rs in arms.items()]


def _in_time_order(runs: list[RunEntry]) -> list[RunEntry]:
    """Runs of one arm in the order they ran; numbered as rounds when they carry none."""
    ordered = sorted(runs, key=lambda r: (r.doc or {}).get("started_at") or "")
    if any(r.round is None for r in ordered):
        for i, r in enumerate(ordered):
            r.round = i
    return ordered


def load_any_compare(path: str | Path) -> list[Arm]:
    """The arms of a compare document (bench run's or bench compare's), for the gate."""
    doc = read_json(Path(path))
    if not is_compare(doc):
        raise ResultsError(f"{path}: not a compare file (the compare-*.json of bench run or bench compare --json)")
    return arms_by_label(collect_runs(path))
