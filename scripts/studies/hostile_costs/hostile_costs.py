"""The cost of the worst request each bound of `bench serve` lets in.

For each bound, a fresh `bench serve` (default flags) serves 20 live streaming
clients (each asks for a new 64-token stream as its last one ends) while a
poller asks ``GET /health`` every 10 ms and a sampler reads the resident memory
of the server's processes (frontend, engine) every 10 ms from /proc. After a
2 s window without it, the hostile request is sent: the largest one the bound
allows (or the bound's number of them at once). The file records, for the
window before and the window while it is handled: the slowest /health answer,
the longest wait of any live stream for its next chunk, and the memory the
server's processes held at their peak above what they held just before.

    python scripts/studies/hostile_costs/hostile_costs.py --out results/baselines/hostile-costs.json
    python scripts/studies/hostile_costs/hostile_costs.py --table results/baselines/hostile-costs.json  # README's table

Only what the client sees and /proc says is recorded; the server is not
instrumented. Bodies are built and JSON-encoded before the windows start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from PIL import Image

from harness.engine.config import EngineConfig
from harness.experiment.server import ServerProcess
from harness.frontend.settings import FrontendSettings
from harness.loadgen import process_cpu
from harness.workloads.datasets import user_message
from harness.workloads.images import to_data_url

MODEL = "wirebench-tiny"
LIVE_STREAMS = 20
LIVE_TOKENS = 64
WINDOW_S = 2.0
DEFAULTS = FrontendSettings()
VOCAB = EngineConfig().vocab_size


def _completion(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 16, **extra}


def _chat_image(url: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [user_message("What is it?", [url])], "max_tokens": 16}


def _flat_image(pixels: int) -> str:
    """A square PNG of about ``pixels`` pixels that compresses to almost nothing (the cheap-to-send kind)."""
    side = int(pixels**0.5)
    return to_data_url(Image.new("RGB", (side, side), (120, 40, 200)))


@dataclass(frozen=True)
class Case:
    name: str
    flag: str
    default: Any
    path: str
    body: Callable[[], dict[str, Any]]
    at_once: int = 1  # how many of it arrive together


def cases() -> list[Case]:
    d = DEFAULTS
    lim = d.limits()
    ctx = d.max_model_len
    stop_len = lim.max_stop_chars // lim.max_stop_strings
    return [
        Case(
            "body of the largest size (a text prompt)",
            "--max-request-bytes",
            d.max_request_bytes,
            "/v1/completions",
            lambda: _completion("a" * (d.max_request_bytes - 200)),
        ),
        Case(
            "most JSON elements (token ids)",
            "--max-json-elements",
            d.max_json_elements,
            "/v1/completions",
            lambda: _completion([7] * (d.max_json_elements - 8)),
        ),
        Case(
            "largest text prompt",
            "--max-prompt-bytes",
            d.max_prompt_bytes,
            "/v1/completions",
            lambda: _completion("lorem ipsum " * (d.max_prompt_bytes // 12)),
        ),
        Case(
            "longest token-id prompt that fits the context",
            "--max-model-len",
            ctx,
            "/v1/completions",
            lambda: _completion([7] * (ctx - 16)),
        ),
        Case(
            "most chat messages",
            "--max-messages",
            lim.max_messages,
            "/v1/chat/completions",
            lambda: {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}] * lim.max_messages,
                "max_tokens": 16,
            },
        ),
        Case(
            "most and longest stop strings (never matched), 256 tokens",
            "--max-stop-strings, --max-stop-chars",
            f"{lim.max_stop_strings}, {lim.max_stop_chars}",
            "/v1/completions",
            lambda: _completion(
                "Stop here",
                max_tokens=256,
                ignore_eos=True,
                stream=True,
                stop=[chr(0x4E00 + i) * stop_len for i in range(lim.max_stop_strings)],
            ),
        ),
        Case(
            "most stop token ids, max_tokens 256 (ends at the first it meets)",
            "--max-stop-token-ids",
            lim.max_stop_token_ids,
            "/v1/completions",
            lambda: _completion(
                "Stop ids",
                max_tokens=256,
                ignore_eos=True,
                stop_token_ids=list(range(VOCAB - lim.max_stop_token_ids, VOCAB)),  # rare ids: it runs to the end
            ),
        ),
        Case(
            "most logit-bias entries, 256 tokens",
            "--max-logit-bias",
            lim.max_logit_bias,
            "/v1/completions",
            lambda: _completion(
                "Bias", max_tokens=256, ignore_eos=True, logit_bias={str(i): 0.5 for i in range(lim.max_logit_bias)}
            ),
        ),
        Case(
            "one image of the most pixels (a flat PNG, small to send)",
            "--max-request-pixels",
            d.max_request_pixels,
            "/v1/chat/completions",
            lambda: _chat_image(_flat_image(d.max_request_pixels)),
        ),
        Case(
            "16 such images at once (the in-flight pixel budget)",
            "--max-inflight-pixels",
            d.max_inflight_pixels,
            "/v1/chat/completions",
            lambda: _chat_image(_flat_image(d.max_request_pixels)),
            at_once=16,
        ),
    ]


# --- what the server's processes hold ---------------------------------------------------------


@dataclass
class Samples:
    """Timestamped observations (time.monotonic()) shared by the probes."""

    health: list[tuple[float, float]] = field(default_factory=list)  # (sent at, seconds to answer)
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (chunk at, seconds since the lane's last)
    rss: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # per role (frontend, engine)


def _sample_rss(roles: dict[str, list[int]], out: Samples, stop: threading.Event) -> None:
    while not stop.is_set():
        out.rss.append((time.monotonic(), {role: process_cpu.resident_bytes(pids) for role, pids in roles.items()}))
        time.sleep(0.01)


async def _health(session: aiohttp.ClientSession, url: str, out: Samples, stop: asyncio.Event) -> None:
    while not stop.is_set():
        sent = time.monotonic()
        async with session.get(url + "/health") as resp:
            await resp.read()
        out.health.append((sent, time.monotonic() - sent))
        await asyncio.sleep(0.01)


async def _lane(session: aiohttp.ClientSession, url: str, out: Samples, stop: asyncio.Event, i: int) -> None:
    body = _completion(f"Live stream {i}", max_tokens=LIVE_TOKENS, ignore_eos=True, stream=True)
    last = time.monotonic()
    while not stop.is_set():
        async with session.post(url + "/v1/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data:"):
                    now = time.monotonic()
                    out.gaps.append((now, now - last))
                    last = now


async def _send(session: aiohttp.ClientSession, url: str, data: bytes) -> int:
    async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        return resp.status


def _window(samples: list[tuple[float, Any]], start: float, end: float) -> list[Any]:
    return [v for t, v in samples if start <= t < end]


async def _measure(case: Case, url: str, roles: dict[str, list[int]]) -> dict[str, Any]:
    data = json.dumps(case.body()).encode()
    out, stop, rss_stop = Samples(), asyncio.Event(), threading.Event()
    sampler = threading.Thread(target=_sample_rss, args=(roles, out, rss_stop), daemon=True)
    sampler.start()
    timeout = aiohttp.ClientTimeout(total=600)
    async with (
        aiohttp.ClientSession(timeout=timeout) as live,
        aiohttp.ClientSession(timeout=timeout) as probe,
        aiohttp.ClientSession(timeout=timeout) as hostile,
    ):
        tasks = [asyncio.create_task(_lane(live, url, out, stop, i)) for i in range(LIVE_STREAMS)]
        tasks.append(asyncio.create_task(_health(probe, url, out, stop)))
        await asyncio.sleep(1.0 + WINDOW_S)  # 1 s to reach a steady state, then the window before
        sent = time.monotonic()
        statuses = await asyncio.gather(*(_send(hostile, url + case.path, data) for _ in range(case.at_once)))
        done = time.monotonic()
        await asyncio.sleep(1.0)  # what the server keeps afterwards
        stop.set()
        await asyncio.gather(*tasks)
    rss_stop.set()
    sampler.join()
    before = (sent - WINDOW_S, sent)

    def mb(role: str | None, start: float, end: float) -> float:
        """The most resident memory in the window: all the server's processes (None), or one role's."""
        return max(sum(v.values()) if role is None else v[role] for v in _window(out.rss, start, end)) / 2**20

    last = out.rss[-1][0]  # 1 s after it was handled
    added = {role: round(mb(role, sent, done + 0.5) - mb(role, *before), 1) for role in (None, *roles)}
    kept = {role: round(mb(role, last, last + 1) - mb(role, *before), 1) for role in (None, *roles)}

    def ms(values: list[float]) -> float:
        return round(1000 * max(values), 1) if values else float("nan")

    return {
        "case": case.name,
        "flag": case.flag,
        "default": case.default,
        "requests": case.at_once,
        "body_bytes": len(data),
        "statuses": sorted(set(statuses)),
        "handled_s": round(done - sent, 3),
        "health_max_ms": {"before": ms(_window(out.health, *before)), "during": ms(_window(out.health, sent, done))},
        "stream_gap_max_ms": {"before": ms(_window(out.gaps, *before)), "during": ms(_window(out.gaps, sent, done))},
        # Resident memory above the window before's peak: at the peak while it was handled (to 0.5 s
        # after), and kept 1 s after (the last sample), in all and per process.
        "rss_peak_added_mb": added.pop(None),
        "rss_kept_mb": kept.pop(None),
        "rss_by_process_mb": {role: {"peak_added": added[role], "kept": kept[role]} for role in roles},
    }


def markdown(doc: dict[str, Any]) -> str:
    """The README's table of one file's cases."""
    lines = [
        "| the request | bound (default) | status | handled in | /health slowest (before → during) "
        "| live streams' longest wait (before → during) | memory, peak added (kept after) |",
        "|---|---|---|---|---|---|---|",
    ]

    def ms(before_during: dict[str, float]) -> str:  # NaN: no sample fell in that window
        b, d = (f"{v:.0f}" if v == v else "–" for v in (before_during["before"], before_during["during"]))
        return f"{b} → {d} ms"

    for c in doc["cases"]:
        lines.append(
            f"| {c['case']} | `{c['flag']}` ({c['default']}) | {', '.join(map(str, c['statuses']))} "
            f"| {c['handled_s']:.2f} s | {ms(c['health_max_ms'])} | {ms(c['stream_gap_max_ms'])} "
            f"| {c['rss_peak_added_mb']:+.0f} MB ({c['rss_kept_mb']:+.0f} MB) |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="measure, and write the document here")
    parser.add_argument("--table", metavar="FILE", help="print the markdown table of a document, measure nothing")
    parser.add_argument("--codec", default="msgspec-oob", help="one that carries images (default %(default)s)")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this text")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())))
        return 0
    if not args.out:
        parser.error("--out or --table is needed")
    rows = []
    for case in cases():
        if args.only and args.only not in case.name:
            continue
        server = ServerProcess(args.codec, [])
        try:
            url = server.wait_ready(120)
            row = asyncio.run(_measure(case, url, process_cpu.server_roles(server.proc.pid)))
        finally:
            server.stop()
        print(json.dumps(row), flush=True)
        rows.append(row)
    doc = {
        "kind": "hostile-costs",
        "schema_version": 1,
        "command": "scripts/studies/hostile_costs/hostile_costs.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v),
        "codec": args.codec,
        "live_streams": LIVE_STREAMS,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "cases": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
