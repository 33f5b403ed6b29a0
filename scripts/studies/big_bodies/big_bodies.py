"""How long /health waits while several of the largest JSON bodies arrive at once (loopback, bounded).

A fresh `bench serve --codec msgspec-oob` (tiny model); a prober process polls /health every 10 ms;
the bodies (a text prompt filling the body, refused after parsing for its length) are encoded
before any timer starts. Prints each round's statuses and /health's slowest answer; ``--out``
also writes them to a JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import time
import urllib.request
from datetime import UTC, datetime
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import aiohttp

from harness.experiment.server import ServerProcess


def _probe(url: str, stop: Event, out: Queue) -> None:
    worst = 0.0
    while not stop.is_set():
        t0 = time.monotonic()
        urllib.request.urlopen(url, timeout=30).read()
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.01)
    out.put(worst)


async def _send(base: str, body: bytes) -> int:
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s, s.post(f"{base}/v1/completions", data=body, headers=headers) as r:
        await r.read()
        return r.status


async def _burst(base: str, body: bytes, n: int) -> list[int]:
    return await asyncio.wait_for(asyncio.gather(*(_send(base, body) for _ in range(n))), 120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bodies", type=int, default=8, help="bodies sent at once")
    p.add_argument("--mb", type=float, default=60.0, help="each body's size, MB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, help="also write the rounds to this JSON file")
    args = p.parse_args()
    prompt = "a" * int(args.mb * 1e6)
    body = json.dumps({"model": "wirebench-tiny", "prompt": prompt, "max_tokens": 16}).encode()
    server = ServerProcess("msgspec-oob", [])
    base = server.wait_ready(120)
    ctx = multiprocessing.get_context("spawn")
    rounds = []
    try:
        for r in range(args.rounds):
            stop, out = ctx.Event(), ctx.Queue()
            prober = ctx.Process(target=_probe, args=(f"{base}/health", stop, out))
            prober.start()
            time.sleep(1.0)
            t0 = time.monotonic()
            statuses = asyncio.run(_burst(base, body, args.bodies))
            took = time.monotonic() - t0
            time.sleep(0.3)
            stop.set()
            worst = out.get(timeout=30)
            prober.join()
            print(
                f"round {r}: {args.bodies} x {args.mb:g} MB, statuses {sorted(set(statuses))}, "
                f"all answered in {took:.2f} s, /health slowest {worst * 1000:.0f} ms",
                flush=True,
            )
            rounds.append(
                {"statuses": sorted(set(statuses)), "answered_s": round(took, 2), "health_max_ms": round(worst * 1000)}
            )
    finally:
        server.stop()
    if args.out:
        doc = {
            "study": "big_bodies",
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "machine": {"cpus": multiprocessing.cpu_count(), "python": platform.python_version()},
            "bodies": args.bodies,
            "mb": args.mb,
            "rounds": rounds,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
