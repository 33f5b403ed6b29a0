"""torch-shm, shm-store and cuda-ipc end to end: real processes, real /dev/shm, faults caught by --verify."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest

from serve_process import chat_with_images, leftovers_of, start_serve, still_alive

pytestmark = pytest.mark.slow  # each test starts real server processes

PAYLOAD = ("--mm-payload", "tensor", "--shm-threshold", "1024", "--executor", "sim")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def store_counts(base: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("wirebench_frontend_mm_store_total{"):
            event = line.split('event="', 1)[1].split('"', 1)[0]
            out[event] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize("transport", ["torch-shm", "shm-store"])
def test_images_travel_and_nothing_outlives_a_clean_stop(transport):
    server = start_serve("--transport", transport, *PAYLOAD, codec="msgspec-oob")
    pids = server.pids
    try:
        results = asyncio.run(chat_with_images(server.base_url, list(range(12))))
        again = asyncio.run(chat_with_images(server.base_url, list(range(12))))
        counts = asyncio.run(store_counts(server.base_url)) if transport == "shm-store" else {}
    finally:
        assert server.stop() == 0
    assert [status for status, _ in results + again] == [200] * 24
    if transport == "shm-store":  # the second round sends the same images: every one a hit
        assert counts["miss"] == 12 and counts["hit"] >= 12, counts
    assert leftovers_of(pids) == []


def test_a_small_store_evicts_and_serves_every_request():
    # 64×64 RGB float16 pixels: 24 KiB a frame, room for two.
    small = ("--mm-tensor-size", "64", "--mm-store-bytes", "60000")
    server = start_serve("--transport", "shm-store", *small, *PAYLOAD, codec="msgspec-oob")
    try:
        for seed in range(6):  # one at a time: each new image evicts an old one
            assert [s for s, _ in asyncio.run(chat_with_images(server.base_url, [seed]))] == [200]
        at_once = asyncio.run(chat_with_images(server.base_url, list(range(100, 112))))  # more than fit, all in flight
        counts = asyncio.run(store_counts(server.base_url))
    finally:
        assert server.stop() == 0
    assert [s for s, _ in at_once] == [200] * 12
    assert counts["miss"] == 18 and counts["eviction"] >= 4, counts  # fallbacks: tests/test_mm_store.py


@pytest.mark.parametrize("transport", ["torch-shm", "shm-store"])
@pytest.mark.parametrize("victim", ["engine", "frontend"])
def test_nothing_survives_a_sigkill_mid_transfer(transport, victim):
    server = start_serve("--transport", transport, *PAYLOAD, codec="msgspec-oob")
    engine, children, pids = server.engine_pid, server.child_pids, server.pids
    asyncio.run(chat_with_images(server.base_url, list(range(4))))

    async def kill_while_sending() -> None:
        sending = asyncio.ensure_future(chat_with_images(server.base_url, list(range(40)), tokens=64))
        await asyncio.sleep(0.3)
        os.kill(engine if victim == "engine" else server.proc.pid, signal.SIGKILL)
        await asyncio.gather(sending, return_exceptions=True)

    asyncio.run(kill_while_sending())
    if victim == "engine":
        assert server.stop() == 0  # the frontend notices, fails what was in flight, removes what it made
    else:
        server.proc.wait()
        assert not still_alive(children, grace_s=5)  # the engine follows its frontend
        start_serve("--transport", transport, *PAYLOAD, codec="msgspec-oob").stop()  # a new start cleans up
    assert leftovers_of(pids) == []


@pytest.mark.parametrize("transport", ["torch-shm", "shm-store"])
def test_a_failed_start_leaves_nothing(transport):
    with socket.socket() as taken:  # the HTTP port is in use: the start fails once the store exists
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        serve = subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "serve", "--codec", "msgspec-oob", "--transport", transport]
            + ["--port", str(taken.getsockname()[1]), "--host", "127.0.0.1", *PAYLOAD],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _, stderr = serve.communicate(timeout=120)
        finally:
            serve.kill()  # a no-op once it has exited
    assert serve.returncode == 1 and "Traceback" not in stderr, stderr
    assert leftovers_of([serve.pid]) == []


def test_the_frontend_drops_what_the_engine_took():
    """torch-shm's lifetime rule: the frontend holds each storage only until the engine reports it mapped,
    so its open file descriptors come back to where they were."""
    server = start_serve("--transport", "torch-shm", *PAYLOAD, codec="msgspec-oob")
    try:
        asyncio.run(chat_with_images(server.base_url, [0]))
        settled = open_fds(server.proc.pid)
        assert [s for s, _ in asyncio.run(chat_with_images(server.base_url, list(range(20))))] == [200] * 20
        asyncio.run(asyncio.sleep(1.0))
        assert open_fds(server.proc.pid) <= settled + 2
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(
    ("transport", "fault"),
    [("shm-store", "store-rewrite-pinned"), ("torch-shm", "torch-shm-free-early")],
)
def test_verify_catches_what_a_broken_transport_serves_silently(monkeypatch, transport, fault):
    """The fault (WIREBENCH_FAULT, tests only) rewrites a buffer the engine has not read yet: a store entry
    evicted while a request points at it, a torch storage freed early. Without --verify every request is
    served a wrong image; with it every one fails with the integrity error."""
    monkeypatch.setenv("WIREBENCH_FAULT", fault)
    for flags, caught in (((), False), (("--verify",), True)):
        server = start_serve("--transport", transport, *PAYLOAD, *flags, codec="msgspec-oob")
        try:
            results = asyncio.run(chat_with_images(server.base_url, list(range(6))))
        finally:
            server.stop()
        failed = [body["error"]["message"] for status, body in results if status != 200]
        if caught:
            assert len(failed) == 6 and all("integrity check failed" in m for m in failed), failed
        else:
            assert failed == []  # served, wrong, and nobody noticed


def test_cuda_ipc_is_refused_in_one_line_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--codec", "msgspec-oob", "--transport", "cuda-ipc"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("needs a CUDA device; this machine has none")
    assert "Traceback" not in done.stderr


def test_cuda_ipc_serves_images():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (runs where one is lent)")
    server = start_serve("--transport", "cuda-ipc", "--verify", *PAYLOAD, codec="msgspec-oob")
    pids = server.pids
    try:
        results = asyncio.run(chat_with_images(server.base_url, list(range(6))))
    finally:
        assert server.stop() == 0
    assert [s for s, _ in results] == [200] * 6
    assert leftovers_of(pids) == []


def test_bench_run_reports_the_stores_hit_rate_on_repeated_images(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--result-dir", str(tmp_path), "--no-progress"]
        + ["--codec", "msgspec-oob", "--transport", "zmq,shm-store", "--image-reuse", "0.5", "--verify"]
        + ["--images-per-request", "1", "--image-width", "64", "--image-height", "64", "--mm-payload", "tensor"]
        + ["--num-prompts", "40", "--request-rate", "inf", "--sonnet-output-len", "4", "--full-report"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "shm-store hit rate" in done.stdout and "Store hit rate (%):" in done.stdout  # the table, each run's report
    (compare,) = tmp_path.glob("compare-*.json")
    runs = {r["codec"]: r for r in json.loads(compare.read_text())["runs"]}
    assert runs["msgspec-oob/zmq"]["figures"]["mm_store_hit_pct"] is None
    hit = runs["msgspec-oob/shm-store"]["figures"]["mm_store_hit_pct"]
    assert runs["msgspec-oob/shm-store"]["figures"]["failed"] == 0 and 0 < hit < 100, hit
