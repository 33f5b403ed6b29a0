"""The shm transport end to end: real processes, real /dev/shm, nothing left behind, corruption caught."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.transports.shm import SHM_DIR

from serve_process import chat_with_images, leftovers_of, shm_segments, start_serve, still_alive

pytestmark = pytest.mark.slow  # each test starts real server processes

SHM_FLAGS = ("--transport", "shm", "--mm-payload", "tensor", "--shm-threshold", "1024")


def test_images_travel_through_shared_memory_and_no_segment_outlives_a_clean_stop():
    server = start_serve(*SHM_FLAGS, codec="msgspec-oob")
    pids = server.pids
    try:
        mine = [name for name in shm_segments() if name.startswith(f"wirebench-{server.proc.pid}-")]
        assert len(mine) == 1
        (name,) = mine
        assert oct((SHM_DIR / name).stat().st_mode & 0o777) == "0o600"
        results = asyncio.run(chat_with_images(server.base_url, list(range(30))))
    finally:
        assert server.stop() == 0
    assert [status for status, _ in results] == [200] * 30
    assert leftovers_of(pids) == []


@pytest.mark.parametrize("victim", ["engine", "frontend"])
def test_no_segment_survives_a_sigkill(victim):
    server = start_serve(*SHM_FLAGS, codec="pickle-oob")
    engine, children, pids = server.engine_pid, server.child_pids, server.pids
    asyncio.run(chat_with_images(server.base_url, list(range(4))))
    if victim == "engine":
        os.kill(engine, signal.SIGKILL)
        assert server.stop() == 0  # the frontend notices, fails what was in flight, unlinks its arena
    else:
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        assert not still_alive(children, grace_s=5)  # the engine follows its frontend
        start_serve(*SHM_FLAGS, codec="pickle-oob").stop()  # and a new start removes what is left
    assert leftovers_of(pids) == []


def test_a_codec_without_out_of_band_frames_gets_a_clear_error():
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "serve", "--codec", "msgspec-b64", "--transport", "shm"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "msgspec-oob" in done.stderr and "out-of-band" in done.stderr


def test_verify_catches_every_buffer_a_broken_transport_swaps(monkeypatch):
    """WIREBENCH_FAULT makes the engine's shm receiver hand each request the previous request's
    buffer (the race a fast transport can have). Without --verify they are served silently, unless
    the arena's generation check happens to see the previous block already reused (a timing race:
    seen once in a CI-like run); with it every swapped request fails with an integrity error and
    none is served wrong."""
    monkeypatch.setenv("WIREBENCH_FAULT", "swap-shm-buffers")
    for flags, expect_caught in (((), False), (("--verify",), True)):
        server = start_serve(*SHM_FLAGS, "--executor", "sim", *flags, codec="msgspec-oob")
        try:
            results = asyncio.run(chat_with_images(server.base_url, list(range(12))))
        finally:
            server.stop()
        failed = [body["error"]["message"] for status, body in results if status != 200]
        if not expect_caught:
            # The danger: wrong images served, and nobody notices (only a reused block can be caught).
            assert all("reused" in m for m in failed) and len(failed) <= len(results) // 2, failed
        else:
            assert len(failed) >= 11 and all("integrity check failed" in m or "reused" in m for m in failed)


def test_bench_run_compares_transports_with_verify_and_reports_what_cannot_run(tmp_path: Path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--result-dir",
            str(tmp_path),
            "--no-progress",
            "--codec",
            "msgspec-oob,pickle",
            "--transport",
            "zmq,shm",
            "--verify",
            "--images-per-request",
            "1",
            "--image-width",
            "64",
            "--image-height",
            "64",
            "--mm-payload",
            "tensor",
            "--num-prompts",
            "100",
            "--request-rate",
            "inf",
            "--sonnet-output-len",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    (compare,) = tmp_path.glob("compare-*.json")
    doc = json.loads(compare.read_text())
    statuses = {r["codec"]: r for r in doc["runs"]}
    assert set(statuses) == {"msgspec-oob/zmq", "msgspec-oob/shm", "pickle/zmq", "pickle/shm"}
    assert statuses["pickle/shm"]["status"] == "unsupported" and "out-of-band" in statuses["pickle/shm"]["message"]
    for label in ("msgspec-oob/zmq", "msgspec-oob/shm", "pickle/zmq"):
        assert statuses[label]["status"] == "ok" and statuses[label]["figures"]["completed"] == 100
