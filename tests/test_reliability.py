"""Reliability and security, end to end: stalls, rogue local peers, hostile input, leftovers.

Every test starts real `bench serve` processes on loopback and is bounded in
time. What each checks is the outcome (statuses, tokens delivered, files,
/health), never a speed.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import pytest
import zmq
from PIL import Image

from harness.transports.shm import SHM_DIR

from serve_process import (
    free_port_pair,
    get_text,
    metric,
    post,
    post_json,
    shm_segments,
    start_serve,
    still_alive,
)

pytestmark = pytest.mark.slow  # each test starts real server processes

MODEL = "wirebench-tiny"


async def stream_tokens(session: aiohttp.ClientSession, base_url: str, max_tokens: int) -> tuple[int, bool, bytes]:
    """(chunks with text, saw [DONE], last event) of one streamed completion."""
    body = {"model": MODEL, "prompt": "A long night", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    chunks, done, last = 0, False, b""
    async with session.post(f"{base_url}/v1/completions", json=body) as resp:
        async for raw in resp.content:
            if raw.startswith(b"data:"):
                last = raw
                if raw.strip() == b"data: [DONE]":
                    done = True
                elif b'"text"' in raw:
                    chunks += 1
    return chunks, done, last


async def until(check, timeout_s: float, every_s: float = 0.2):
    """Poll ``await check()`` until it returns something true; that value (or the last one at the deadline)."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(every_s)
    return value


# --- a stall is taken back ---------------------------------------------------------------------


def test_a_stalled_engine_is_taken_back_and_its_abandoned_requests_aborted():
    server = start_serve("--engine-stall-timeout", "1", codec="msgspec")
    engine = server.engine_pid
    try:

        async def scenario():
            async with aiohttp.ClientSession() as session:
                base = server.base_url
                streams = [asyncio.create_task(stream_tokens(session, base, 1500)) for _ in range(8)]
                await asyncio.sleep(1.5)  # all admitted and streaming
                os.kill(engine, signal.SIGSTOP)
                await asyncio.sleep(2.5)  # past the 1 s stall timeout
                async with session.get(f"{base}/health") as resp:
                    stalled = resp.status, await resp.json()
                os.kill(engine, signal.SIGCONT)
                results = await asyncio.gather(*streams)

                async def healthy():
                    async with session.get(f"{base}/health") as resp:
                        return resp.status == 200

                back = await until(healthy, 10)
                chunks, done, _ = await stream_tokens(session, base, 5)

                async def engine_idle():
                    async with session.get(f"{base}/metrics") as resp:
                        text = await resp.text()
                    return metric(text, "wirebench_engine_requests", state="running") == 0

                idle = await until(engine_idle, 10)
                return stalled, results, back, (chunks, done), idle

        stalled, results, back, after, idle = asyncio.run(scenario())
    finally:
        os.kill(engine, signal.SIGCONT)
        server.stop()
    assert stalled[0] == 503 and stalled[1]["status"] == "stalled"
    assert all(not done and b"error" in last for _, done, last in results)  # failed, not hung
    assert back, "the engine answers again: /health must be 200 again"
    assert after == (5, True)
    # The 8 abandoned 1,500-token requests were aborted in the engine, not computed for nobody.
    assert idle


# --- only our frontend can talk to the engine ----------------------------------------------


def test_an_unauthenticated_local_process_can_neither_stop_read_nor_run_code(tmp_path):
    port = free_port_pair()
    keys = tmp_path / "keys"
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--engine-only",
            "--codec",
            "pickle",
            "--engine-port",
            str(port),
            "--curve-dir",
            str(keys),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    frontend = None
    try:
        assert "CURVE keys in" in engine.stdout.readline()
        assert oct(keys.stat().st_mode & 0o777) == "0o700"
        assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in keys.glob("*.key_secret"))
        frontend = start_serve("--frontend-only", "--engine-port", str(port), "--curve-dir", str(keys), codec="pickle")
        marker = tmp_path / "pwned"

        class Exploit:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        ctx: zmq.Context = zmq.Context()
        rogue_in = ctx.socket(zmq.PUSH)
        rogue_out = ctx.socket(zmq.PULL)
        for sock in (rogue_in, rogue_out):
            sock.setsockopt(zmq.LINGER, 0)
        rogue_in.connect(f"tcp://127.0.0.1:{port}")
        rogue_out.connect(f"tcp://127.0.0.1:{port + 1}")
        rogue_in.send_multipart([b"\x00rogue-1", pickle.dumps(Exploit())])  # ADD with a code-running body
        rogue_in.send(b"\x02")  # SHUTDOWN

        async def scenario():
            async with aiohttp.ClientSession() as session:
                return await asyncio.gather(*(stream_tokens(session, frontend.base_url, 16) for _ in range(4)))

        results = asyncio.run(scenario())
        stolen = rogue_out.poll(500)
        rogue_in.close()
        rogue_out.close()
        ctx.term()
    finally:
        if frontend is not None:
            frontend.stop()
        engine.send_signal(signal.SIGINT)
        engine.wait(timeout=20)
    assert results == [(16, True, b"data: [DONE]\n")] * 4  # every token reached the real frontend
    assert not stolen, "a second PULL socket must not receive the engine's outputs"
    assert not marker.exists(), "the rogue pickle must never be unpickled"


def test_requests_whose_outputs_never_come_back_fail_at_the_request_timeout():
    """--no-auth on loopback (with its warning): a rogue PULL on the output port takes some outputs;
    the requests it robbed end with a 504 naming --request-timeout instead of hanging."""
    port = free_port_pair()
    server = start_serve(
        "--socket", "tcp", "--no-auth", "--engine-port", str(port), "--request-timeout", "3", codec="msgspec"
    )  # fmt: skip
    ctx: zmq.Context = zmq.Context()
    rogue_out = ctx.socket(zmq.PULL)
    rogue_out.setsockopt(zmq.LINGER, 0)
    rogue_out.connect(f"tcp://127.0.0.1:{port + 1}")
    try:
        assert any("WARNING: --no-auth" in line for line in server.lines)
        time.sleep(0.5)  # the rogue's connection is up before the requests start

        async def scenario():
            # Lengths differ so the requests finish in different steps: the engine's PUSH deals
            # step messages to both pullers in turn, so some last outputs go to the rogue (with one
            # length, all requests finish in one step and that message has even odds of escaping).
            async with aiohttp.ClientSession() as session:
                url = f"{server.base_url}/v1/completions"
                bodies = [
                    {"model": MODEL, "prompt": "A long night", "max_tokens": 24 + i, "ignore_eos": True}
                    for i in range(8)
                ]
                return await asyncio.wait_for(
                    asyncio.gather(*(post_json(session, url, body) for body in bodies)), timeout=60
                )

        results = asyncio.run(scenario())  # wait_for: a request that never ends fails the test
        stolen = rogue_out.poll(100)
    finally:
        rogue_out.close()
        ctx.term()
        server.stop()
    statuses = [status for status, _ in results]
    assert stolen, "the rogue PULL should have received some outputs (round-robin)"
    assert set(statuses) <= {200, 504} and 504 in statuses, statuses
    timed_out = [body for status, body in results if status == 504]
    assert all("--request-timeout" in body["error"]["message"] for body in timed_out)


def test_pickle_over_unauthenticated_tcp_is_refused():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--codec",
            "pickle",
            "--socket",
            "tcp",
            "--no-auth",
            "--engine-port",
            str(free_port_pair()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unauthenticated tcp" in done.stderr


# --- hostile input is refused early, live streams keep streaming -------------------------------


def tiny_png(side: int) -> str:
    """A PNG of side x side pixels that compresses to a few hundred bytes (a decompression bomb)."""
    buf = io.BytesIO()
    Image.new("L", (side, side)).save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def server():
    s = start_serve(codec="msgspec-oob")
    yield s
    s.stop()


def test_decompression_bombs_and_huge_prompts_are_refused_while_streams_stream(server):
    bomb = tiny_png(4096)
    assert len(bomb) < 100_000  # 16.7 million pixels in a few KB

    async def scenario():
        async with aiohttp.ClientSession() as session:
            base = server.base_url
            streams = [asyncio.create_task(stream_tokens(session, base, 40)) for _ in range(20)]
            await asyncio.sleep(0.3)
            chat = {
                "model": MODEL,
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "look"}]
                        + [{"type": "image_url", "image_url": {"url": bomb}}] * 8,
                    }
                ],
            }
            bombs = await post_json(session, f"{base}/v1/chat/completions", chat)
            huge = await post_json(session, f"{base}/v1/completions", {"model": MODEL, "prompt": "x " * 5_000_000})
            # Under the byte limit but far over the context: tokenized off the event loop, then refused.
            long_prompt = post_json(session, f"{base}/v1/completions", {"model": MODEL, "prompt": "word " * 50_000})
            health = session.get(f"{base}/health")
            long_result, health_resp = await asyncio.gather(long_prompt, health)
            return bombs, huge, long_result, health_resp.status, await asyncio.gather(*streams)

    bombs, huge, long_result, health, streams = asyncio.run(scenario())
    assert bombs[0] == 400 and "pixels" in bombs[1]["error"]["message"]
    assert huge[0] == 400 and "bytes" in huge[1]["error"]["message"]
    assert long_result[0] == 400 and health == 200
    assert streams == [(40, True, b"data: [DONE]\n")] * 20


def _resident_mb(pids: list[int]) -> float:
    from harness.loadgen.process_cpu import resident_bytes

    return resident_bytes(pids) / 2**20


def test_sixteen_large_images_at_once_take_memory_for_the_budget_not_for_sixteen():
    """16 concurrent 4096² images (each PNG a few KB): the server's processes grow by less than 850 MB at
    the peak and keep less than 250 MB after (measured here: +547 / +83 MB; before the pixel budget held
    pixels until the engine answered: +1,061 / +552 MB). A stated bound, not a speed."""
    from harness.loadgen.process_cpu import server_roles

    server = start_serve(codec="msgspec-oob")
    roles = server_roles(server.proc.pid)
    pids = [pid for group in roles.values() for pid in group]
    image = tiny_png(4096)
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}],
    }
    peak, stop = [0.0], False

    def sample() -> None:
        while not stop:
            peak[0] = max(peak[0], _resident_mb(pids))
            time.sleep(0.01)

    async def scenario():
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(
                *(post_json(session, f"{server.base_url}/v1/chat/completions", body) for _ in range(16))
            )

    try:
        # warm: first-use allocations are not the images'
        asyncio.run(post(server.base_url, "/v1/chat/completions", body))
        before = _resident_mb(pids)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        replies = asyncio.run(scenario())
        stop = True
        sampler.join()
        time.sleep(2.0)
        kept = _resident_mb(pids) - before
    finally:
        server.stop()
    assert {status for status, _ in replies} <= {200, 503}, [r for r in replies if r[0] not in (200, 503)]
    assert peak[0] - before < 850, (peak[0] - before, kept)
    assert kept < 250, kept


@pytest.mark.parametrize(
    "body, content_type, status",
    [
        (b"[" * 100_000, "application/json", 400),  # nesting: a 400, not a 500 with a traceback
        (b'{"model": "wirebench-tiny", "prompt": "x"}', "text/plain", 415),  # a browser's form post
        (
            b'{"model": "wirebench-tiny", "prompt": "x", "seed": 1000000000000000000000000000000}',
            "application/json",
            400,
        ),
        (
            b'{"model": "wirebench-tiny", "prompt": "x", "logit_bias": {"1000000000000000000000000000000": 1}}',
            "application/json",
            400,
        ),
    ],
)
def test_bad_bodies_get_a_4xx_and_the_next_request_succeeds(server, body, content_type, status):
    async def scenario():
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{server.base_url}/v1/completions", data=body, headers={"Content-Type": content_type}
            ) as resp:
                bad = resp.status, await resp.json(content_type=None)
            return bad, await stream_tokens(session, server.base_url, 3)

    (code, err), after = asyncio.run(scenario())
    assert code == status and err["error"]["code"] == status and err["error"]["message"]
    assert after == (3, True, b"data: [DONE]\n")


def test_a_body_that_never_finishes_times_out():
    server = start_serve("--body-timeout", "1", codec="msgspec")
    try:
        with socket.create_connection(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"prompt": '
            )
            reply = sock.recv(4096)
    finally:
        server.stop()
    assert reply.startswith(b"HTTP/1.1 408")


def _port(server) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


def test_slow_header_connections_are_closed_at_the_header_timeout():
    """Slowloris: connections that never finish their headers (one trickling a byte every 0.2 s) are
    closed at --header-timeout (aiohttp's default keeps them an hour), and /health answers meanwhile."""
    server = start_serve("--header-timeout", "1", codec="msgspec")
    try:
        socks = [socket.create_connection(("127.0.0.1", _port(server)), timeout=10) for _ in range(8)]
        for sock in socks:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        trickle = socks[0]
        # Closed while it still trickles (a byte every 0.2 s for 20 s): a timeout per read would never
        # close it, aiohttp's default would after an hour. Sending into a closed connection fails at the
        # latest on the second try.
        with pytest.raises(OSError):
            for _ in range(100):
                trickle.sendall(b"X")
                time.sleep(0.2)
        health, _ = asyncio.run(get_text(server.base_url, "/health"))
        for sock in socks[1:]:
            assert sock.recv(4096) == b""  # closed by the server, not timed out here
            sock.close()
        trickle.close()
    finally:
        server.stop()
    assert health == 200


def test_clients_that_leave_before_the_first_byte_each_have_an_outcome():
    """Every request that reached a handler is one /metrics outcome, those whose client left while the
    body was still being read included (500 such connections once left 98 requests uncounted)."""
    server = start_serve(codec="msgspec")
    url = server.base_url + "/metrics"
    name = "wirebench_requests_total"

    async def aborted() -> float:
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            return metric(await resp.text(), name, outcome="aborted")

    try:
        before = asyncio.run(aborted())
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as sock:
                sock.sendall(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 1000\r\n\r\n{"prompt": '
                )
                time.sleep(0.1)  # the handler is reading the body when the client goes

        async def counted():
            return await aborted() - before >= 5

        assert asyncio.run(until(counted, 10))
        after = asyncio.run(aborted())
    finally:
        server.stop()
    assert after - before == 5


# --- no leftovers, every address family ------------------------------------------------------


def _torch_leftover(pid: int) -> Path:
    """A file as torch leaves it when its process is SIGKILLed between creating a storage and unlinking
    its name (/dev/shm/torch_<pid>_<n>_<m>, this user's, mode 0600)."""
    path = SHM_DIR / f"torch_{pid}_12345_0"
    path.write_bytes(b"\0" * 4096)
    path.chmod(0o600)
    return path


def test_stale_ipc_dirs_of_dead_processes_are_removed_at_start():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path(tempfile.mkdtemp(prefix=f"wirebench-{dead.pid}-"))
    torch_file = _torch_leftover(dead.pid)  # the same dead frontend was killed inside torch's window too
    try:
        server = start_serve(codec="msgspec")
        server.stop()
        assert not stale.exists()
        assert not torch_file.exists()
    finally:
        torch_file.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "flags", [(), ("--transport", "shm"), ("--transport", "torch-shm")], ids=["zmq", "shm", "torch-shm"]
)
def test_a_killed_frontend_leaves_nothing_behind(flags):
    """The engine notices its frontend is gone and removes the ipc directory, the frontend's shm
    segment (the shm case sends no frame through the arena: only the spawn named it) and torch's files
    a frontend killed inside torch's create-then-unlink window leaves (planted here: the real window
    is ~2 ms a 12.6 MB storage)."""
    server = start_serve(*flags, codec="msgspec-oob")
    pid = server.proc.pid
    mine = list(Path(tempfile.gettempdir()).glob(f"wirebench-{pid}-*"))
    segments = [s for s in shm_segments() if s.startswith(f"wirebench-{pid}-")]
    children = server.child_pids
    torch_file = _torch_leftover(pid)
    try:
        os.kill(pid, signal.SIGKILL)
        server.proc.wait()
        assert not still_alive(children, grace_s=5)  # the engine stops when its frontend is gone
        assert mine and not any(p.exists() for p in mine)
        assert bool(segments) == (flags[1:] == ("shm",))
        assert not [s for s in shm_segments() if s.startswith(f"wirebench-{pid}-")]
        assert not torch_file.exists()
    finally:
        torch_file.unlink(missing_ok=True)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_an_ipv6_engine_host_works_or_is_refused_cleanly():
    port = free_port_pair()
    if not _ipv6_loopback():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness.cli",
                "serve",
                "--socket",
                "tcp",
                "--engine-host",
                "::1",
                "--engine-port",
                str(port),
                "--codec",
                "msgspec",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0 and "Traceback" not in done.stderr
        return
    # The HTTP side on ::1 too: the URL it prints has the brackets clients need.
    server = start_serve(
        "--socket", "tcp", "--engine-host", "::1", "--engine-port", str(port), "--host", "::1", codec="msgspec"
    )  # fmt: skip
    try:
        assert server.base_url.startswith("http://[::1]:")

        async def scenario():
            async with aiohttp.ClientSession() as session:
                return await stream_tokens(session, server.base_url, 4)

        assert asyncio.run(scenario()) == (4, True, b"data: [DONE]\n")
    finally:
        server.stop()


# --- what already held stays held ------------------------------------------------------------


def test_an_abort_storm_leaves_an_idle_engine(server):
    async def scenario():
        async with aiohttp.ClientSession() as session:
            base = server.base_url

            async def dropped():
                body = {"model": MODEL, "prompt": "Storm", "max_tokens": 1500, "ignore_eos": True, "stream": True}
                async with session.post(f"{base}/v1/completions", json=body) as resp:
                    await resp.content.readline()  # the first event, then hang up

            await asyncio.gather(*(dropped() for _ in range(60)))

            async def idle():
                async with session.get(f"{base}/metrics") as resp:
                    text = await resp.text()
                return (
                    metric(text, "wirebench_engine_requests", state="running") == 0
                    and metric(text, "wirebench_requests_running") == 0
                )

            return await until(idle, 15), await stream_tokens(session, base, 3)

    idle, after = asyncio.run(scenario())
    assert idle and after == (3, True, b"data: [DONE]\n")


def test_overload_loses_nothing(server):
    """300 requests at once: every one completes; none is dropped or left hanging."""

    async def scenario():
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(stream_tokens(session, server.base_url, 8) for _ in range(300)))

    assert asyncio.run(scenario()) == [(8, True, b"data: [DONE]\n")] * 300


async def _completions_one_at_a_time(base: str, n: int, tokens: int) -> list[tuple[int, dict]]:
    async with aiohttp.ClientSession() as session:
        results = []
        for i in range(n):
            body = {"model": MODEL, "prompt": f"count {i}", "max_tokens": tokens, "ignore_eos": True}
            async with session.post(f"{base}/v1/completions", json=body) as resp:
                results.append((resp.status, await resp.json(content_type=None)))
        return results


@pytest.mark.vllm
def test_verify_catches_an_output_buffer_reused_before_it_was_sent(monkeypatch):
    """vLLM #45730's bug class: the engine encodes outputs into one reused buffer and zero-copy sends
    it; WIREBENCH_FAULT=reuse-output-buffer writes each next batch into it before the previous one
    went out. Without --verify a torn batch may fail to decode, and one of the same length is served
    silently wrong (a request finishing a token early, say); with it every such request fails with
    an integrity error naming the output batch, and none is served wrong."""
    monkeypatch.setenv("WIREBENCH_FAULT", "reuse-output-buffer")
    seen = {}
    for flags in ((), ("--verify",)):
        server = start_serve("--executor", "sim", "--request-timeout", "20", *flags, codec="vllm")
        try:
            seen[flags] = asyncio.run(_completions_one_at_a_time(server.base_url, 3, 8))
        finally:
            server.stop()
    plain = seen[()]
    harmed = [(s, b) for s, b in plain if s != 200 or b["usage"]["completion_tokens"] != 8]
    assert harmed, plain  # the fault did harm ...
    assert not any("integrity" in b.get("error", {}).get("message", "") for _, b in plain)  # ... and nobody said so
    verified = seen[("--verify",)]
    assert all(s == 500 and "integrity check failed: an output batch" in b["error"]["message"] for s, b in verified)


def test_an_engine_port_in_use_is_one_clear_line_not_a_traceback():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "serve", "--codec", "msgspec", "--socket", "tcp"]
            + ["--engine-port", str(port), "--executor", "sim", "--port", "0"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "wirebench engine: cannot listen: Address already in use" in done.stderr
    assert "--engine-port" in done.stderr and "engine process exited during startup" in done.stderr
