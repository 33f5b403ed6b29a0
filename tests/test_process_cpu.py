"""Process CPU accounting (harness.loadgen.process_cpu): the arithmetic, and real process trees."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.loadgen import process_cpu
from harness.loadgen.process_cpu import Snapshot


def snap(at: float, **seconds: float) -> Snapshot:
    return Snapshot(at, seconds)


def test_usage_is_cpu_over_wall_and_per_request_and_token_and_names_a_saturated_process() -> None:
    before = snap(10.0, client=1.0, frontend=2.0, engine=3.0)
    after = snap(14.0, client=2.0, frontend=5.8, engine=5.0)
    cpu = process_cpu.usage(before, after, requests=100, output_tokens=2_000)
    assert cpu["wall_s"] == 4.0
    assert cpu["roles"]["frontend"] == {
        "cpu_s": 3.8,
        "cores": 0.95,
        "ms_per_request": 38.0,
        "us_per_output_token": 1900.0,
    }
    assert cpu["busiest"] == "frontend" and cpu["saturated"]
    assert any("Out of CPU: the frontend" in line for line in process_cpu.format_lines(cpu))
    # An engine busy all the time is how continuous batching runs under load: reported, never "out of CPU".
    calm = process_cpu.usage(before, snap(14.0, client=1.4, frontend=3.0, engine=6.9), 100, 2_000)
    assert calm["roles"]["engine"]["cores"] == 0.975
    assert calm["busiest"] == "frontend" and not calm["saturated"]
    assert not any("Out of CPU" in line for line in process_cpu.format_lines(calm))


def test_a_client_shared_by_arms_is_per_all_the_requests_it_sent() -> None:
    before, after = snap(0.0, client=0.0, engine=0.0), snap(2.0, client=1.0, engine=0.5)
    cpu = process_cpu.usage(before, after, requests=10, output_tokens=100, client_share=(40, 400))
    assert cpu["roles"]["client"]["ms_per_request"] == 25.0 and cpu["roles"]["engine"]["ms_per_request"] == 50.0
    assert process_cpu.usage(before, after, 0, 0)["roles"]["engine"]["ms_per_request"] is None


def test_descendants_and_cpu_seconds_read_real_processes() -> None:
    # A child that starts a grandchild and then spends CPU; both are found below this process.
    code = "import subprocess, time; p = subprocess.Popen(['sleep', '30']); t = time.process_time()\n"
    code += "while time.process_time() - t < 0.3: pass\nprint('busy', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "busy"
        below = process_cpu.descendants(child.pid)
        assert len(below) == 1 and process_cpu.cpu_seconds(below[0]) < 0.2  # sleep spends nothing
        assert child.pid in process_cpu.descendants(process_cpu.os.getpid())
        assert process_cpu.cpu_seconds(child.pid) >= 0.25  # at least its busy loop (10 ms ticks)
        # Every process below a server is its engine's (bench serve's engine, vLLM's EngineCore and workers).
        assert process_cpu.server_roles(child.pid) == {"frontend": [child.pid], "engine": below}
    finally:
        for pid in process_cpu.descendants(child.pid):
            subprocess.run(["kill", str(pid)], check=False)
        child.kill()
        child.wait()
    assert process_cpu.cpu_seconds(child.pid) == pytest.approx(0.0)  # gone: 0, not an error
