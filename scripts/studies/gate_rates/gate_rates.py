#!/usr/bin/env python
"""Run the CI gate's latency recipe as whole jobs, many times, and record what the gate said.

    .venv/bin/python scripts/studies/gate_rates/gate_rates.py --jobs 10 --out results/baselines/gate-aa.json
    .venv/bin/python scripts/studies/gate_rates/gate_rates.py --jobs 10 --inject request-delay=900us \\
        --out results/baselines/gate-inject-10pct.json

Each job is what ``scripts/ci_gate.sh`` runs for latency: one ``bench run`` with
two arms, ``base`` and ``head``, both this checkout's build (an A/A job), then
``bench compare --gate``. With ``--inject OPTION`` the head arm's codec carries
a known cost (``CODEC+OPTION``, the calibration codec: ``request-delay=D`` adds
2·D of busy work to every request's first-token path). The compact document
keeps, per job: the gate's exit code, the primary verdict with its interval, the
paired SD of the rounds, the arms' median TTFT and the job's wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.analysis.documents import SCHEMAS

ROOT = Path(__file__).resolve().parents[3]  # the repository (this file is in scripts/studies/NAME/)
RECIPE = "--executor sim --num-prompts 200 --block-size 20 --repeat 7"


def one_job(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    python = sys.executable
    head = f"--python {python}" + (f" --codec {args.codec}+{args.inject}" if args.inject else f" --codec {args.codec}")
    cmd = [
        python, "-m", "harness.cli", "run",
        "--arm", f"base=--python {python} --codec {args.codec}",
        "--arm", f"head={head}",
        *shlex.split(args.recipe), "--result-dir", str(folder), "--no-progress",
    ]  # fmt: skip
    start = time.monotonic()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    compare_file = max(folder.glob("compare-*.json"), default=None, key=lambda p: p.stat().st_mtime)
    if run.returncode != 0 or compare_file is None:
        return {"exit_code": None, "error": (run.stdout + run.stderr)[-2000:], "wall_s": wall}
    gate_json = folder / "gate.json"
    gate = subprocess.run(
        [python, "-m", "harness.cli", "compare", str(compare_file), "--gate", "--json", str(gate_json)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    doc = json.loads(gate_json.read_text())
    arm = doc["arms"][0]
    compare = json.loads(compare_file.read_text())
    table = compare["table"]
    return {
        "exit_code": gate.returncode,
        "outcome": arm["outcome"],
        "primary": {k: arm["primary"][k] for k in ("verdict", "change_pct", "ci_low_pct", "ci_high_pct", "rounds")},
        "paired_sd_log": paired_sd(compare),
        "ttft_mean_ms": {a: (table[a].get("mean_ttft_ms") or {}).get("median") for a in ("base", "head")},
        "rate": (compare.get("metadata", {}).get("request_rate") or {}).get("rate"),
        "excluded_runs": doc["excluded_runs"],
        "wall_s": round(wall, 1),
    }


def paired_sd(compare: dict[str, Any]) -> float | None:
    by_arm: dict[str, dict[int, float]] = {}
    for run in compare["runs"]:
        value = (run.get("figures") or {}).get("mean_ttft_ms")
        if value and run["status"] == "ok":
            by_arm.setdefault(run["codec"], {})[run["round"]] = value
    base, head = by_arm.get("base", {}), by_arm.get("head", {})
    d = [math.log(head[r] / base[r]) for r in base.keys() & head.keys()]
    return statistics.stdev(d) if len(d) > 1 else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--codec", default="pickle")
    p.add_argument(
        "--inject", default=None, metavar="OPTION", help="a calibration option for head, e.g. request-delay=900us"
    )
    p.add_argument("--recipe", default=RECIPE, help=f"bench run flags of the job (default: {RECIPE})")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    jobs = []
    for i in range(args.jobs):
        with tempfile.TemporaryDirectory(prefix="wb-gate-job-") as tmp:
            job = one_job(args, Path(tmp))
        jobs.append(job)
        said = job.get("primary", {}).get("verdict", job.get("error", ""))[:200]
        print(f"job {i + 1}/{args.jobs}: exit {job['exit_code']} {said} ({job['wall_s']:.0f} s)", flush=True)
        write(args, jobs)
    return 0


def write(args: argparse.Namespace, jobs: list[dict[str, Any]]) -> None:
    codes = [j["exit_code"] for j in jobs]
    doc = {
        "kind": "gate-jobs",
        "schema_version": SCHEMAS["gate-jobs"],
        "command": "scripts/studies/gate_rates/gate_rates.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "recipe": args.recipe,
        "codec": args.codec,
        "inject": args.inject,
        "jobs": len(jobs),
        "exit_codes": {str(c): codes.count(c) for c in sorted(set(codes), key=str)},
        "median_wall_s": statistics.median(j["wall_s"] for j in jobs),
        "per_job": jobs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
