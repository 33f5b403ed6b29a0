"""Hostile inputs against a real server: compressed bodies, big JSON bodies, a peer that ignores the bounds.

Each test is bounded in time and checks outcomes (statuses, error outputs, memory bounds), never a speed.
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from typing import Any

import aiohttp
import pytest

from harness.wire.messages import EngineCoreOutputs, EngineCoreRequest, FinishReason, SamplingParams

from serve_process import metric, start_serve

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
    """Two 1 MB -> 1 GiB gzip bombs at once: 415 within seconds, /health answers, and the frontend
    neither grows nor spends the CPU inflating them (with aiohttp's auto_decompress on it spent
    0.2-0.3 s here); ``Content-Encoding: identity`` is an ordinary request."""
    from harness.loadgen.process_cpu import cpu_seconds

    bomb = _bomb(1 << 30, 31)
    assert len(bomb) < 2 << 20
    bombs = [bomb, bomb]
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
            attack = asyncio.gather(post(session, bombs[0], "gzip"), post(session, bombs[1], "gzip"))
            worst = asyncio.create_task(health_worst(prober, attack))
            replies = await asyncio.wait_for(attack, 5.0)
            cpu.append(cpu_seconds(pid))
            plain = b'{"model": "%s", "prompt": "hello", "max_tokens": 2}' % MODEL.encode()
            identity = await post(session, plain, "identity")
            async with session.get(f"{base}/metrics") as resp:
                assert metric(await resp.text(), "wirebench_requests_total", outcome="rejected") == 2
            return list(replies), await worst, identity

    cpu: list[float] = []
    try:
        before = _resident_mb(pid)
        cpu.append(cpu_seconds(pid))
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
    assert worst_health_s < 0.3, worst_health_s  # measured: 1-8 ms
    assert peak[0] - before < 32, (before, peak[0])  # measured: +0.1 MB
    assert cpu[1] - cpu[0] < 0.1, cpu  # measured: 0-0.01 s


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd", " GZIP ", "gzip, identity"])
def test_every_content_encoding_but_identity_is_a_415(encoding):
    from aiohttp.test_utils import TestClient, TestServer

    from harness.frontend.app import build_app
    from harness.frontend.settings import FrontendSettings
    from harness.tokenizers.tokenizer import load_tokenizer

    from fake_engine import FakeEngine

    tokenizer = load_tokenizer()
    body = b'{"model": "wirebench-tiny", "prompt": "hello", "max_tokens": 2}'

    async def scenario() -> list[tuple[int, dict]]:
        app = build_app(FakeEngine(tokenizer.encode("Hi there.")), tokenizer, FrontendSettings())
        replies = []
        server = TestServer(app)
        await server.start_server(auto_decompress=False)  # as bench serve runs it
        async with TestClient(server) as client:
            for enc in (encoding, "identity"):
                headers = {"Content-Type": "application/json", "Content-Encoding": enc}
                resp = await client.post("/v1/completions", data=body, headers=headers)
                replies.append((resp.status, await resp.json()))
        return replies

    (status, refused), (ok_status, _) = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert status == 415 and refused["error"]["type"] == "invalid_request_error", refused
    assert "Content-Encoding" in refused["error"]["message"]
    assert ok_status == 200


# --- the engine re-checks the bounds on what it decodes ----------------------------------------


def _engine_request(rid: str, max_tokens: int = 3, **sampling: object) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=rid,
        prompt=None,
        prompt_token_ids=[5, 6, 7],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling),  # type: ignore[arg-type]
        eos_token_id=1,
        arrival_time=time.time(),
    )


# Each one over a default bound, as a peer that skips the frontend could send it.
OVERSIZE: dict[str, tuple[dict[str, Any], str]] = {
    "stop-ids": ({"stop_token_ids": [5] * 2_000_000, "min_tokens": 1000}, "--max-stop-token-ids"),
    "logit-bias": ({"logit_bias": {i: 1.0 for i in range(2_000)}}, "--max-logit-bias"),
    "stop-strings": ({"stop": ["x"] * 17}, "--max-stop-strings"),
    "stop-chars": ({"stop": ["x" * 5_000]}, "--max-stop-chars"),
}


@pytest.mark.parametrize("name", sorted(OVERSIZE))
def test_the_scheduler_refuses_what_the_frontend_would(name):
    from harness.engine.config import EngineConfig
    from harness.engine.scheduler import Scheduler

    fields, flag = OVERSIZE[name]
    scheduler = Scheduler(EngineConfig(executor="sim", vocab_size=4096))
    with pytest.raises(ValueError, match=flag):
        scheduler.add_request(_engine_request(name, max_tokens=1000, **fields))
    assert not scheduler.requests


def test_the_engines_bounds_are_the_ones_serve_was_given():
    from harness.engine.config import EngineConfig
    from harness.engine.scheduler import Scheduler
    from harness.wire.limits import RequestLimits

    config = EngineConfig(executor="sim", vocab_size=4096, request_limits=RequestLimits(max_stop_token_ids=100))
    scheduler = Scheduler(config)
    scheduler.add_request(_engine_request("raised", stop_token_ids=[5] * 100))
    with pytest.raises(ValueError, match="--max-stop-token-ids"):
        scheduler.add_request(_engine_request("over", stop_token_ids=[5] * 101))


@pytest.mark.slow
def test_an_oversize_request_from_the_peer_fails_alone():
    """Straight onto a real engine's socket: each oversize request gets an error output of its own,
    and a normal request sent after them all completes."""
    from harness.wire import zmq_link
    from wirecodecs import get_codec

    from serve_process import sim_engine

    codec = get_codec("msgspec")
    with sim_engine() as (proc, push, pull):
        for name, (fields, _) in OVERSIZE.items():
            req = _engine_request(name, max_tokens=1000, **fields)
            push.send_multipart([zmq_link.envelope(zmq_link.ADD, name), *codec.encode(req)])
        push.send_multipart([zmq_link.envelope(zmq_link.ADD, "good"), *codec.encode(_engine_request("good", 20))])
        errors: dict[str, str] = {}
        good: list[int] = []
        finished = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (len(errors) == len(OVERSIZE) and finished):
            frames = pull.recv_multipart()
            kind, _ = zmq_link.open_envelope(frames[0])
            if kind != zmq_link.OUTPUTS:
                continue
            for out in codec.decode(frames[1:], EngineCoreOutputs).outputs:
                if out.request_id == "good":
                    good += out.new_token_ids
                    finished = out.finished
                elif out.finished:
                    assert out.finish_reason == FinishReason.REJECTED, out
                    errors[out.request_id] = out.error or ""
        assert {name: flag in errors.get(name, "") for name, (_, flag) in OVERSIZE.items()} == dict.fromkeys(
            OVERSIZE, True
        ), errors
        assert len(good) == 20 and finished
        assert proc.is_alive()


@pytest.mark.slow
def test_a_raised_bound_reaches_the_engine():
    """`bench serve --max-stop-token-ids 100` raises the engine's bound too: 100 ids are served, 101 refused."""
    server = start_serve("--max-stop-token-ids", "100", codec="msgspec")

    async def post(n: int) -> tuple[int, dict]:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 2, "stop_token_ids": [4000] * n}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{server.base_url}/v1/completions", json=body) as resp,
        ):
            return resp.status, await resp.json(content_type=None)

    try:
        served, refused = asyncio.run(post(100)), asyncio.run(post(101))
    finally:
        server.stop()
    assert served[0] == 200, served
    assert refused[0] == 400 and "--max-stop-token-ids" in refused[1]["error"]["message"], refused


# --- large JSON bodies are parsed off the event loop, with the same answers ----------------------


def _pad_to(body: bytes, size: int) -> bytes:
    """``body`` (a JSON object) with trailing whitespace up to ``size`` bytes: still the same JSON."""
    return body + b" " * max(0, size - len(body))


BODY_CASES = {  # raw body -> (status, a part of the message)
    "valid": (b'{"model": "wirebench-tiny", "prompt": "hello", "max_tokens": 2}', 200, ""),
    "bad JSON": (b'{"model": "wirebench-tiny", "prompt": "hello",', 400, "not valid JSON"),
    "too many elements": (b'{"prompt": [' + b"1," * 70_000 + b"1]}", 413, "--max-json-elements"),
    "too deep": (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
}


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("case", sorted(BODY_CASES))
def test_a_body_gets_the_same_answer_on_either_side_of_the_off_loop_threshold(case, size, monkeypatch):
    import threading

    from aiohttp.test_utils import TestClient, TestServer

    from harness.frontend import app as app_module
    from harness.frontend.app import PARSE_OFF_LOOP_BYTES, build_app
    from harness.frontend.settings import FrontendSettings
    from harness.tokenizers.tokenizer import load_tokenizer

    from fake_engine import FakeEngine

    raw, status, message = BODY_CASES[case]
    if size == "large":
        raw = _pad_to(raw, PARSE_OFF_LOOP_BYTES + 10)
    else:
        assert len(raw) < PARSE_OFF_LOOP_BYTES
    tokenizer = load_tokenizer()
    parsed_on: list[str] = []
    parse = app_module.parse_json_body

    def recorded(*args: object) -> object:
        parsed_on.append(threading.current_thread().name)
        return parse(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(app_module, "parse_json_body", recorded)

    async def scenario() -> tuple[int, dict]:
        app = build_app(FakeEngine(tokenizer.encode("Hi there.")), tokenizer, FrontendSettings())
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/v1/completions", data=raw, headers={"Content-Type": "application/json"})
            return resp.status, await resp.json()

    got_status, body = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert got_status == status, body
    assert len(parsed_on) == 1 and parsed_on[0].startswith("json-parse") == (size == "large"), parsed_on
    if status != 200:
        assert message in body["error"]["message"], body


# --- dataset files: each bad line is one error naming the file and line, with bounded memory ---------------

HOSTILE_LINES = {
    "trace-input-1e8": ("trace", '{"timestamp": 0, "input_length": 100000000, "output_length": 5, "hash_ids": [1]}'),
    "trace-input-1e12": ("trace", '{"timestamp": 0, "input_length": 1000000000000, "output_length": 5}'),
    "trace-timestamp-1e300": (
        "trace",
        '{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
        '{"timestamp": 1e300, "input_length": 5, "output_length": 5}',
    ),
    "trace-timestamp-nan": ("trace", '{"timestamp": NaN, "input_length": 5, "output_length": 5}'),
    "custom-surrogate": ("custom", '{"prompt": "\\ud800x"}'),
    "custom-deep": ("custom", '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"),
}


def _under_4_gib() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(HOSTILE_LINES))
def test_a_hostile_dataset_line_is_one_error_in_bounded_memory(tmp_path, case):
    """`bench load` under a 4 GiB address-space cap: exit 2 within 20 s with one line naming the file and
    line (a trace line of 10^8 tokens once grew it to 22 GB; a lone surrogate or 100,000-deep nesting
    ended in a traceback)."""
    import subprocess
    import sys

    from fake_openai_server import FakeConfig, FakeOpenAIServer

    dataset, text = HOSTILE_LINES[case]
    path = tmp_path / "lines.jsonl"
    path.write_text(text + "\n")
    with FakeOpenAIServer(FakeConfig()) as srv:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "harness.cli", "load", "--base-url", srv.base_url, "--num-prompts", "4"]
            + ["--dataset-name", dataset, "--dataset-path", str(path), "--no-save-result"],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_under_4_gib,
        )
        took = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"bench load: error: {path}, line ") and "Traceback" not in done.stderr, lines
    assert took < 20, took


@pytest.mark.slow
def test_a_block_size_past_the_bound_is_refused_at_the_flag():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "load", "--dataset-name", "trace", "--trace-block-size", "1000000000"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_under_4_gib,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("--trace-block-size: must be at most 1048576 tokens, got 1000000000")
    )
