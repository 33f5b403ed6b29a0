#!/usr/bin/env python
"""Garbage-collector pauses in the server's processes during a seed-preset run, heaps frozen or not.

    .venv/bin/python scripts/studies/gc_pauses/gc_pauses.py [--repeat 2] [--out results/baselines/gc-pauses.json]

Runs ``bench run --preset seed-10245 --codec msgspec,msgspec --arm-flags 'msgspec#2=--no-gc-freeze'``
with a probe on the Python path: a ``sitecustomize`` module that every process of the run imports at
start, which times each collection through ``gc.callbacks`` and appends the slow ones (0.5 ms or more)
and every full (generation-2) one to a file per process. Afterwards each collection is given to the
run whose load window (the run file's ``started_at`` + ``duration``) holds it and to the process that
made it: ``frontend`` (a ``serve`` process) or ``engine`` (a ``serve`` process whose parent is one).
Only collections inside a window count: startup and the scrapes after are left out.

Prints a markdown table and writes the rows to --out (JSON).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository (this file is in scripts/studies/NAME/)

# Imported by every Python process started with the probe's folder on PYTHONPATH.
PROBE = """
import gc, os, sys, time
_start = [0.0]
_path = os.path.join(os.path.dirname(__file__), f"gc-{os.getpid()}.tsv")
def _gc_probe(phase, info):
    if phase == "start":
        _start[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _start[0]) * 1e3
    if ms >= 0.5 or info["generation"] == 2:
        with open(_path, "a") as f:
            argv = " ".join(sys.argv)[:200].replace("\\t", " ")
            f.write(f"{time.time()}\\t{os.getpid()}\\t{os.getppid()}\\t{argv}\\t{info['generation']}\\t{ms}\\n")
gc.callbacks.append(_gc_probe)
"""


def collections(probe_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for path in probe_dir.glob("gc-*.tsv"):
        for line in path.read_text().splitlines():
            t, pid, ppid, argv, gen, ms = line.split("\t")
            rows.append(
                {"t": float(t), "pid": int(pid), "ppid": int(ppid), "argv": argv, "gen": int(gen), "ms": float(ms)}
            )
    return rows


def role(row: dict[str, Any], serve_pids: set[int]) -> str | None:
    if row["pid"] not in serve_pids:
        return None
    return "engine" if row["ppid"] in serve_pids else "frontend"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    full = [r["ms"] for r in rows if r["gen"] == 2]
    return {
        "full_collections": len(full),
        "full_ms_total": round(sum(full), 2),
        "full_ms_max": round(max(full), 2) if full else 0.0,
        "slow_collections": sum(1 for r in rows if r["ms"] >= 0.5),
        "max_ms": round(max((r["ms"] for r in rows), default=0.0), 2),
    }


def run_windows(result_dir: Path) -> list[tuple[str, str, float, float]]:
    """(file, arm, start, end) of each run file, in epoch seconds."""
    out = []
    for path in sorted(result_dir.glob("*-r*-*.json")):
        doc = json.loads(path.read_text())
        start = datetime.datetime.fromisoformat(doc["started_at"]).timestamp()
        out.append((path.name, path.name.rsplit("-r", 1)[0], start, start + float(doc["duration"])))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        probe_dir, result_dir = Path(tmp) / "probe", Path(tmp) / "results"
        probe_dir.mkdir()
        (probe_dir / "sitecustomize.py").write_text(PROBE)
        command = [
            *("bench", "run", "--preset", "seed-10245", "--codec", "msgspec,msgspec"),
            *("--arm-flags", "msgspec#2=--no-gc-freeze", "--repeat", str(args.repeat)),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(probe_dir), os.environ.get("PYTHONPATH")])),
        }
        bench = [str(Path(sys.executable).parent / "bench"), *command[1:], "--result-dir", str(result_dir)]
        done = subprocess.run([*bench, "--no-progress"], env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        rows = collections(probe_dir)
        serve_pids = {r["pid"] for r in rows if " serve " in f" {r['argv']} "}
        runs: list[dict[str, Any]] = []
        for name, arm, start, end in run_windows(result_dir):
            inside = [r for r in rows if start <= r["t"] <= end]
            runs.append(
                {
                    "file": name,
                    "arm": arm,
                    "heaps": "not frozen" if arm == "msgspec#2" else "frozen",
                    "duration_s": round(end - start, 2),
                    **{
                        who: summarize([r for r in inside if role(r, serve_pids) == who])
                        for who in ("frontend", "engine")
                    },
                }
            )
    print("| run | heaps | frontend: full collections (total / max ms) | engine: full collections (total / max ms) |")
    print("| --- | --- | --- | --- |")
    for run in runs:
        cells = [
            f"{run[w]['full_collections']} ({run[w]['full_ms_total']:.1f} / {run[w]['full_ms_max']:.1f})"
            for w in ("frontend", "engine")
        ]
        print(f"| {run['file']} | {run['heaps']} | {cells[0]} | {cells[1]} |")
    if args.out is not None:
        doc = {"command": " ".join(command), "script": "scripts/studies/gc_pauses/gc_pauses.py", "runs": runs}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
