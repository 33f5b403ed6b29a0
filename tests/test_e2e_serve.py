"""End to end: a real `bench serve` (frontend + spawned engine over ZeroMQ).

Each test talks HTTP to real processes: the official openai client, plain
aiohttp streaming, images through every codec that can carry them, aborts,
bad input, and a killed engine.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
from PIL import Image

from wirecodecs import available_codecs, codecs_that_carry_multimodal

from serve_process import free_port_pair, get_text, leftovers_of, metric, post, start_serve, still_alive

pytestmark = pytest.mark.slow  # each test starts real server processes

MODEL = "wirebench-tiny"


def image_data_url(size: int = 64, fmt: str = "PNG") -> str:
    img = Image.effect_noise((size, size), 40).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def chat_with_image(max_tokens: int = 8) -> dict:
    return {
        "model": MODEL,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe this picture in verse."},
                    {"type": "image_url", "image_url": {"url": image_data_url()}},
                ],
            }
        ],
    }


async def stream_completion(base_url: str, body: dict) -> tuple[list[dict], bool]:
    """POST a streaming request; (parsed chunks, saw [DONE])."""
    chunks, done = [], False
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/v1/completions", json={**body, "stream": True}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            chunks.append(json.loads(data))
    return chunks, done


async def stream_then_kill(base_url: str, kill) -> list[bytes]:
    """Stream a long completion, call ``kill`` after two events; the events until the stream ended."""
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": "Doomed", "max_tokens": 1800, "ignore_eos": True, "stream": True}
        async with session.post(f"{base_url}/v1/completions", json=body) as resp:
            events = []
            async for raw in resp.content:
                if raw.startswith(b"data:"):
                    events.append(raw)
                    if len(events) == 2:
                        kill()
        return events


def error_message(event: bytes) -> str:
    """The message of a ``data: {"error": ...}`` event."""
    return json.loads(event.removeprefix(b"data:"))["error"]["message"]


@pytest.fixture(scope="module")
def pickle_server():
    server = start_serve(codec="pickle")
    yield server
    server.stop()


def test_openai_client_streams_a_completion(pickle_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{pickle_server.base_url}/v1", api_key="none")
    assert [m.id for m in client.models.list().data] == [MODEL]
    stream = client.completions.create(
        model=MODEL,
        prompt="Shall I compare thee",
        max_tokens=12,
        stream=True,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True},
    )
    texts, usage = [], None
    for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == 12
    assert "".join(texts)


def test_aiohttp_stream_and_metrics_move(pickle_server):
    async def scenario():
        _, before = await get_text(pickle_server.base_url, "/metrics")
        chunks, done = await stream_completion(
            pickle_server.base_url,
            {"model": MODEL, "prompt": "The quiet sea", "max_tokens": 20, "ignore_eos": True, "temperature": 0},
        )
        # The engine's counters arrive with its idle heartbeat (0.25 s after its last output).
        deadline = time.monotonic() + 10
        while True:
            await asyncio.sleep(0.2)
            _, after = await get_text(pickle_server.base_url, "/metrics")
            engine_side = [("request", "decode"), ("output", "encode")]
            if time.monotonic() > deadline or all(
                metric(after, "wirebench_codec_messages_total", direction=d, op=o)
                > metric(before, "wirebench_codec_messages_total", direction=d, op=o)
                for d, o in engine_side
            ):
                return before, chunks, done, after

    before, chunks, done, after = asyncio.run(scenario())
    assert done and chunks[-1]["choices"][0]["finish_reason"] == "length"
    for direction, op in [("request", "encode"), ("request", "decode"), ("output", "encode"), ("output", "decode")]:
        moved = metric(after, "wirebench_codec_messages_total", direction=direction, op=op) - metric(
            before, "wirebench_codec_messages_total", direction=direction, op=op
        )
        assert moved >= 1, (direction, op)
    assert (
        metric(after, "wirebench_generation_tokens_total") - metric(before, "wirebench_generation_tokens_total") >= 20
    )


def test_abort_mid_stream_keeps_engine_serving(pickle_server):
    async def scenario():
        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL, "prompt": "Long night", "max_tokens": 1500, "ignore_eos": True, "stream": True}
            async with session.post(f"{pickle_server.base_url}/v1/completions", json=body) as resp:
                seen = 0
                async for raw in resp.content:
                    if raw.startswith(b"data:"):
                        seen += 1
                    if seen >= 3:
                        break  # leaving the block closes the connection mid-stream
        await asyncio.sleep(0.5)
        _, metrics = await get_text(pickle_server.base_url, "/metrics")
        chunks, done = await stream_completion(
            pickle_server.base_url, {"model": MODEL, "prompt": "After", "max_tokens": 4, "ignore_eos": True}
        )
        return metrics, done

    metrics, done = asyncio.run(scenario())
    assert metric(metrics, "wirebench_requests_total", outcome="aborted") >= 1
    assert done


@pytest.mark.parametrize(
    "path,body,status",
    [
        ("/v1/completions", "{not json", 400),
        ("/v1/completions", {"model": "no-such-model", "prompt": "x"}, 404),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400),
        ("/v1/completions", {"model": MODEL, "prompt": "word " * 3000, "max_tokens": 10}, 400),
        ("/v1/completions", {"model": MODEL}, 400),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}
                        ],
                    }
                ],
            },
            400,
        ),
    ],
)
def test_bad_input_gets_openai_error(pickle_server, path, body, status):
    code, payload = asyncio.run(post(pickle_server.base_url, path, body))
    assert code == status
    assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]


@pytest.mark.parametrize("codec", available_codecs())
def test_every_codec_serves_text_and_images_or_refuses_clearly(codec):
    # --output-stats: every output batch also carries the scheduler's state, as vLLM's do.
    server = start_serve("--output-stats", codec=codec)
    try:

        async def scenario():
            text = await stream_completion(
                server.base_url, {"model": MODEL, "prompt": "Winter light", "max_tokens": 6, "ignore_eos": True}
            )
            image = await post(server.base_url, "/v1/chat/completions", chat_with_image())
            after = await stream_completion(
                server.base_url, {"model": MODEL, "prompt": "Still here", "max_tokens": 3, "ignore_eos": True}
            )
            logprobs = await post(
                server.base_url,
                "/v1/chat/completions",
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "Count"}],
                    "max_tokens": 4,
                    "ignore_eos": True,
                    "logprobs": True,
                    "top_logprobs": 3,
                },
            )
            return text, image, after, logprobs

        (chunks, done), (status, body), (_, done_after), (lp_status, lp_body) = asyncio.run(scenario())
        assert done and chunks
        # Top logprobs ride every output from the engine through the codec, both ways.
        assert lp_status == 200, lp_body
        content = lp_body["choices"][0]["logprobs"]["content"]
        assert len(content) == 4 and all(len(c["top_logprobs"]) == 3 for c in content), content
        assert all(c["logprob"] <= 0 and c["top_logprobs"][0]["logprob"] >= c["logprob"] for c in content)
        if codec in codecs_that_carry_multimodal("image"):
            assert status == 200, body
            assert body["usage"]["completion_tokens"] == 8
        else:
            assert status == 400
            message = body["error"]["message"]
            assert codec in message and "PIL.Image.Image" in message and "msgspec-oob" in message
        assert done_after, "the engine must keep serving after a refused request"
    finally:
        assert server.stop() == 0


def test_tensor_mm_payload_serves_images():
    server = start_serve("--mm-payload", "tensor", codec="msgspec-oob")
    try:
        status, body = asyncio.run(post(server.base_url, "/v1/chat/completions", chat_with_image()))
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] is not None
    finally:
        server.stop()


def test_killed_engine_fails_inflight_requests_and_health():
    server = start_serve(codec="msgspec")
    try:
        engine_pid = server.engine_pid

        async def scenario():
            events = await stream_then_kill(server.base_url, lambda: os.kill(engine_pid, signal.SIGKILL))
            health, _ = await get_text(server.base_url, "/health")
            status, refused = await post(server.base_url, "/v1/completions", {"model": MODEL, "prompt": "x"})
            return events, health, status

        events, health, status = asyncio.run(scenario())
        # The stream of 1800 tokens ended early, failed by the frontend's watch on the engine process
        # (not by its silence, nor by a request timeout).
        assert error_message(events[-1]) == "the engine is not available: the engine process exited"
        assert health == 503
        assert status == 503
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stops_cleanly_leaving_no_children_or_sockets(sig):
    server = start_serve(codec="msgspec-oob")
    assert server.engine_pid  # the engine runs as a child process
    children, pids = server.child_pids, server.pids
    assert server.stop(sig) == 0
    assert not still_alive(children)
    assert leftovers_of(pids) == []


def test_engine_and_frontend_split_over_tcp():
    """`--engine-only` and `--frontend-only` on loopback tcp, as on two hosts."""
    port = str(free_port_pair())
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--engine-only",
            "--codec",
            "msgspec-oob",
            "--engine-host",
            "127.0.0.1",
            "--engine-port",
            port,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # The engine says it listens only once it has bound: the port takes a connection at once.
        line = engine.stdout.readline()
        assert "listening on tcp://127.0.0.1:" + port in line, line
        with socket.create_connection(("127.0.0.1", int(port)), timeout=5):
            pass
        frontend = start_serve(
            "--frontend-only", "--engine-host", "127.0.0.1", "--engine-port", port, codec="msgspec-oob"
        )
        try:
            chunks, done = asyncio.run(
                stream_completion(
                    frontend.base_url,
                    {"model": MODEL, "prompt": "Across the wire", "max_tokens": 5, "ignore_eos": True},
                )
            )
            assert done and len(chunks) >= 5
        finally:
            assert frontend.stop() == 0
        # A frontend whose output codec is not the engine's is refused at start, not left to fail each request.
        cmd = [sys.executable, "-m", "harness.cli", "serve", "--frontend-only", "--port", "0"]
        cmd += ["--engine-host", "127.0.0.1", "--engine-port", port]
        cmd += ["--codec", "msgspec-oob", "--output-codec", "msgspec"]
        refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "the engine's output codec is 'msgspec-oob', this frontend's 'msgspec'" in refused.stderr
    finally:
        engine.send_signal(signal.SIGINT)
        assert engine.wait(timeout=20) == 0


def test_pickle_over_non_loopback_tcp_is_refused():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--engine-only",
            "--codec",
            "pickle",
            "--engine-host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--allow-insecure-pickle" in done.stderr


def test_remote_engine_death_is_noticed_by_heartbeat():
    """A frontend-only server has no process to watch: silence past the heartbeat timeout is death."""
    port = str(free_port_pair())
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "serve",
            "--engine-only",
            "--codec",
            "msgspec",
            "--engine-host",
            "127.0.0.1",
            "--engine-port",
            port,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        frontend = start_serve("--frontend-only", "--engine-host", "127.0.0.1", "--engine-port", port, codec="msgspec")
        try:

            async def scenario():
                events = await stream_then_kill(frontend.base_url, engine.kill)
                health, _ = await get_text(frontend.base_url, "/health")
                return events, health

            events, health = asyncio.run(scenario())
            # No process to watch: the heartbeat's silence failed the stream of 1800 tokens.
            assert error_message(events[-1]).startswith("the engine is not available: no message from the engine for")
            assert health == 503
        finally:
            assert frontend.stop() == 0
    finally:
        engine.kill()
        engine.wait()


def test_request_timelines_are_ordered_add_up_and_make_a_trace(tmp_path):
    """A real request through both processes: its timeline's points are in path order, its spans
    add up to the IPC total, /metrics has the span histograms, and --trace-file writes trace events."""
    trace = tmp_path / "trace.json"
    server = start_serve("--trace-file", str(trace), codec="msgspec-oob")
    try:

        async def scenario():
            rids = []
            for _ in range(3):
                chunks, done = await stream_completion(
                    server.base_url, {"model": MODEL, "prompt": "Winter's breath", "max_tokens": 6, "ignore_eos": True}
                )
                assert done
                rids.append(chunks[0]["id"])
            # The engine ships its timestamps within 50 ms, or when idle.
            deadline = time.monotonic() + 10
            while True:
                await asyncio.sleep(0.2)
                status, text = await get_text(server.base_url, "/v1/wirebench/spans")
                got = json.loads(text) if status == 200 else {}
                shipped = {
                    t["request_id"]
                    for t in got.get("requests", [])
                    if (t.get("first_batch") or {}).get("encode_end", 0) > 0
                }
                if time.monotonic() > deadline or set(rids) <= shipped:
                    break
            _, metrics_text = await get_text(server.base_url, "/metrics")
            return rids, status, got, metrics_text

        rids, status, spans, metrics_text = asyncio.run(scenario())
    finally:
        server.stop()
    assert status == 200 and spans["available"]
    by_id = {t["request_id"]: t for t in spans["requests"]}
    assert set(rids) <= set(by_id)
    for rid in rids:
        t = by_id[rid]
        f, e, b = t["front"], t["engine"], t["first_batch"]
        path = [
            f["http_received"],
            f["prepared"],
            f["encode_start"],
            f["encode_end"],
            e["received"],
            e["decode_end"],
            e["added"],
            e["first_scheduled"],
            e["first_sampled"],
            b["encode_start"],
            b["encode_end"],
            f["first_output_received"],
            f["first_output_decoded"],
            f["first_sse_written"],
        ]
        assert all(p > 0 for p in path) and path == sorted(path), t
        s = t["spans_us"]
        parts = [s[f"{d}.{w}"] for d in ("request", "output") for w in ("encode", "wire", "decode", "queue")]
        assert s["ipc"] == pytest.approx(sum(parts))
        assert s["ipc"] < s["server.ttft"]  # IPC is a part of the server's time to the first chunk
    assert spans["batches"] and all(b["received"] >= b["encode_end"] > 0 for b in spans["batches"])
    assert 'wirebench_ipc_seconds_bucket{direction="request",le="+Inf",span="wire"}' in metrics_text
    assert "wirebench_frontend_loop_lag_seconds_count" in metrics_text
    assert metric(metrics_text, "wirebench_codec_cpu_seconds_total", direction="request", op="encode") > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(names.values()) == ["busy loop", "event loop", "input thread", "output thread"]
    slices = {e["name"] for e in events if e["ph"] == "X"}
    assert {
        "request encode",
        "request wire",
        "request decode",
        "input queue",
        "step",
        "output encode",
        "output wire",
        "output decode",
    } <= slices
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in events if e["ph"] == "X")


# Loaded first by every Python started with this folder on PYTHONPATH (the server and its spawned
# engine alike): each process that calls gc.freeze leaves a file named by its pid in FOLDER.
FREEZE_RECORDER = """\
import gc, os
_freeze = gc.freeze
def _recorded_freeze():
    open(os.path.join(FOLDER, str(os.getpid())), "w").close()
    _freeze()
gc.freeze = _recorded_freeze
"""


def test_both_processes_freeze_their_startup_heap_unless_told_not_to(tmp_path, monkeypatch):
    """The frontend and the engine move their startup heap out of full collections (harness.processes.heap)
    before they say they are ready; --no-gc-freeze leaves both heaps alone."""
    hook, frozen = tmp_path / "hook", tmp_path / "frozen"
    hook.mkdir()
    frozen.mkdir()
    (hook / "sitecustomize.py").write_text(f"FOLDER = {str(frozen)!r}\n" + FREEZE_RECORDER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    for flags, freezes in (((), True), (("--no-gc-freeze",), False)):
        server = start_serve("--executor", "sim", *flags, codec="msgspec")
        try:
            servers = {server.proc.pid, server.engine_pid}
        finally:
            assert server.stop() == 0
        callers = {int(p.name) for p in frozen.iterdir()} & servers
        assert callers == (servers if freezes else set()), flags
