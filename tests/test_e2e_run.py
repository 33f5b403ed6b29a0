"""End to end: `bench run` starts real servers per codec and compares them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def bench_run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "harness.cli", "run", "--result-dir", str(tmp_path), "--no-progress", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def comparison(tmp_path: Path) -> dict:
    (path,) = tmp_path.glob("compare-*.json")
    return json.loads(path.read_text())


def test_interleaved_repeats_compare_two_codecs(tmp_path):
    done = bench_run(
        tmp_path,
        "--codec",
        "pickle,msgspec",
        "--repeat",
        "2",
        "--num-prompts",
        "12",
        "--request-rate",
        "40",
        "--sonnet-output-len",
        "20",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = comparison(tmp_path)
    assert [(r["codec"], r["round"]) for r in summary["runs"]] == [
        ("pickle", 0),
        ("msgspec", 0),
        ("pickle", 1),
        ("msgspec", 1),
    ]
    assert all(r["status"] == "ok" for r in summary["runs"])
    for codec in ("pickle", "msgspec"):
        row = summary["table"][codec]
        assert len(row["mean_ttft_ms"]["values"]) == 2
        assert row["request_encode_us"]["median"] > 0
    result = json.loads((tmp_path / summary["runs"][0]["result_file"]).read_text())  # relative to the compare file
    assert result["completed"] == 12 and result["codec"] == "pickle"
    assert len(result["ttfts"]) == 12 and result["output_lens"] == [20] * 12
    assert "Serving Benchmark Result" in done.stdout and "Codec comparison" in done.stdout


def test_image_workload_marks_text_only_codec_unsupported(tmp_path):
    done = bench_run(
        tmp_path,
        "--codec",
        "msgspec,msgspec-oob",
        "--images-per-request",
        "1",
        "--image-width",
        "64",
        "--image-height",
        "64",
        "--num-prompts",
        "6",
        "--sonnet-output-len",
        "8",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = comparison(tmp_path)
    statuses = {r["codec"]: r for r in summary["runs"]}
    assert statuses["msgspec"]["status"] == "unsupported"
    assert "cannot carry PIL.Image.Image" in statuses["msgspec"]["message"]
    assert statuses["msgspec-oob"]["status"] == "ok"


def test_unknown_codec_is_a_clear_error(tmp_path):
    done = bench_run(tmp_path, "--codec", "pickle,nope")
    assert done.returncode == 2
    assert "unknown codec(s) nope" in done.stderr and "msgspec-oob" in done.stderr


def test_ctrl_c_stops_servers_and_saves_what_it_has(tmp_path):
    import signal
    import time

    from serve_process import child_pids, still_alive

    cmd = [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        "--result-dir",
        str(tmp_path),
        "--no-progress",
        "--codec",
        "msgspec",
        "--num-prompts",
        "400",
        "--request-rate",
        "20",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    servers: list[int] = []
    while time.monotonic() < deadline and not servers:
        servers = child_pids(proc.pid)
        time.sleep(0.2)
    assert servers, "bench run should have started a server"
    engines = [p for s in servers for p in child_pids(s)]
    time.sleep(8)  # server up and some requests done
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert not still_alive(servers + engines)
    summary = comparison(tmp_path)
    (run,) = summary["runs"]
    assert run["status"] == "interrupted"
    result = json.loads((tmp_path / run["result_file"]).read_text())
    assert 0 < result["completed"] < 400
    assert result["completed"] + result["failed"] == 400  # every request accounted for
