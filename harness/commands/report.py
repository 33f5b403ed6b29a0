"""``bench report``: one self-contained HTML file from saved results (``harness.analysis.html_report``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis import stats
from harness.analysis.documents import ResultsError
from harness.analysis.html_report import IMAGE_FORMATS, build_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="compare files, run files, folders of run files, sweep-*.json")
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    p.add_argument("--title", default="wirebench report", help="the page's title")
    p.add_argument("--image-format", choices=IMAGE_FORMATS, default="png", help="plots as base64 PNG (default) or SVG")
    p.add_argument(
        "--margin-pct",
        type=float,
        default=stats.DEFAULT_MARGIN_PCT,
        help=f"equivalence margin of the verdicts in percent (default {stats.DEFAULT_MARGIN_PCT:g})",
    )


def main(args: argparse.Namespace) -> int:
    try:
        text = build_report(args.results, title=args.title, fmt=args.image_format, margin_pct=args.margin_pct)
    except (ResultsError, ValueError) as exc:
        print(f"bench report: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"Report written to {out} ({len(text.encode()) / 1e6:.2f} MB)")
    return 0
