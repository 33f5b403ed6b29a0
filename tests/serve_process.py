"""Start and stop a real `bench serve` process for end-to-end tests."""

from __future__ import annotations

import asyncio
import multiprocessing
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import zmq

from harness.engine.config import EngineConfig
from harness.engine.process import run_engine
from harness.experiment.server import ServerProcess
from harness.wire import zmq_link
from harness.wire.zmq_link import EngineAddresses
from harness.workloads.images import synthetic_image, to_data_url

MODEL = "wirebench-tiny"


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc, no psutil needed)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def still_alive(pids: list[int], grace_s: float = 3.0) -> list[int]:
    """The pids still running after up to ``grace_s`` (multiprocessing's resource
    tracker exits a moment after its parent, once it sees the pipe close)."""
    deadline = time.monotonic() + grace_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


def ipc_dirs() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{zmq_link.IPC_PREFIX}*")}


def shm_segments() -> set[str]:
    from harness.transports.shm import PREFIX, SHM_DIR

    return {p.name for p in SHM_DIR.glob(f"{PREFIX}*")}


def leftovers_of(pids: list[int]) -> list[str]:
    """The ipc directories and shared-memory files (ours and torch's) that these processes made and left:
    each name carries its maker's pid, so the check sees only its own servers beside tests run in parallel."""
    import tempfile

    from harness.transports import shm, torch_shm

    tmp = Path(tempfile.gettempdir())
    places = [
        place
        for pid in pids
        for place in (
            (tmp, f"{zmq_link.IPC_PREFIX}{pid}-*"),
            (shm.SHM_DIR, f"{shm.PREFIX}{pid}-*"),
            (shm.SHM_DIR, f"{torch_shm.file_prefix(pid)}*"),
        )
    ]
    return sorted(path.name for folder, pattern in places for path in folder.glob(pattern))


class ServeProcess(ServerProcess):
    """A `bench serve` child plus what the tests inspect about it."""

    @property
    def child_pids(self) -> list[int]:
        return child_pids(self.proc.pid)

    @property
    def engine_pid(self) -> int:
        """The spawned engine (other children, e.g. multiprocessing's resource tracker, aside)."""
        (pid,) = [p for p in self.child_pids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        return pid

    @property
    def pids(self) -> list[int]:
        """The frontend and its children: whose names a leftover would carry."""
        return [self.proc.pid, *self.child_pids]


def start_serve(*flags: str, codec: str = "pickle", timeout: float = 90.0) -> ServeProcess:
    """Run `bench serve --port 0 --codec CODEC FLAGS` and wait for its ready line."""
    server = ServeProcess(codec, list(flags))
    server.wait_ready(timeout)
    return server


def bench_load(flags: list[str], result_dir: Path, codec: str = "msgspec") -> subprocess.CompletedProcess[str]:
    """`bench load FLAGS` against a `bench serve --codec CODEC` started for it (stopped after), its files in
    ``result_dir``: what the run printed and its exit code."""
    server = start_serve(codec=codec)
    try:
        return subprocess.run(
            [sys.executable, "-m", "harness.cli", "load", "--base-url", str(server.base_url), *flags]
            + ["--result-dir", str(result_dir), "--no-progress"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop()


def free_port_pair() -> int:
    """A free loopback port whose successor is free too (engine input and output)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


@contextmanager
def sim_engine() -> Iterator[tuple[multiprocessing.process.BaseProcess, zmq.Socket, zmq.Socket]]:
    """A real engine process on tcp (msgspec, the sim executor) with a PUSH socket to its input and a
    PULL socket from its output, shut down and its sockets closed afterwards."""
    addrs = EngineAddresses.tcp("127.0.0.1", free_port_pair())
    config = EngineConfig(codec="msgspec", executor="sim", sim_step_fixed_ms=0.5, vocab_size=4096, eos_token_id=1)
    proc = multiprocessing.get_context("spawn").Process(target=run_engine, args=(config, addrs, "CRITICAL", True))
    proc.start()
    ctx: zmq.Context = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    try:
        push.connect(addrs.input)
        pull.connect(addrs.output)
        pull.setsockopt(zmq.RCVTIMEO, 20_000)
        yield proc, push, pull
    finally:
        push.send(zmq_link.envelope(zmq_link.SHUTDOWN))
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()


# --- talking to it over HTTP ----------------------------------------------------------------------


async def post_json(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, Any]:
    """(status, parsed reply) of one JSON POST on an open session."""
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def post(base_url: str, path: str, body: dict | str) -> tuple[int, Any]:
    """(status, parsed reply) of one POST on a session of its own; a str body is sent as it is (bad JSON too)."""
    async with aiohttp.ClientSession() as session:
        if isinstance(body, dict):
            return await post_json(session, f"{base_url}{path}", body)
        headers = {"Content-Type": "application/json"}
        async with session.post(f"{base_url}{path}", data=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)


async def get_text(base_url: str, path: str) -> tuple[int, str]:
    """(status, body) of one GET on a session of its own."""
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}{path}") as resp:
        return resp.status, await resp.text()


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly ``labels`` in a /metrics text; fails the test when absent."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    prefix = f"{name}{{{want}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{prefix} not in /metrics")


async def chat_with_images(base: str, seeds: list[int], tokens: int = 4) -> list[tuple[int, dict]]:
    """One chat request with an 80x80 image per seed, all at once; the same seed sends the same image bytes."""

    async def one(session: aiohttp.ClientSession, seed: int) -> tuple[int, dict]:
        url = to_data_url(synthetic_image(80, 80, seed), "png")
        content = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}]
        body = {
            "model": MODEL,
            "max_tokens": tokens,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": content}],
        }
        return await post_json(session, f"{base}/v1/chat/completions", body)

    async with aiohttp.ClientSession() as session:
        return await asyncio.gather(*(one(session, s) for s in seeds))
