#!/usr/bin/env python
"""CI gate: did anything regress against a baseline compare file?

    scripts/check_regression.py CURRENT_COMPARE_JSON BASELINE_COMPARE_JSON [--threshold-pct 5]

The same as ``bench compare CURRENT --baseline BASELINE`` (``harness/analysis/gate.py``
has the method and the exit codes: 0 pass, 1 regression, 2 unusable input,
3 when the gate cannot rule out a regression: too noisy, too few rounds, a codec missing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis import stats
from harness.commands.compare import run_gate_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("current", help="compare-*.json of the run under test")
    parser.add_argument("baseline", help="compare file to judge it against (e.g. results/baselines/...)")
    parser.add_argument("--threshold-pct", type=float, default=5.0)
    parser.add_argument("--margin-pct", type=float, default=stats.DEFAULT_MARGIN_PCT)
    parser.add_argument("--ratios-only", action="store_true")
    parser.add_argument("--fail-on-noise", action="store_true")
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.sources = [args.current]
    return run_gate_command(args, prog="check_regression")


if __name__ == "__main__":
    sys.exit(main())
