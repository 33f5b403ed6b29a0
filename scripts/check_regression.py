#!/usr/bin/env python
"""CI check: did any codec get slower relative to the reference codec?

    scripts/check_regression.py CURRENT_COMPARE_JSON BASELINE_COMPARE_JSON [--threshold-pct 5]

Both files are ``compare-*.json`` of ``bench run``. Absolute milliseconds do
not carry across machines, so every figure is taken as a ratio to the
reference codec of the same file (the current file's first codec; the
baseline must have measured it too): ratio = codec median / reference median.
All compared figures are lower-is-better, so a ratio that grew by more than
the threshold (in percent of the baseline ratio) is a regression.

Exit status: 0 no regression, 1 at least one regression, 2 unreadable or
incomparable input. Codecs present on one side only are listed, not failed.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Any

from harness.results import ResultsError, load_compare
from harness.table import format_table

# (label, key of the compare table); all lower-is-better.
FIGURES = [
    ("TTFT mean", "mean_ttft_ms"),
    ("TPOT mean", "mean_tpot_ms"),
    ("ITL mean", "mean_itl_ms"),
    ("req enc µs", "request_encode_us"),
    ("req dec µs", "request_decode_us"),
]
REGRESSION = "REGRESSION"


@dataclass
class Row:
    codec: str
    figure: str
    baseline: float | None
    current: float | None
    verdict: str
    noisy: bool = False

    @property
    def change_pct(self) -> float | None:
        if self.baseline is None or self.current is None:
            return None
        return (self.current / self.baseline - 1.0) * 100.0


def _measured(doc: dict[str, Any]) -> list[str]:
    table = doc["table"]
    return [c for c in doc["codecs"] if isinstance(table.get(c), dict) and table[c].get("measured")]


def _cell(doc: dict[str, Any], codec: str, key: str) -> dict[str, Any] | None:
    cell = (doc["table"].get(codec) or {}).get(key)
    if not isinstance(cell, dict):
        return None
    median = cell.get("median")
    if not isinstance(median, (int, float)) or not math.isfinite(median):
        return None
    return cell


def _ratio(doc: dict[str, Any], codec: str, reference: str, key: str) -> float | None:
    a, r = _cell(doc, codec, key), _cell(doc, reference, key)
    if a is None or r is None or r["median"] <= 0:
        return None
    return a["median"] / r["median"]


def _spread(doc: dict[str, Any], codec: str, key: str) -> float:
    cell = _cell(doc, codec, key)
    spread = cell.get("spread_pct") if cell else None
    return float(spread) if isinstance(spread, (int, float)) else 0.0


def compare(current: dict[str, Any], baseline: dict[str, Any], reference: str, threshold_pct: float) -> list[Row]:
    """One row per (non-reference codec, figure)."""
    cur_measured, base_measured = _measured(current), _measured(baseline)
    codecs = list(dict.fromkeys([*current["codecs"], *baseline["codecs"]]))
    rows = []
    for codec in codecs:
        if codec == reference:
            continue
        if codec not in base_measured or codec not in cur_measured:
            side = "baseline" if codec not in base_measured else "current"
            rows.append(Row(codec, "(all)", None, None, f"not measured in {side}"))
            continue
        for label, key in FIGURES:
            base, cur = _ratio(baseline, codec, reference, key), _ratio(current, codec, reference, key)
            if base is None or cur is None or base <= 0:
                rows.append(Row(codec, label, base, cur, "n/a (figure missing)"))
                continue
            change = (cur / base - 1.0) * 100.0
            verdict = REGRESSION if change > threshold_pct else "improved" if change < -threshold_pct else "ok"
            # Round-to-round spread above the threshold: the verdict may be noise.
            noisy = max(_spread(d, c, key) for d in (current, baseline) for c in (codec, reference)) > threshold_pct
            rows.append(Row(codec, label, base, cur, verdict, noisy))
    return rows


def format_rows(rows: list[Row]) -> list[str]:
    headers = ["codec", "figure", "baseline ratio", "current ratio", "change", "verdict"]

    def fmt(x: float | None, spec: str, suffix: str = "") -> str:
        return "-" if x is None else format(x, spec) + suffix

    table = [
        [
            r.codec,
            r.figure,
            fmt(r.baseline, ".3f"),
            fmt(r.current, ".3f"),
            fmt(r.change_pct, "+.1f", "%"),
            r.verdict + (" *" if r.noisy else ""),
        ]
        for r in rows
    ]
    return format_table(headers, table, left=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("current", help="compare-*.json of the run under test")
    parser.add_argument("baseline", help="compare-*.json to compare against (e.g. results/baselines/...)")
    parser.add_argument(
        "--threshold-pct",
        type=float,
        default=5.0,
        help="a ratio worse than the baseline's by more than this is a regression (default 5)",
    )
    args = parser.parse_args(argv)
    if not args.threshold_pct >= 0:
        parser.error(f"--threshold-pct must be >= 0, got {args.threshold_pct}")

    try:
        current, baseline = load_compare(args.current), load_compare(args.baseline)
    except ResultsError as exc:
        print(f"check_regression: error: {exc}", file=sys.stderr)
        return 2
    cur_measured = _measured(current)
    if not cur_measured:
        print(f"check_regression: error: {args.current}: no codec was measured", file=sys.stderr)
        return 2
    reference = current["codecs"][0]
    if reference not in cur_measured or reference not in _measured(baseline):
        side = args.current if reference not in cur_measured else args.baseline
        print(
            f"check_regression: error: the reference codec {reference!r} (first codec of {args.current}) "
            f"was not measured in {side}; ratios cannot be formed",
            file=sys.stderr,
        )
        return 2

    base_ref = baseline["codecs"][0]
    print(
        f"ratios = codec / {reference} (the reference codec) within each file; lower is better; "
        f"threshold {args.threshold_pct:g}%"
    )
    if base_ref != reference:
        print(f"note: the baseline's first codec is {base_ref!r}; its ratios are taken to {reference!r} too")
    rows = compare(current, baseline, reference, args.threshold_pct)
    if not rows:
        print(f"nothing to compare: only {reference} is in the files")
        return 0
    print("\n".join(format_rows(rows)))
    if any(r.noisy for r in rows):
        print(
            f"* a round-to-round spread in these figures exceeds {args.threshold_pct:g}%: "
            "the verdict may be noise (more --repeat rounds narrow it)"
        )
    regressions = [r for r in rows if r.verdict == REGRESSION]
    missing = sorted({r.codec for r in rows if r.verdict.startswith("not measured")})
    if missing:
        print(f"not compared (measured on one side only): {', '.join(missing)}")
    print(f"{len(regressions)} regression(s)" if regressions else "no regression")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
