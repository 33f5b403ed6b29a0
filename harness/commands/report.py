"""``bench report``: one self-contained HTML file from saved results (``harness.analysis.html_report``), and with
``--png`` one PNG of the runs at a glance (``harness.analysis.summary_plot``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis import stats
from harness.analysis.documents import ResultsError
from harness.analysis.html_report import IMAGE_FORMATS, build_report
from harness.analysis.like_for_like import UNLIKE_FLAG, UnlikeArms, refusal
from harness.analysis.summary_plot import save_summary_png

DESCRIPTION = """\
Write one self-contained HTML page (no script, no network) of saved results:
comparison tables and verdicts, latency distributions, codec and IPC budgets,
TTFT over each run, sweep curves and the runs' metadata. The results are
compare files, run files, folders of run files and sweep documents. --png
draws one PNG of the runs at a glance, instead of the page or beside it.

Runs given directly (run files, folders) are judged only when they ran with
the same settings (workload, rate, server, machine): runs that differ are
refused, each difference named, or with --unlike shown side by side without
verdicts. The arms of one compare file, one bench run, are judged as it ran them."""

EPILOG = """\
examples:
  bench report results/compare-X.json -o report.html
  bench report results/compare-X.json --png runs.png
  bench report results/*.json --unlike -o report.html

exit codes: 0 written; 2 unusable input, or arms whose settings differ
(without --unlike)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="compare files, run files, folders of run files, sweep-*.json")
    p.add_argument(
        "-o", "--output", default=None, help="HTML file to write (default report.html; none when --png is given alone)"
    )
    p.add_argument("--title", default="wirebench report", help="the page's title")
    p.add_argument("--image-format", choices=IMAGE_FORMATS, default="png", help="plots as base64 PNG (default) or SVG")
    p.add_argument(
        "--margin-pct",
        type=float,
        default=stats.DEFAULT_MARGIN_PCT,
        help=f"equivalence margin of the verdicts in percent (default {stats.DEFAULT_MARGIN_PCT:g})",
    )
    p.add_argument(
        UNLIKE_FLAG,
        action="store_true",
        help="arms whose settings differ (refused by default, exit 2): show their figures side by side, without "
        "verdicts, under a note naming the differences",
    )
    png = p.add_argument_group("one PNG of the runs at a glance")
    png.add_argument(
        "--png",
        type=Path,
        default=None,
        metavar="PATH",
        help="draw per arm box plots of TTFT, TPOT and ITL (rounds pooled) and the codec's µs per message "
        "into one PNG at PATH; the HTML page is then written only when -o names it",
    )
    png.add_argument("--log-scale", action="store_true", help="the PNG's latency panels on a log scale, for long tails")


PROG = "bench report"


def main(args: argparse.Namespace) -> int:
    html = args.output or (None if args.png else "report.html")
    try:
        # The page first: unlike arms are refused before anything is written.
        text = None
        if html is not None:
            text = build_report(
                args.results, title=args.title, fmt=args.image_format, margin_pct=args.margin_pct, unlike=args.unlike
            )
        if args.png is not None:
            print(f"Plot written to {save_summary_png(args.results, args.png, log=args.log_scale)}")
    except UnlikeArms as exc:
        print(refusal(PROG, exc.lines), file=sys.stderr)
        return 2
    except (ResultsError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if html is None or text is None:
        return 0
    out = Path(html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"Report written to {out} ({len(text.encode()) / 1e6:.2f} MB)")
    return 0
