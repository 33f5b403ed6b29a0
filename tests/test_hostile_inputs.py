"""Hostile inputs against a real server: compressed bodies, big JSON bodies, a peer that ignores the bounds.

Each test is bounded in time and checks outcomes (statuses, error outputs, memory bounds), never a speed.
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib

import aiohttp
import pytest

from serve_process import start_serve

MODEL = "wirebench-tiny"


def _bomb(inflated_bytes: int, wbits: int) -> bytes:
    """``inflated_bytes`` of spaces, compressed (gzip for wbits 31, zlib 'deflate' for 15): ~1000:1."""
    comp = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = b" " * (1 << 20)
    parts = [comp.compress(block) for _ in range(inflated_bytes >> 20)]
    return b"".join(parts) + comp.flush()


def _resident_mb(pid: int) -> float:
    from harness.loadgen.process_cpu import resident_bytes

    return resident_bytes([pid]) / 2**20


@pytest.mark.slow
def test_compressed_bodies_are_refused_unread_and_identity_is_served():
    """Two 256 MiB gzip/deflate bombs at once: 415 within seconds, /health answers, and the frontend does
    not grow by anything near the inflated size; ``Content-Encoding: identity`` is an ordinary request."""
    bombs = [_bomb(256 << 20, 31), _bomb(256 << 20, 15)]
    assert all(len(b) < 2 << 20 for b in bombs)
    server = start_serve(codec="msgspec")
    base = server.base_url
    pid = server.proc.pid
    peak, stop = [0.0], False

    def sample() -> None:
        while not stop:
            peak[0] = max(peak[0], _resident_mb(pid))
            time.sleep(0.01)

    async def post(session: aiohttp.ClientSession, body: bytes, encoding: str) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
        async with session.post(f"{base}/v1/completions", data=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def health_worst(session: aiohttp.ClientSession, until: asyncio.Future) -> float:
        worst = 0.0
        while not until.done():
            t0 = time.monotonic()
            async with session.get(f"{base}/health") as resp:
                assert resp.status == 200
            worst = max(worst, time.monotonic() - t0)
            await asyncio.sleep(0.02)
        return worst

    async def scenario() -> tuple[list[tuple[int, dict]], float, tuple[int, dict]]:
        async with aiohttp.ClientSession() as session, aiohttp.ClientSession() as prober:
            attack = asyncio.gather(post(session, bombs[0], "gzip"), post(session, bombs[1], "deflate"))
            worst = asyncio.create_task(health_worst(prober, attack))
            replies = await asyncio.wait_for(attack, 5.0)
            plain = b'{"model": "%s", "prompt": "hello", "max_tokens": 2}' % MODEL.encode()
            return replies, await worst, await post(session, plain, "identity")

    try:
        before = _resident_mb(pid)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        replies, worst_health_s, identity = asyncio.run(scenario())
        stop = True
        sampler.join()
    finally:
        server.stop()
    for status, body in replies:
        assert status == 415, body
        assert body["error"]["code"] == 415 and "Content-Encoding" in body["error"]["message"]
    assert identity[0] == 200, identity
    assert worst_health_s < 0.5, worst_health_s
    assert peak[0] - before < 64, (before, peak[0])
