#!/usr/bin/env python
"""How much load can the client generate before it distorts what it measures?

    .venv/bin/python scripts/studies/client_capacity/client_capacity.py [--workers 1,2,auto] \\
        [--pin split|none] [--duration 8]

Runs ``run_benchmark`` (what ``bench load`` runs) against tests/fake_openai_server.py
with a known timing — TTFT 100 ms, a token every 5 ms, 150 tokens — at rising
Poisson rates, for each --workers setting, and reports the highest rate (and
streamed tokens/s) at which mean TTFT stays within --ttft-tol × 100 ms (2 ms)
of its value at the lowest rate, and p99 ITL within --itl-tol-ms (1 ms, 20 %
of the 5 ms gap) of its value at the lowest rate. The floors are measured, not the configured 100 ms
and 5 ms, because the fake server itself wakes up to ~1 ms late for every
chunk (asyncio rounds timeouts up to whole ms), which an idle client
already sees; the bands are around that floor. Each rate runs --repeat
times and the figures are medians. The machine is a shared, noisy VM: each
row shows the CPU share the hypervisor stole and the share other processes
used; a run that others disturbed (> --max-others %) is rerun.
A setting stops at two failing rates in a row; its capacity is the highest
passing rate before them. The guard's verdict (harness/loadgen/guard.py)
is shown per rate, to check that it fires where the figures go wrong.

Isolation: the fake server runs in its own process (one asyncio loop, as the
test helper has). --pin split pins the server to the first usable CPU and the
client (the parent process and every worker it spawns: affinity is
inherited) to the others; --pin none lets the OS share all CPUs between them.
On a 2-core machine split gives the client one core, so more client
processes cannot add CPU there; none lets them use idle time on both cores
but competes with the server. Run both for the honest picture.

Prints a markdown table and writes the raw rows to --out (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the repository (this file is in scripts/studies/NAME/)
sys.path.insert(0, str(ROOT / "tests"))

from harness.loadgen.runner import LoadSettings, run_benchmark  # noqa: E402
from harness.loadgen.workers import auto_workers, parse_workers, usable_cpus  # noqa: E402
from harness.workloads.sample import SampleRequest  # noqa: E402

from fake_openai_server import FakeConfig, FakeOpenAIServer  # noqa: E402

TTFT_S, GAP_S, TOKENS = 0.100, 0.005, 150
DEFAULT_RATES = "5,10,20,30,40,50,60,80,100,125,150"


def _serve(cpus: list[int] | None, ready: Any, parent: int) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    server = FakeOpenAIServer(FakeConfig(ttft_s=TTFT_S, token_gap_s=GAP_S, num_tokens=TOKENS))
    ready.put(server.start())
    while os.getppid() == parent:  # gone with the script, even when it is killed
        time.sleep(0.5)


def start_server(cpus: list[int] | None) -> tuple[Any, str]:
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(cpus, ready, os.getpid()), daemon=True)
    proc.start()
    return proc, ready.get(timeout=60)


HZ = os.sysconf("SC_CLK_TCK")


def machine_seconds() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq) / HZ, steal / HZ


def own_seconds(server_pid: int) -> tuple[float, float]:
    """CPU seconds of (the client: this script and its reaped load workers, the fake server)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(f"/proc/{server_pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    server = (int(fields[11]) + int(fields[12])) / HZ
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, server


def one_run(base_url: str, server_pid: int, workers: Any, rate: float, duration_s: float, seed: int) -> dict[str, Any]:
    n = max(20, int(rate * duration_s))
    workload = [SampleRequest(f"capacity probe {i}", 4, TOKENS) for i in range(n)]
    settings = LoadSettings(
        request_rate=rate,
        seed=seed,
        workers=workers,
        selected_metrics=("ttft", "itl"),
        percentiles=(99.0,),
        progress=False,
        warmup_requests=4,
    )
    t0, (busy0, steal0), (client0, server0) = time.perf_counter(), machine_seconds(), own_seconds(server_pid)
    result = asyncio.run(run_benchmark(base_url, "fake-model", workload, settings))
    wall, (busy1, steal1), (client1, server1) = time.perf_counter() - t0, machine_seconds(), own_seconds(server_pid)
    own = (client1 - client0) + (server1 - server0)
    capacity = wall * (os.cpu_count() or 1)
    m, h = result.metrics, result.client_health
    assert h is not None
    return {
        "workers": workers,
        "rate": rate,
        "requests": n,
        "failed": m.failed,
        "tokens_per_s": m.output_throughput,
        "ttft_mean_ms": m.ttft.mean,
        "ttft_p99_ms": m.ttft.percentiles[99.0],
        "itl_mean_ms": m.itl.mean,
        "itl_p99_ms": m.itl.percentiles[99.0],
        "schedule_lag_p99_ms": m.schedule_lag.p99_ms,
        "loop_lag_p99_ms": h.loop_lag_p99_ms,
        "coalesced_pct": h.coalesced_share * 100.0,
        "spread_ms": h.barrier_spread_ms,
        "limited": h.limited,
        "reasons": list(h.reasons),
        # Shares of the machine's CPU time: taken by the hypervisor, and used by processes other
        # than this measurement (another job on a shared machine).
        "steal_pct": 100.0 * (steal1 - steal0) / capacity,
        "others_pct": 100.0 * max(0.0, (busy1 - busy0) - own) / capacity,
        # Cores used, in % of one core, over the whole run (spawning the workers included).
        "client_cpu_pct": 100.0 * (client1 - client0) / wall,
        "server_cpu_pct": 100.0 * (server1 - server0) / wall,
    }


def clean_run(
    base_url: str, server_pid: int, workers: Any, rate: float, duration_s: float, seed: int, max_others: float
) -> dict[str, Any]:
    """One run that other processes did not disturb (more than ``max_others`` % of the CPU): up to 4 tries,
    each after waiting (up to QUIET_WAIT_S) for the machine to be quiet."""
    for _ in range(3):
        wait_quiet(server_pid, max_others)
        run = one_run(base_url, server_pid, workers, rate, duration_s, seed)
        if run["others_pct"] <= max_others:
            return run
        print(f"  (rerun: other processes used {run['others_pct']:.0f}% of the CPU)", flush=True)
    wait_quiet(server_pid, max_others)
    return one_run(base_url, server_pid, workers, rate, duration_s, seed)


QUIET_WAIT_S = 900.0


def wait_quiet(server_pid: int, max_others: float, sample_s: float = 3.0) -> None:
    """Wait until other processes use at most ``max_others`` % of the CPU over ``sample_s`` (or give up)."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while time.monotonic() < deadline:
        (busy0, _), own0 = machine_seconds(), sum(own_seconds(server_pid))
        time.sleep(sample_s)
        (busy1, _), own1 = machine_seconds(), sum(own_seconds(server_pid))
        others = 100.0 * max(0.0, (busy1 - busy0) - (own1 - own0)) / (sample_s * (os.cpu_count() or 1))
        if others <= max_others:
            return
    print("  (the machine never got quiet; measuring anyway)", flush=True)


def one_rate(
    base_url: str, server_pid: int, workers: Any, rate: float, duration_s: float, repeat: int, max_others: float
) -> dict[str, Any]:
    """The median of each figure over ``repeat`` runs (this VM is noisy); the guard's count of LIMITED."""
    runs = [clean_run(base_url, server_pid, workers, rate, duration_s, seed, max_others) for seed in range(repeat)]
    row: dict[str, Any] = {"workers": workers, "rate": rate, "requests": runs[0]["requests"]}
    for key, value in runs[0].items():
        if key not in row and isinstance(value, float):
            row[key] = float(np.median([r[key] for r in runs]))
    row["failed"] = sum(r["failed"] for r in runs)
    row["guard"] = f"{sum(r['limited'] for r in runs)}/{repeat} limited"
    row["runs"] = runs
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,auto", help="comma-separated --workers settings (default 1,2,auto)")
    ap.add_argument("--rates", default=DEFAULT_RATES, help=f"request rates to try, ascending (default {DEFAULT_RATES})")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per rate (default 8)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per rate; figures are their medians (default 3)")
    ap.add_argument("--pin", choices=("split", "none"), default="split", help="CPU isolation (see the docstring)")
    ap.add_argument(
        "--ttft-tol",
        type=float,
        default=0.02,
        help="mean TTFT band above the floor, share of 100 ms (0.02)",
    )
    ap.add_argument("--itl-tol-ms", type=float, default=1.0, help="p99 ITL band above the floor, ms (default 1)")
    ap.add_argument(
        "--max-others",
        type=float,
        default=5.0,
        help="rerun a run during which other processes used more than this %% of the CPU (default 5)",
    )
    ap.add_argument("--out", default="results/client_capacity.json", help="raw rows (JSON)")
    args = ap.parse_args()

    cpus = sorted(os.sched_getaffinity(0))
    server_cpus = client_cpus = None
    if args.pin == "split" and len(cpus) > 1:
        server_cpus, client_cpus = cpus[:1], cpus[1:]
    server, base_url = start_server(server_cpus)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    settings = [parse_workers(w) for w in args.workers.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    print(
        f"CPUs {cpus}; server on {server_cpus or 'all'}, client on {client_cpus or 'all'}; "
        f"auto = {auto_workers()} worker(s) here (usable CPUs {usable_cpus()})",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    summary: list[tuple[Any, float | None, float | None]] = []
    try:
        for workers in settings:
            floor_itl: float | None = None
            floor_ttft: float | None = None
            best: dict[str, Any] | None = None
            fails = 0
            for rate in rates:
                row = one_rate(base_url, server.pid, workers, rate, args.duration, args.repeat, args.max_others)
                # Floors: the lowest rate's figures (the fake server's own ~1 ms wake-up lateness is in them).
                floor_ttft = floor_ttft or row["ttft_mean_ms"]
                floor_itl = floor_itl or row["itl_p99_ms"]
                row["ttft_ok"] = row["ttft_mean_ms"] <= floor_ttft + TTFT_S * 1000 * args.ttft_tol
                row["itl_ok"] = row["itl_p99_ms"] <= floor_itl + args.itl_tol_ms
                row["pass"] = row["ttft_ok"] and row["itl_ok"] and row["failed"] == 0
                rows.append(row)
                print(
                    f"workers={workers} rate={rate:g}: TTFT {row['ttft_mean_ms']:.2f} ms, "
                    f"ITL p99 {row['itl_p99_ms']:.2f} ms, {row['tokens_per_s']:.0f} tok/s, "
                    f"guard {row['guard']} -> {'pass' if row['pass'] else 'FAIL'}",
                    flush=True,
                )
                # Capacity: the highest passing rate before two failures in a row (one can be noise).
                if row["pass"]:
                    best, fails = row, 0
                else:
                    fails += 1
                    if fails == 2:
                        break
            summary.append((workers, best["rate"] if best else None, best["tokens_per_s"] if best else None))
    finally:
        server.kill()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"pin": args.pin, "cpus": cpus, "rows": rows}, indent=1, default=str) + "\n")

    cols = [
        ("workers", "workers", ""),
        ("rate", "req/s", "g"),
        ("tokens_per_s", "tok/s", ".0f"),
        ("ttft_mean_ms", "TTFT mean", ".2f"),
        ("ttft_p99_ms", "TTFT p99", ".2f"),
        ("itl_p99_ms", "ITL p99", ".2f"),
        ("schedule_lag_p99_ms", "sched lag p99", ".2f"),
        ("loop_lag_p99_ms", "loop lag p99", ".2f"),
        ("coalesced_pct", "coalesced %", ".2f"),
        ("client_cpu_pct", "client CPU %", ".0f"),
        ("server_cpu_pct", "server CPU %", ".0f"),
        ("steal_pct", "steal %", ".1f"),
        ("others_pct", "others %", ".1f"),
        ("guard", "guard", ""),
        ("pass", "within band", ""),
    ]
    print("\n| " + " | ".join(c[1] for c in cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        cells = []
        for key, _, fmt in cols:
            value = row[key]
            cells.append("n/a" if isinstance(value, float) and math.isnan(value) else format(value, fmt))
        print("| " + " | ".join(cells) + " |")
    print("\n| workers | capacity req/s | streamed tok/s |\n|---|---|---|")
    for workers, cap, tps in summary:
        print(f"| {workers} | {cap if cap is not None else '< lowest'} | {f'{tps:.0f}' if tps else '-'} |")
    print(f"\nRaw rows: {out}")


if __name__ == "__main__":
    main()
