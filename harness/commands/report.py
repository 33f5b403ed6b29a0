"""``bench report``: one self-contained HTML file from saved results (``harness.analysis.html_report``), and with
``--png`` one PNG of the runs at a glance (``harness.analysis.summary_plot``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis import stats
from harness.analysis.documents import ResultsError
from harness.analysis.html_report import IMAGE_FORMATS, build_report
from harness.analysis.summary_plot import save_summary_png

DESCRIPTION = """\
Write one self-contained HTML page (no script, no network) of saved results:
comparison tables and verdicts, latency distributions, codec and IPC budgets,
TTFT over each run, sweep curves and the runs' metadata. The results are
compare files, run files, folders of run files and sweep documents. --png
draws one PNG of the runs at a glance, instead of the page or beside it."""

EPILOG = """\
examples:
  bench report results/compare-X.json -o report.html
  bench report results/compare-X.json --png runs.png"""


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


def main(args: argparse.Namespace) -> int:
    html = args.output or (None if args.png else "report.html")
    try:
        if args.png is not None:
            print(f"Plot written to {save_summary_png(args.results, args.png, log=args.log_scale)}")
        if html is None:
            return 0
        text = build_report(args.results, title=args.title, fmt=args.image_format, margin_pct=args.margin_pct)
    except (ResultsError, ValueError) as exc:
        print(f"bench report: error: {exc}", file=sys.stderr)
        return 2
    out = Path(html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"Report written to {out} ({len(text.encode()) / 1e6:.2f} MB)")
    return 0
