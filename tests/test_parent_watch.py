"""A server must not outlive the bench command that started it, even one killed outright (SIGKILL):
wirebench's own server and a real vLLM's API server (through the plugin) end with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

# The child: what a server does at its start (bench serve's die_with_parent, or the vLLM plugin's register
# with no codec set), then waits to be ended; it prints its pid first.
CHILD = {
    "bench serve": "from harness.processes.parent_watch import die_with_parent; die_with_parent()",
    "vllm plugin": "from harness.vllm_plugin import register; register()",
}
# The parent: starts the child with its own pid named, as harness.experiment.server does, and waits.
PARENT = """
import os, subprocess, sys, time
env = {**os.environ, "WIREBENCH_PARENT_PID": str(os.getpid())}
code = sys.argv[1] + "; import os, sys, time; print(os.getpid(), flush=True); time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended; only its parent's wait is missing
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
@pytest.mark.parametrize("who", sorted(CHILD))
def test_a_server_ends_when_its_parent_is_killed_outright(who: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD[who]], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.3)
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"{who}: the child outlived its killed parent"
    finally:
        parent.kill()


def test_the_plugin_leaves_vllm_s_own_children_alone() -> None:
    """The variable is popped by the first process that loads the plugin (the API server), so the engine
    vLLM spawns after it never watches a process that is not its parent."""
    code = (
        "import os; from harness.processes.parent_watch import ENV; from harness.vllm_plugin import register; "
        "os.environ[ENV] = str(os.getppid()); register(); print(ENV in os.environ)"
    )
    env = {k: v for k, v in os.environ.items() if k != "WIREBENCH_VLLM_CODEC"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
