"""Shared test fixtures: kept minimal on purpose.

The optional parts (markers registered in pyproject.toml): a test marked ``vllm``, ``ray``,
``chromium`` or ``valgrind`` is skipped, with the way to get the part, on a machine without it; one
marked ``vllm_cpu`` or ``sglang_cpu`` where that server's venv is absent or does not import (probed
once, when such a test runs).
Cases of a test parametrized with the ``vllm`` codec are marked ``vllm`` here, so
``-m "not vllm"`` leaves out everything that imports vLLM.
Under pytest-xdist (``-n 2``) a test marked ``alone`` waits for the test beside it to end and runs
with none beside it: its verdicts would otherwise judge the other worker's load.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
import zmq

import wirecodecs
from harness import sglang_hook
from harness.experiment.vllm_server import DEFAULT_PYTHON as VLLM_PYTHON

CHROMIUM_BINARIES = ("chromium", "chromium-browser", "google-chrome")
# A real server's own venv, by the marker of the tests that need it: its Python, what must import there,
# and how to make it.
SERVER_VENVS = {
    "vllm_cpu": (
        VLLM_PYTHON,
        "vllm.entrypoints.openai.api_server, harness.vllm_plugin",
        "vLLM's CPU build",
        "--with-vllm-cpu",
    ),
    "sglang_cpu": (
        sglang_hook.PYTHON,
        "sglang.launch_server, harness.sglang_hook.startup",
        "SGLang's CPU path",
        "--with-sglang-cpu",
    ),
}


def chromium_binary() -> str | None:
    """The first headless-capable browser on PATH (tests/test_htmlreport.py renders the report in it)."""
    return next((b for b in CHROMIUM_BINARIES if shutil.which(b)), None)


def missing_parts() -> dict[str, str]:
    """Optional part (its marker) → why its tests skip here; only the parts this machine lacks."""
    reasons = {
        "vllm": "vLLM not installed (scripts/setup.sh --with-vllm)",
        "ray": "Ray not installed (scripts/setup.sh --test installs it)",
        "chromium": "no chromium binary (Debian: apt-get install -y chromium)",
        "valgrind": "no valgrind (Debian: apt-get install -y valgrind)",
    }
    present = {
        "vllm": "vllm" in wirecodecs.available_codecs(),  # finds the package without importing it
        "ray": importlib.util.find_spec("ray") is not None,
        "chromium": chromium_binary() is not None,
        "valgrind": shutil.which("valgrind") is not None,
    }
    return {part: why for part, why in reasons.items() if not present[part]}


@functools.cache
def server_venv_missing(marker: str) -> str | None:
    """Why the tests marked ``marker`` cannot run here; None where that server's venv imports (probed once
    a process: an import takes ~10 s)."""
    python, imports, what, flag = SERVER_VENVS[marker]
    if not python.is_file():
        return f"needs {what} in {python.parents[1]} (scripts/setup.sh {flag})"
    done = subprocess.run([str(python), "-c", f"import {imports}"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"{what} in {python.parents[1]} does not import: {done.stderr.strip()[-300:]}"
    return None


@pytest.fixture(autouse=True)
def _skip_without_the_server_venv(request: pytest.FixtureRequest) -> None:
    for marker in SERVER_VENVS:
        if request.node.get_closest_marker(marker) is not None and (missing := server_venv_missing(marker)):
            pytest.skip(missing)


# Collection rewrites every test module's asserts; with bytecode writing off (PYTHONDONTWRITEBYTECODE, as on
# this project's machines) it does so on every run, about 10 s of a collection here. The suite keeps its
# rewritten modules and the modules they import in __pycache__ (ignored by git) even so.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    # Decoded tensors are documented read-only views on received frames;
    # torch warns (once per process) when it wraps such a buffer. rawbuf
    # silences it at import, but pytest resets filters around each test.
    config.addinivalue_line("filterwarnings", "ignore:The given buffer is not writable:UserWarning")


@contextlib.contextmanager
def _turn(item: pytest.Item) -> Iterator[None]:
    """Under xdist: a shared lock on the room for an ordinary test, an exclusive one for an ``alone``
    test, both taken through a turnstile so that the ordinary tests of the other worker cannot keep an
    ``alone`` test waiting for ever (flock lets a shared lock past a waiting exclusive one)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    folder = item.config.rootpath / ".pytest_cache" / "turns"  # one folder for every worker (git ignores it)
    folder.mkdir(parents=True, exist_ok=True)
    alone = item.get_closest_marker("alone") is not None
    with open(folder / "turnstile", "a") as turnstile, open(folder / "room", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # closing the files lets both locks go


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (a test's servers, once stopped)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # WIREBENCH_TEST_CPU_LOG=FILE: a line a test, "wall_s cpu_s nodeid" (where the suite's work goes; the
    # wall time includes an alone test's wait for its turn).
    log = os.environ.get("WIREBENCH_TEST_CPU_LOG")
    started, cpu = time.monotonic(), _cpu_s()
    with _turn(item):  # around setup, call and teardown: a module's server starts and stops inside it
        yield
    if log:
        with open(log, "a") as out:
            out.write(f"{time.monotonic() - started:.2f} {_cpu_s() - cpu:.2f} {item.nodeid}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = missing_parts()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and any(isinstance(v, str) and v == "vllm" for v in callspec.params.values()):
            item.add_marker(pytest.mark.vllm)
        for part, why in missing.items():
            if item.get_closest_marker(part) is not None:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def zmq_pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A connected (sender, receiver) PAIR over inproc, on a private context."""
    ctx: zmq.Context = zmq.Context()
    address = f"inproc://wirebench-test-{uuid.uuid4().hex}"
    receiver = ctx.socket(zmq.PAIR)
    sender = ctx.socket(zmq.PAIR)
    for sock in (receiver, sender):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 5000)  # a lost message fails the test, never hangs it
        sock.setsockopt(zmq.SNDTIMEO, 5000)
    receiver.bind(address)
    sender.connect(address)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()
        ctx.term()
