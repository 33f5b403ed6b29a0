"""``bench compare``: verdicts over saved results; with ``--gate``, the CI regression gate.

    bench compare results/compare-X.json                      the arms of one bench run
    bench compare main=results/main/ branch=results/branch/   two sets of bench load rounds
    bench compare results/compare-X.json --gate               base (first arm) against head, one job
    bench compare a=results/a.json b=results/b.json --unlike  arms that ran with other settings: no verdicts

The comparison is ``harness.analysis.verdicts``'s, the gate ``harness.analysis.gate``'s (exit
codes there). Both judge only arms whose settings agree (``harness.analysis.like_for_like``).
Both can also write Markdown (a CI job summary, a pull-request comment) and JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis import gate, like_for_like, stats
from harness.analysis import table as text_table
from harness.analysis.documents import ResultsError, write_json
from harness.analysis.exports import write_exports
from harness.analysis.figures import Figure
from harness.analysis.like_for_like import UNLIKE_FLAG, UNLIKE_HINT, Difference
from harness.analysis.verdict_text import figure_rows
from harness.analysis.verdicts import (
    DEFAULT_PRIMARY,
    Arm,
    Comparison,
    arms_from_sources,
    compare,
    compare_document,
    figures_table,
    format_text,
    judged_figures,
    median_cell,
    summary_line,
    to_markdown,
    verdict_lines,
)

DESCRIPTION = """\
Judge saved results against each other. The arms are those of a compare file,
or one per SOURCE (a run file, a folder of run files, or a compare file with
one arm); the first is the reference. Each figure's change is read from the
per-round ratios (paired where the rounds match) with a 95% confidence
interval: slower, faster, equivalent within --margin-pct, or inconclusive.

Arms from separate sources are judged only when they ran with the same
settings (workload, rate, server, machine): arms that differ are refused, each
difference named, or with --unlike shown side by side without verdicts. The
arms of one compare file, one bench run, differ only as the run meant them to.

With --gate the arms, measured in one job (base and head of a pull request as
two arms of bench run), decide a CI check on the primary figure."""

EPILOG = """\
examples:
  bench compare results/compare-X.json
  bench compare main=results/main/ branch=results/branch/
  bench compare results/compare-X.json --gate --markdown summary.md

exit codes: 0 judged, or shown side by side with --unlike (with --gate: no
regression); 2 unusable input, arms whose settings differ (without --unlike),
or --baseline given. With --gate: 1 a regression, 3 cannot say (too noisy, or
runs left out)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="+",
        metavar="[LABEL=]SOURCE",
        help="a compare file alone (its arms), or one source per arm: a run file, a folder of run files "
        "(e.g. bench load rounds of one server), or a compare file with one arm; the first arm is the reference",
    )
    p.add_argument(
        "--gate",
        action="store_true",
        help="CI gate: the arms were measured in one job (e.g. bench run --arm base=... --arm head=...); "
        "every arm against the first on the primary figure; exit 0 pass, 1 regression, 2 unusable, 3 cannot say",
    )
    p.add_argument(
        "--primary",
        default=DEFAULT_PRIMARY,
        metavar="FIGURE",
        help="the figure tested first (Holm across arms) and the one the gate decides on; the others are "
        "judged once it is resolved (default %(default)s)",
    )
    p.add_argument(
        "--threshold-pct",
        type=float,
        default=5.0,
        help="gate: a regression must be statistically supported and larger than this (default 5)",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="FILE",
        help="refused for latency (exit 2, with the reason): latency is gated within one job (--gate); "
        "instruction counts have their own baseline gate (bench micro --count instructions --baseline)",
    )
    p.add_argument(
        "--margin-pct",
        type=float,
        default=stats.DEFAULT_MARGIN_PCT,
        help=f"equivalence margin in percent (default {stats.DEFAULT_MARGIN_PCT:g})",
    )
    p.add_argument(
        UNLIKE_FLAG,
        action="store_true",
        help="arms whose settings differ (refused by default, exit 2): show their figures side by side, without "
        "verdicts, under a line naming the differences; not with --gate or --json",
    )
    p.add_argument("--unpaired", action="store_true", help="compare as independent samples even when rounds match")
    p.add_argument(
        "--wide",
        action="store_true",
        help=f"lines past {text_table.WIDTH} characters, none wrapped: one row per arm and a column per figure "
        f"(with --gate, the verdict a column); by default figures are rows and arms columns, within "
        f"{text_table.WIDTH}",
    )
    p.add_argument("--markdown", type=Path, default=None, help="also write the table as Markdown here")
    p.add_argument("--json", type=Path, default=None, help="also write the compare document (JSON) here")
    dash = p.add_argument_group("dashboard exports (the figures of SOURCE: median over rounds, min..max)")
    dash.add_argument(
        "--github-benchmark",
        type=Path,
        default=None,
        metavar="PATH",
        help="github-action-benchmark customSmallerIsBetter JSON (latencies, codec µs)",
    )
    dash.add_argument(
        "--github-benchmark-bigger",
        type=Path,
        default=None,
        metavar="PATH",
        help="github-action-benchmark customBiggerIsBetter JSON (throughputs, when judged)",
    )
    dash.add_argument("--bencher", type=Path, default=None, metavar="PATH", help="Bencher Metric Format (BMF) JSON")


PROG = "bench compare"
GATE_HINT = f"the gate judges like arms only; without --gate, {UNLIKE_HINT}"


def main(args: argparse.Namespace) -> int:
    if args.baseline is not None:
        print(f"{PROG}: error: {gate.CROSS_SESSION}", file=sys.stderr)
        return gate.EXIT_UNUSABLE
    if args.gate and args.unlike:
        print(
            f"{PROG}: error: --gate decides on a verdict and {UNLIKE_FLAG} shows none: give one of them",
            file=sys.stderr,
        )
        return gate.EXIT_UNUSABLE
    try:
        arms = arms_from_sources(args.sources)
        # The gate checks every input; a compare file alone holds the arms of one bench run, alike by
        # construction (their arm flags differ on purpose).
        unlike = [] if one_bench_run(args.sources) and not args.gate else like_for_like.differences(arms)
        refused = unlike_refusal(args, unlike)
        if refused:
            print(refused, file=sys.stderr)
            return gate.EXIT_UNUSABLE
        if not args.gate and not unlike:
            comparison = compare(
                arms, paired=False if args.unpaired else None, margin_pct=args.margin_pct, primary=args.primary
            )
    except (ResultsError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    write_exports(
        arms,
        judged_figures([r for arm in arms for r in arm.measured]),
        github_path=args.github_benchmark,
        github_bigger_path=args.github_benchmark_bigger,
        bencher_path=args.bencher,
    )
    if args.gate:
        return run_gate_command(args, arms)
    if unlike:
        return show_side_by_side(args, arms, unlike)
    print(comparison_text(comparison, args.wide))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(to_markdown(comparison))
    if args.json:
        write_json(args.json, compare_document(comparison, folder=args.json.parent), indent=2)
    return 0


def comparison_text(comparison: Comparison, wide: bool) -> str:
    """The arms' figures and the verdicts: figures as rows and arms as columns within WIDTH (arms that do
    not fit go on to a table of their own), the verdicts wrapped; ``wide``: one row per arm."""
    if wide:
        return format_text(comparison)
    lines = [*figure_rows(comparison.arms, comparison.figures), MEDIAN_NOTE, ""]
    lines += text_table.wrapped([*verdict_lines(comparison), f"in all: {summary_line(comparison)}"])
    return "\n".join(lines)


MEDIAN_NOTE = "median over rounds ± half the range"


def one_bench_run(sources: list[str]) -> bool:
    """One file alone: a compare file (a run file holds one arm, which arms_from_sources refuses)."""
    return len(sources) == 1 and Path(sources[0]).is_file()


def unlike_refusal(args: argparse.Namespace, unlike: list[Difference]) -> str | None:
    """Why arms whose settings differ cannot go on as asked (None when they can, or when they agree)."""
    if not unlike:
        return None
    if args.gate or not args.unlike:
        return like_for_like.refusal(PROG, [d.text for d in unlike], GATE_HINT if args.gate else UNLIKE_HINT)
    if args.json:
        # A compare document holds verdicts, and read back without its run files it would be judged.
        return f"{PROG}: error: --json writes a compare document of verdicts; unlike arms have none: leave out --json"
    return None


def show_side_by_side(args: argparse.Namespace, arms: list[Arm], unlike: list[Difference]) -> int:
    """--unlike: the arms' figures without verdicts, under the line that says why."""
    table = like_for_like.side_by_side(arms)
    header = like_for_like.not_judged_line(unlike)
    if args.wide:
        print("\n".join([header, *(f"  {d.text}" for d in unlike), "", *figures_table(table)]))
    else:
        why = text_table.wrapped([header, *(f"  {d.text}" for d in unlike)])
        print("\n".join([*why, "", *figure_rows(table.arms, table.figures), MEDIAN_NOTE]))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(side_by_side_markdown(arms, table.figures, header, unlike))
    return 0


def side_by_side_markdown(arms: list[Arm], figures: list[Figure], header: str, unlike: list[Difference]) -> str:
    """The Markdown of --unlike: the differences, then one row per figure, one column per arm."""
    lines = ["### wirebench comparison", "", f"**{header}**", "", *(f"- {d.text}" for d in unlike), ""]
    lines += ["| figure | " + " | ".join(a.label for a in arms) + " |", "|---|" + "---|" * len(arms)]
    lines += ["| " + " | ".join([f.label, *(median_cell(a, f.key) for a in arms)]) + " |" for f in figures]
    return "\n".join(lines) + "\n"


def run_gate_command(args: argparse.Namespace, arms: list[Arm], prog: str = PROG) -> int:
    """--gate: the CI regression gate over the arms of one job (harness.analysis.gate); the arms' settings
    agree (main refused them otherwise)."""
    try:
        result = gate.run_gate(arms, threshold_pct=args.threshold_pct, primary=args.primary, margin_pct=args.margin_pct)
    except (ResultsError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return gate.EXIT_UNUSABLE
    print(gate.format_text(result, wide=args.wide))
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(gate.to_markdown(result))
    if args.json:
        write_json(args.json, gate.to_json(result), indent=2)
    return result.exit_code()
