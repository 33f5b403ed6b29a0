#!/usr/bin/env python
"""How fast is one copy of a big buffer after the copying process waited a while?

    .venv/bin/python scripts/studies/copy_after_idle/copy_after_idle.py [--mib 12.0] [--gaps-ms 0.25,0.5,1,2,5] \\
        [--copies 100] [--runs 3]

``bench micro --transport shm`` compares a delivery, whose sender copies the
12.6 MB tensor into the arena once a send, with one memcpy timed back to back
(the same two arrays copied again and again). Between two sends' copies the
sender waits ~0.4-0.5 ms or more for the receiver's reply. This script times the same copy
(numpy's, between the same two preallocated, touched arrays) after a gap of
``g`` ms before each copy, the gap spent two ways:

- ``sleep``: the process blocks (``time.sleep``), as a sender blocked on its socket does;
- ``spin``: the process busy-waits on the clock, touching no memory, so nothing it
  does can push the arrays out of the cache and its core never idles.

A copy that gets slower with a ``spin`` gap lost its arrays from the cache to
something outside this process (other tenants of the host, the hypervisor).
Each row is the median over ``--runs`` runs of each run's p50 over
``--copies`` copies, with the slowest run's p50 beside it; the ratio is that
median over the median of the runs' back-to-back p50s.

Prints a markdown table and writes the rows to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from harness.micro.timing import copy_arrays, last_level_cache_bytes, run_metadata, time_copies_after

TENSOR_MIB = 12.0  # tensor-fp32-1024: 1024 × 1024 × 3 float32, the delivery micro's payload


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(nbytes: int, gaps_ms: list[float], copies: int) -> dict[str, float]:
    """One run: back-to-back p50, then each gap's p50 for sleep and spin (µs)."""
    src, dst = copy_arrays(nbytes)
    row = {"back_to_back": time_copies_after(src, dst, None, copies).p50_us}
    for gap in gaps_ms:
        seconds = gap / 1e3
        row[f"sleep {gap:g}"] = time_copies_after(src, dst, partial(time.sleep, seconds), copies).p50_us
        row[f"spin {gap:g}"] = time_copies_after(src, dst, partial(_spin, seconds), copies).p50_us
    return row


def table(doc: dict[str, Any]) -> str:
    runs = doc["runs"]
    keys = list(runs[0])
    lines = [
        f"one copy of {doc['nbytes'] / 1e6:.1f} MB (numpy), p50 µs: median of {len(runs)} runs (slowest run); "
        f"ratio to back to back; L3 {doc['last_level_cache_bytes'] >> 20} MiB",
        "",
        "| before each copy | p50 µs | slowest run | × back to back |",
        "| --- | --- | --- | --- |",
    ]
    base = float(np.median([r["back_to_back"] for r in runs]))
    for key in keys:
        values = [r[key] for r in runs]
        label = "nothing (back to back)" if key == "back_to_back" else f"{key.split()[0]} {key.split()[1]} ms"
        median = float(np.median(values))
        lines.append(f"| {label} | {median:,.0f} | {max(values):,.0f} | {median / base:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=TENSOR_MIB, help="the buffer's size in MiB")
    parser.add_argument("--gaps-ms", default="0.25,0.5,1,2,5", help="comma-separated gaps before each copy")
    parser.add_argument("--copies", type=int, default=100, help="timed copies per gap and run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the runs here (JSON)")
    args = parser.parse_args()
    gaps = [float(g) for g in args.gaps_ms.split(",") if g]
    nbytes = int(args.mib * (1 << 20))
    doc = {
        "kind": "copy-after-idle",
        "command": "scripts/studies/copy_after_idle/copy_after_idle.py "
        + f"--mib {args.mib:g} --gaps-ms {args.gaps_ms} "
        f"--copies {args.copies} --runs {args.runs}",
        "nbytes": nbytes,
        "last_level_cache_bytes": last_level_cache_bytes(),
        "machine": run_metadata(),
        "runs": [measure(nbytes, gaps, args.copies) for _ in range(args.runs)],
    }
    print(table(doc))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
