"""Shared test fixtures: kept minimal on purpose.

The optional parts (markers registered in pyproject.toml): a test marked ``vllm``, ``ray``,
``chromium`` or ``valgrind`` is skipped, with the way to get the part, on a machine without it; one
marked ``sglang_cpu`` where SGLang's CPU venv is absent or does not import (probed once, when such a
test runs: the import takes ~10 s).
Cases of a test parametrized with the ``vllm`` codec are marked ``vllm`` here, so
``-m "not vllm"`` leaves out everything that imports vLLM.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

import wirecodecs

CHROMIUM_BINARIES = ("chromium", "chromium-browser", "google-chrome")
SGLANG_PYTHON = Path(__file__).resolve().parents[1] / ".venv-sglang" / "bin" / "python"


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
def sglang_cpu_missing() -> str | None:
    """Why the ``sglang_cpu`` tests cannot run here; None where SGLang's CPU venv imports."""
    if not SGLANG_PYTHON.is_file():
        return f"needs SGLang's CPU venv in {SGLANG_PYTHON.parents[1]} (scripts/setup.sh --with-sglang-cpu)"
    probe = [str(SGLANG_PYTHON), "-c", "import sglang.launch_server, harness.sglang_hook.startup"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"SGLang in {SGLANG_PYTHON.parents[1]} does not import: {done.stderr.strip()[-300:]}"
    return None


@pytest.fixture(autouse=True)
def _skip_without_sglang(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("sglang_cpu") is not None and (missing := sglang_cpu_missing()):
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
