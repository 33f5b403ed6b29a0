#!/usr/bin/env python
"""CI gate: did the head arm regress against the base arm measured in the same job?

    scripts/check_regression.py COMPARE_JSON [--primary mean_ttft_ms] [--threshold-pct 5]

The same as ``bench compare COMPARE_JSON --gate`` (``harness/analysis/gate.py`` has the
method and the exit codes: 0 pass, 1 regression, 2 unusable input, 3 when the gate
cannot rule out a regression: too noisy, too few rounds, an arm missing, runs left out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis import stats
from harness.analysis.compare import DEFAULT_PRIMARY, arms_from_sources
from harness.analysis.documents import ResultsError
from harness.commands.compare import run_gate_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("compare_file", help="compare-*.json of the job: base first, then head")
    parser.add_argument("--primary", default=DEFAULT_PRIMARY)
    parser.add_argument("--threshold-pct", type=float, default=5.0)
    parser.add_argument("--margin-pct", type=float, default=stats.DEFAULT_MARGIN_PCT)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        arms = arms_from_sources([args.compare_file])
    except (ResultsError, ValueError) as exc:
        print(f"check_regression: error: {exc}", file=sys.stderr)
        return 2
    return run_gate_command(args, arms, prog="check_regression")


if __name__ == "__main__":
    sys.exit(main())
