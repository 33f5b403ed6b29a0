#!/usr/bin/env python
"""The CI gate's false-alarm rate and power at its defaults, simulated with the noise measured here.

    .venv/bin/python scripts/studies/gate_rates/gate_power.py [--jobs 20000] [--seed 1] [FILES...]

The noise model is the paired one the gate tests: per round, the log ratio of
head's to base's TTFT mean, with the SD measured on committed A/A runs of one
build in blocks (default: the ``calibrate-sim-blocks*.json`` and
``aa-blocks-*.json`` baselines; ``--jobs-file`` takes the gate's own A/A
jobs, ``results/baselines/gate-aa.json``). Each simulated job draws ``--rounds`` such ratios (Gaussian, and
Student t with 4 df for heavier tails), scaled by a true change, and is
judged by ``harness.analysis.gate``'s own rule on the primary verdict (``stats.judge_gatekept``):
exit 1 only for "slower" by more than the threshold, 3 when the interval
reaches past it without a verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import numpy as np

from harness.analysis import gate, stats
from harness.analysis.figures import DETECTION_FIGURE
from harness.analysis.verdicts import VerdictCell, common_rounds, load_any_compare

ROOT = Path(__file__).resolve().parents[3]  # the repository (this file is in scripts/studies/NAME/)
DEFAULT_FILES = sorted((ROOT / "results" / "baselines").glob("calibrate-sim-blocks*.json")) + sorted(
    (ROOT / "results" / "baselines").glob("aa-blocks-*.json")
)


def paired_sd(path: Path, key: str = DETECTION_FIGURE.key) -> float:
    """SD of ln(second arm / first arm) per round of the file's first two arms (an A/A pair)."""
    a, b = (arm.judged() for arm in load_any_compare(path)[:2])
    rounds = common_rounds(a, b) or []
    va, vb = dict(zip(a.rounds(), a.values(key))), dict(zip(b.rounds(), b.values(key)))
    return statistics.stdev([math.log(vb[r] / va[r]) for r in rounds])


def exit_code(d: np.ndarray, threshold_pct: float) -> int:
    """The gate's exit for one job whose per-round log ratios are d (head against base)."""
    ones = [1.0] * len(d)
    pair = stats.compare_arms(ones, np.exp(d).tolist(), paired=True)
    (verdict,), _ = stats.judge_gatekept([pair], [[]], primary_higher_is_better=False, secondary_higher_is_better=[])
    outcome = gate._outcome(VerdictCell("head", DETECTION_FIGURE, pair, verdict, "primary"), threshold_pct)
    return {gate.REGRESSION: 1, gate.NOISY: 3}.get(outcome, 0)


def rates(rng: np.random.Generator, sd: float, effect_pct: float, args: argparse.Namespace, tails: str) -> list[float]:
    shape = (args.jobs, args.rounds)
    noise = rng.standard_normal(shape) if tails == "normal" else rng.standard_t(4, shape) / math.sqrt(2.0)
    d = math.log1p(effect_pct / 100) + sd * noise
    codes = [exit_code(row, args.threshold_pct) for row in d]
    return [codes.count(c) / len(codes) for c in (0, 1, 3)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES, help="A/A compare files (first two arms)")
    p.add_argument(
        "--jobs-file",
        type=Path,
        default=None,
        help="a gate-jobs document (gate_rates.py, beside this): its jobs' paired SDs (median and largest) instead",
    )
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=stats.DEFAULT_ROUNDS)
    p.add_argument("--threshold-pct", type=float, default=5.0)
    p.add_argument("--effects-pct", default="0,5,10,20")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    if args.jobs_file is not None:
        per_job = [
            j["paired_sd_log"] for j in json.loads(args.jobs_file.read_text())["per_job"] if j.get("paired_sd_log")
        ]
        name = args.jobs_file.name
        sds = {f"{name}, median of {len(per_job)} jobs": statistics.median(per_job), f"{name}, largest": max(per_job)}
    else:
        sds = {f.name: paired_sd(f) for f in args.files}
    print("paired SD of ln(TTFT mean ratio) per round, measured here:")
    for name, sd in sds.items():
        print(f"  {name}: {sd:.4f}")
    effects = [float(x) for x in args.effects_pct.split(",")]
    print(
        f"\n{args.jobs} simulated jobs per cell, {args.rounds} rounds, threshold {args.threshold_pct:g}%: "
        "share of exit 0 / 1 / 3\n"
    )
    print("| SD (file) | tails | " + " | ".join(f"true change {e:+g}%" for e in effects) + " |")
    print("|---|---|" + "---|" * len(effects))
    for name, sd in sorted(sds.items(), key=lambda kv: kv[1]):
        for tails in ("normal", "t4"):
            cells = []
            for e in effects:
                ok, reg, noisy = rates(rng, sd, e, args, tails)
                cells.append(f"{ok:.1%} / {reg:.1%} / {noisy:.1%}")
            print(f"| {sd:.3f} ({name}) | {tails} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
