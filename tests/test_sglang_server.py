"""The real SGLang, on the CPU, as a server under test (where scripts/setup.sh --with-sglang-cpu made
.venv-sglang): it starts on the tiny model, streams a chat completion in both of its IPC modes (pickle,
msgpack) with wirebench's hook timing every hop, and stops leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import sglang_hook
from harness.experiment.sglang_server import MODELS, left_behind, remove_leftovers, shm_files
from harness.sglang_hook.records import hops, read_folder, read_rows

ROOT = Path(__file__).resolve().parents[1]
SGLANG_PYTHON = sglang_hook.PYTHON
# What scripts/setup_sglang_cpu.sh makes; made again here (in seconds) when absent.
MODEL = MODELS / "tiny-wirebench"
# The fastest start on 2 cores (docs/sglang.md): torch's own attention, a small KV pool.
SERVER_FLAGS = ["--device", "cpu", "--attention-backend", "torch_native", "--max-total-tokens", "8192"]
START_S = 300
STOP_S = 60
# ~550 prompt tokens with wirebench's tokenizer (the chat template adds a few).
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "engineers", "measure")
PROMPT = " ".join(WORDS[i % len(WORDS)] for i in range(300))
MAX_TOKENS = 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session_processes(session: int) -> list[int]:
    """Every live process of a session (the server and all it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    found.append(int(entry.name))
            except ProcessLookupError:
                continue
    return found


def _wait_ready(server: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"SGLang exited with {server.returncode} at start:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"SGLang not ready after {START_S} s:\n{log.read_text()[-3000:]}")


def _stop(server: subprocess.Popen[bytes]) -> list[int]:
    """SIGTERM (SGLang stops its scheduler and detokenizer itself), SIGKILL to the session if that fails;
    the processes still alive after that."""
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
    deadline = time.monotonic() + 10
    while (left := _session_processes(server.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (MODEL / "config.json").is_file():
        return MODEL
    out = tmp_path_factory.mktemp("sglang-model") / "tiny-wirebench"
    subprocess.run(
        [str(SGLANG_PYTHON), "-m", "harness.vllm_plugin.model", str(out), "--preset", "tiny"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


@pytest.fixture
def sglang_server(request: pytest.FixtureRequest, model: Path, tmp_path: Path) -> Iterator[tuple[int, Path, str]]:
    """A running SGLang in the IPC mode ``request.param`` ("1" pickle, "0" msgpack): its port, its spans
    folder, the mode."""
    port, spans, log = _free_port(), tmp_path / "spans", tmp_path / "sglang.log"
    env = {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_USE_PICKLE_IPC": request.param,
        "WIREBENCH_SGLANG_SPANS": str(spans),
    }
    command = [str(SGLANG_PYTHON), "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port)]
    # SGLang's teardown kills its processes outright, which skips their unlink of its load-snapshot file in
    # /dev/shm (its own sweep, sglang.srt.utils.stale_shm_cleanup, runs only in SGLang's CI): the test
    # removes the one its server left, not another worker's server's, which that server holds.
    before = shm_files()
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command + SERVER_FLAGS, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        _wait_ready(server, port, log)
        yield port, spans, "pickle" if request.param == "1" else "msgpack"
    finally:
        left = _stop(server)
        assert left == [], f"SGLang left processes behind: {left}"
        remove_leftovers(before)


def _stream_chat(port: int, rid: str) -> dict[str, Any]:
    """One streaming chat completion; what came back."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,  # random weights: without it the stream may stop at any token
        "stream": True,
        "stream_options": {"include_usage": True},
        "rid": rid,  # SGLang's own request id, so the records of this request can be told apart
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    seen: dict[str, Any] = {"chunks": 0, "done": False, "usage": None, "finish": None}
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            data = line.strip().removeprefix(b"data:").strip()
            if not line.startswith(b"data:"):
                continue
            if data == b"[DONE]":
                seen["done"] = True
                break
            chunk = json.loads(data)
            seen["usage"] = chunk.get("usage") or seen["usage"]
            for choice in chunk.get("choices", []):
                seen["chunks"] += 1
                seen["finish"] = choice.get("finish_reason") or seen["finish"]
    return seen


@pytest.mark.slow  # a SGLang start is 25-60 s here
@pytest.mark.sglang_cpu
@pytest.mark.parametrize("sglang_server", ["1", "0"], ids=["pickle-ipc", "msgpack-ipc"], indirect=True)
def test_sglang_streams_a_chat_completion_and_the_hook_times_every_hop(
    sglang_server: tuple[int, Path, str],
) -> None:
    port, spans, ipc = sglang_server
    rid = f"wirebench-smoke-{port}"
    seen = _stream_chat(port, rid)
    assert seen["done"] and seen["finish"] == "length", seen
    assert seen["usage"]["completion_tokens"] == MAX_TOKENS, seen
    assert 500 <= seen["usage"]["prompt_tokens"] <= 600, seen
    time.sleep(0.5)  # the hook writes its records every 0.2 s
    by_role = read_folder(spans)
    assert set(by_role) == {"tokenizer", "scheduler", "detokenizer"}, sorted(by_role)
    metas = [read_rows(path)[0][0][1] for path in spans.glob("*.jsonl")]
    assert {meta["ipc"] for meta in metas} == {ipc}  # SGLANG_USE_PICKLE_IPC reached all three processes
    routes = {(h.sender, h.receiver) for h in hops(spans, rid)}
    assert routes == {("tokenizer", "scheduler"), ("scheduler", "detokenizer"), ("detokenizer", "tokenizer")}
    for hop in hops(spans, rid):
        assert hop.messages >= 1 and hop.bytes > 0, hop


@pytest.mark.slow
@pytest.mark.sglang_cpu
def test_bench_run_against_real_sglang_times_both_ipc_modes_per_hop(tmp_path: Path) -> None:
    """Two real SGLang servers (pickle and msgpack between its processes), one round in blocks: per arm the
    codec figures and every hop of the first-token path measured inside SGLang's three processes, the
    detokenizer's CPU as a role of its own, and nothing left behind (processes, /dev/shm files)."""
    before = shm_files()
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--server", "sglang", "--codec", "pickle,msgspec"]
        + ["--dataset-name", "random", "--random-input-len", "200", "--random-output-len", "16"]
        + ["--num-prompts", "6", "--request-rate", "4", "--repeat", "1", "--block-size", "3"]
        + ["--result-dir", str(tmp_path), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    (compare,) = tmp_path.glob("compare-*.json")
    runs = json.loads(compare.read_text())["runs"]
    assert sorted(r["codec"] for r in runs) == ["msgspec", "pickle"]
    for run in runs:
        figures = run["figures"]
        assert figures["failed"] == 0
        for key in ("request_encode_us", "request_decode_us", "output_encode_us", "output_decode_us"):
            assert figures[key] > 0, (run["codec"], key, figures)
        for hop in ("request_encode", "request_queue", "output_wire", "detok_encode", "detok_wire", "detok_decode"):
            assert figures[f"ipc_{hop}_p50_us"] > 0, (run["codec"], hop, figures)
        steps = run["blocks"]["step_codec_wire_us"]
        assert len(steps) == 2 and all(v is not None and v > 0 for v in steps), (run["codec"], steps)
    run_files = sorted(tmp_path.glob("*-r0-*.json"))
    assert len(run_files) == 2, run_files
    for path in run_files:
        doc = json.loads(path.read_text())
        seen = doc["metadata"]["sglang_hook"]
        assert set(seen) == {"tokenizer", "scheduler", "detokenizer"}, seen
        expected = "pickle" if path.name.startswith("pickle") else "msgpack"
        assert {role["ipc"] for role in seen.values()} == {expected}, (path.name, seen)
        assert set(doc["process_cpu"]["roles"]) == {"client", "frontend", "engine", "detokenizer"}
    assert "detok → tokenizer wire" in done.stdout  # the second output hop has its rows in the IPC budget
    assert _sglang_processes_of(tmp_path) == []
    assert left_behind(before) == [], "the servers' /dev/shm files were left behind"


def _sglang_processes_of(folder: Path) -> list[int]:
    """Live processes whose hook writes under ``folder`` (the run's servers and their children)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(folder).encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
