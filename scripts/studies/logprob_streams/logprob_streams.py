"""Frontend memory and /health's slowest answer while long top-20 logprob streams are served.

32 streamed completions (``logprobs: 20``, ``max_tokens: 2000``, ``ignore_eos``) beside 10 live
streams (64-token streams, one after another), on a fresh `bench serve --codec msgspec-oob` (tiny
model) with the given server flags; /health polled every 10 ms from a separate process; the
frontend's resident memory sampled every 50 ms from /proc.

    python scripts/studies/logprob_streams/logprob_streams.py --rounds 2 --out results/baselines/logprob-streams.json
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing as mp
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp

from harness.experiment.server import ServerProcess
from harness.loadgen import process_cpu

MODEL = "wirebench-tiny"
LONG, LONG_TOKENS, LIVE = 32, 2000, 10


def poll_health(url: str, stop: Any, out: Any) -> None:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=30)
    worst, n, slow = 0.0, 0, 0
    while not stop.is_set():
        t = time.monotonic()
        conn.request("GET", "/health")
        conn.getresponse().read()
        d = time.monotonic() - t
        worst, n = max(worst, d), n + 1
        slow += d > 0.1
        time.sleep(0.01)
    out.put((worst, n, slow))


async def long_stream(s: aiohttp.ClientSession, url: str, i: int, counts: list[int]) -> None:
    body = {
        "model": MODEL,
        "prompt": f"Long stream {i}",
        "max_tokens": LONG_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "logprobs": 20,
    }
    async with s.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200, r.status
        async for line in r.content:
            if line.startswith(b"data:"):
                counts[i] += 1


async def live(s: aiohttp.ClientSession, url: str, i: int, stop: asyncio.Event) -> None:
    body = {"model": MODEL, "prompt": f"Live {i}", "max_tokens": 64, "ignore_eos": True, "stream": True}
    while not stop.is_set():
        async with s.post(url + "/v1/completions", json=body) as r:
            async for _ in r.content:
                pass


async def run(url: str, front: list[int]) -> dict[str, Any]:
    rss: list[tuple[float, int]] = []
    rss_stop = threading.Event()

    def sample() -> None:
        while not rss_stop.is_set():
            rss.append((time.monotonic(), process_cpu.resident_bytes(front)))
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    hstop, hout = mp.Event(), mp.Queue()  # type: ignore[var-annotated]
    poller = mp.Process(target=poll_health, args=(url, hstop, hout))
    poller.start()
    stop = asyncio.Event()
    counts = [0] * LONG
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as s:
        lives = [asyncio.create_task(live(s, url, i, stop)) for i in range(LIVE)]
        await asyncio.sleep(2.0)
        base = rss[-1][1]
        t0 = time.monotonic()
        await asyncio.gather(*(long_stream(s, url, i, counts) for i in range(LONG)))
        took = time.monotonic() - t0
        stop.set()
        await asyncio.gather(*lives)
    hstop.set()
    worst, n, slow = hout.get()
    poller.join()
    rss_stop.set()
    during = [v for t, v in rss if t >= t0]

    def mb(b: int) -> float:
        return round(b / 2**20, 1)

    # memory over the run: at each quarter of it
    q = [mb(during[int(k * (len(during) - 1) / 4)]) for k in range(5)]
    return {
        "long_streams_s": round(took, 1),
        "chunks": sum(counts),
        "frontend_mb_before": mb(base),
        "frontend_mb_peak": mb(max(during)),
        "frontend_peak_added_mb": mb(max(during) - base),
        "frontend_mb_by_quarter": q,
        "health_max_ms": round(worst * 1000),
        "health_polls": n,
        "health_over_100ms": slow,
    }


def one(flags: list[str]) -> dict[str, Any]:
    server = ServerProcess("msgspec-oob", flags)
    try:
        url = server.wait_ready(120)
        roles = process_cpu.server_roles(server.proc.pid)
        return {"flags": flags, **asyncio.run(run(url, roles["frontend"]))}
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=2, help="fresh servers per executor")
    p.add_argument("--out", type=Path, help="also write the rounds to this JSON file")
    args = p.parse_args()
    rows = []
    for flags in ([], ["--executor", "sim"]):
        for _ in range(args.rounds):
            rows.append(one(flags))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        doc = {
            "study": "logprob_streams",
            "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "cpus": mp.cpu_count(),
            "long_streams": LONG,
            "tokens": LONG_TOKENS,
            "live_streams": LIVE,
            "rounds": rows,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
