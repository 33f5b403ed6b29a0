#!/usr/bin/env python
"""The false-alarm rate and power of ``--until-resolved`` (harness/analysis/sequential.py) under
optional stopping: by simulation, and by replaying the block pairs of a recorded run.

    .venv/bin/python scripts/studies/sequential_calibration/sequential_calibration.py \\
        [--simulations 2000] [--replay COMPARE.json ...] [--out FILE.json]

A run under ``--until-resolved`` looks after every round (``--look-every`` block pairs) and stops
at the first look where the primary figure is resolved, or when the time is up (``--max-pairs``).
Each simulated run is a sequence of per-pair log differences; it counts as a false alarm when the
procedure ever says "slower" or "faster" with no true change, and as a detection when it says
"slower" with a true one. The decisions come from the module's own ``evaluate`` (the evidence over
every prefix), so the rates are the procedure's. Beside it, the fixed-sample t test of
``harness.analysis.stats`` applied at every look, as a run that simply tops up rounds would.

Noise: Gaussian, and Student t with 3 degrees of freedom (heavy tails, as TTFT blocks have).
Replay: the reference arm's and an A/A arm's block pairs of a compare document (its runs embed
their blocks); each replayed run draws pairs from them with replacement and a random sign (the
A/A null: a difference and its negative are equally likely), and adds the true change for power.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from harness.analysis.blocks import paired_log_diffs
from harness.analysis.sequential import critical_t
from harness.analysis.stats import ALPHA
from harness.analysis.student_t import t_ppf
from harness.analysis.verdicts import load_any_compare


def crossings(diffs: np.ndarray, looks: np.ndarray, fixed: bool) -> np.ndarray:
    """Per simulated run (row): the first look at which the test says "different" (-1: never).
    fixed=False: the anytime-valid test (any prefix's |t| over its critical t, as ``evaluate``'s
    largest evidence); True: the fixed-sample t test at each look."""
    n = np.arange(1, diffs.shape[1] + 1)
    cs, cs2 = np.cumsum(diffs, 1), np.cumsum(diffs * diffs, 1)
    mean = cs / n
    var = np.maximum(cs2 - n * mean * mean, 0.0) / np.maximum(n - 1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(mean) / np.sqrt(var / n)
    t[:, 0] = 0.0
    if fixed:
        crit = np.array([math.inf] + [t_ppf(1 - ALPHA / 2, k - 1) for k in n[1:]])
        hit = t[:, looks - 1] >= crit[looks - 1]
    else:
        crit = np.array([critical_t(int(k)) for k in n])
        ever = np.maximum.accumulate(t >= crit, axis=1)  # evidence crossed at some prefix so far
        hit = ever[:, looks - 1]
    first = np.where(hit.any(1), hit.argmax(1), -1)
    return first


def rates(diffs: np.ndarray, looks: np.ndarray, effect_log: float) -> dict[str, float]:
    """Share of runs found different (any look), and the median pairs to detection of those found."""
    out: dict[str, float] = {}
    for name, fixed in (("anytime", False), ("fixed_t_every_look", True)):
        first = crossings(diffs, looks, fixed)
        found = first >= 0
        out[f"{name}_found"] = float(found.mean())
        if effect_log > 0 and found.any():
            out[f"{name}_median_pairs"] = float(np.median(looks[first[found]]))
    return out


def simulate(args: argparse.Namespace, rng: np.random.Generator) -> list[dict]:
    looks = np.arange(args.look_every, args.max_pairs + 1, args.look_every)
    rows = []
    for noise in ("normal", "t3"):
        for effect_sd in (0.0, 0.1, 0.2, 0.3, 0.5):  # the true change in SDs of one pair's difference
            shape = (args.simulations, args.max_pairs)
            base = rng.standard_normal(shape) if noise == "normal" else rng.standard_t(3, shape) / math.sqrt(3)
            row = {"noise": noise, "effect_sd": effect_sd, **rates(base + effect_sd, looks, effect_sd)}
            rows.append(row)
    return rows


def replay(path: str, args: argparse.Namespace, rng: np.random.Generator) -> list[dict]:
    arms = load_any_compare(path)
    ref = arms[0]
    rows = []
    for arm in arms[1:]:
        pairs = np.array(paired_log_diffs(ref.judged().blocks(), arm.judged().blocks(), "mean_ttft_ms"))
        if pairs.size < 10:
            continue
        centred = pairs - pairs.mean()  # the A/A null whatever this arm's true change
        looks = np.arange(args.look_every, args.max_pairs + 1, args.look_every)
        for effect_pct in (0.0, 1.0, 2.0, 5.0):
            draw = rng.choice(centred, size=(args.simulations, args.max_pairs))
            draw *= rng.choice([-1.0, 1.0], size=draw.shape)
            effect = math.log1p(effect_pct / 100)
            row = {
                "source": Path(path).name,
                "arm": arm.label,
                "pairs_recorded": int(pairs.size),
                "sd_pct": float(100 * pairs.std(ddof=1)),
                "effect_pct": effect_pct,
                **rates(draw + effect, looks, effect),
            }
            rows.append(row)
    return rows


def table(rows: list[dict], keys: list[str]) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k, "-")) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--simulations", type=int, default=2000)
    p.add_argument("--max-pairs", type=int, default=300, help="block pairs a run has time for")
    p.add_argument("--look-every", type=int, default=10, help="block pairs per round (one look a round)")
    p.add_argument("--replay", nargs="*", default=[], metavar="COMPARE.json")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    simulated = simulate(args, rng)
    print(f"simulated: {args.simulations} runs each, looks every {args.look_every} pairs up to {args.max_pairs}")
    keys = ["noise", "effect_sd", "anytime_found", "anytime_median_pairs", "fixed_t_every_look_found"]
    print(table(simulated, keys))
    replayed = [row for path in args.replay for row in replay(path, args, rng)]
    if replayed:
        print("\nreplayed from recorded block pairs:")
        keys = ["source", "arm", "pairs_recorded", "sd_pct", "effect_pct", "anytime_found", "anytime_median_pairs"]
        print(table(replayed, keys + ["fixed_t_every_look_found"]))
    print(f"\n{time.monotonic() - started:.0f} s")
    if args.out:
        doc = {"settings": vars(args), "simulated": simulated, "replayed": replayed}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
