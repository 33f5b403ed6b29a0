"""Do the first requests of a block wait longer than the rest?  Read from a bench run's run files.

In blocks the arms' servers take turns; a server that just went idle may still hold a core the next
arm needs (a real vLLM's worker polls its queue busily for 1 s after its last step). If so, the first
requests of each block show it: their TTFT against the rest of the block's. Per run, the mean TTFT over
the median as well (a mean over 3x the median is a run bench run marks STALLS).

    python scripts/studies/block_handover/first_of_block.py --label no-gap --label gap DIR1 DIR2 \
        --out results/baselines/block-handover.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
from typing import Any

FIRST = 5  # the requests counted as a block's first


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def _summary(values: list[float]) -> dict[str, float | int]:
    return {
        "n": len(values),
        "p50_ms": round(_quantile(values, 0.5), 1),
        "mean_ms": round(statistics.fmean(values), 1),
        "p90_ms": round(_quantile(values, 0.9), 1),
    }


def study(folder: str, block: int) -> dict[str, Any]:
    """The first-of-block and rest TTFTs of every run file in ``folder``, and each run's mean/median."""
    first: list[float] = []
    rest: list[float] = []
    ratios: dict[str, float] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*-r*-*.json"))):
        with open(path) as f:
            doc = json.load(f)
        ttfts = [r["ttft"] * 1000 for r in doc["records"] if r["success"]]
        ratios[os.path.basename(path)] = round(statistics.fmean(ttfts) / statistics.median(ttfts), 2)
        for r in doc["records"]:
            if r["success"]:
                (first if r["index"] % block < FIRST else rest).append(r["ttft"] * 1000)
    return {
        "runs": len(ratios),
        "mean_over_median_max": max(ratios.values()),
        "runs_over_3x": sum(v > 3 for v in ratios.values()),
        f"first_{FIRST}_of_block": _summary(first),
        "rest_of_block": _summary(rest),
        "mean_over_median": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="bench run --result-dir folders")
    parser.add_argument("--label", action="append", default=[], help="a label per folder, in order")
    parser.add_argument("--block-size", type=int, default=20)
    parser.add_argument("--out", help="write the summary here as JSON")
    args = parser.parse_args()
    labels = args.label or args.folders
    if len(labels) != len(args.folders):
        parser.error("give one --label per folder, or none")
    out = {label: study(folder, args.block_size) for label, folder in zip(labels, args.folders)}
    for label, s in out.items():
        first, rest = s[f"first_{FIRST}_of_block"], s["rest_of_block"]
        print(
            f"{label}: {s['runs']} runs, {s['runs_over_3x']} with a mean TTFT over 3x the median; "
            f"first {FIRST} of a block mean {first['mean_ms']} ms p90 {first['p90_ms']}, "
            f"the rest mean {rest['mean_ms']} ms p90 {rest['p90_ms']}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
