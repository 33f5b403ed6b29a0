"""The transport registry: the built-ins, what it refuses, and a transport added from outside that works in
``bench serve`` and ``bench micro`` like a built-in.

The outside transport is installed as a real (tiny) distribution: a ``*.dist-info`` folder with
``entry_points.txt`` next to the module, in a temporary folder on the subprocesses' ``PYTHONPATH``, so
``importlib.metadata`` finds it exactly as it would a pip-installed package. It is the worked example of
docs/architecture.md ("Adding a transport"), which this test keeps honest.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_check_codec import install_plugin

from harness.transports import ENTRY_POINT_GROUP, FrameSender, Transport, get_transport, transport_names
from harness.transports import registry as transport_registry
from harness.transports.base import VARIANTS
from harness.wire import zmq_link

from serve_process import chat_with_images, start_serve

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def example_source() -> str:
    """The example transport's module, as docs/architecture.md shows it (one place for it)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    match = re.search(r"```python\n(# file_transport\.py.*?)```", text, re.DOTALL)
    assert match, "docs/architecture.md lost its example transport"
    return match.group(1)


def bench(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def file_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("wirebench-files-*")}


# --- the built-ins ----------------------------------------------------------------------------------


def test_the_builtins_are_registered_with_their_facts() -> None:
    assert transport_names()[:5] == ("zmq", "shm", "torch-shm", "shm-store", "cuda-ipc")
    for name in transport_names()[:5]:
        transport = get_transport(name)
        assert isinstance(transport, Transport) and transport.name == name and transport.summary
        assert set(transport.variants) <= set(VARIANTS)
        assert transport.out_of_band == (name != "zmq")
        if transport.out_of_band:
            assert transport.add_kind in zmq_link.OUT_OF_BAND_ADDS
    assert get_transport("cuda-ipc").needs_cuda and not get_transport("shm").needs_cuda
    # The registry checks what a transport declares against what its sender builds.
    for name in transport_names()[1:5]:
        sender_class = get_transport(name).sender_class
        assert sender_class is not None and sender_class.add_kind == get_transport(name).add_kind
    # shm-store's entries are arena blocks: the same kind as shm, the same receiver.
    assert get_transport("shm-store").add_kind == get_transport("shm").add_kind


def test_every_variant_belongs_to_a_transport() -> None:
    owners = {v for name in transport_names() for v in get_transport(name).variants}
    assert owners == set(VARIANTS)


def test_an_unknown_name_is_refused_with_the_choices() -> None:
    with pytest.raises(KeyError, match="unknown transport 'carrier-pigeon'; choose from zmq, shm"):
        get_transport("carrier-pigeon")


class _Unnamed(Transport):
    name = "other"


class _BadKind(Transport):
    name = "bad-kind"
    add_kind = 0x11  # READY's kind


class _OtherKindSender(FrameSender):
    add_kind = 0x07


class _KindSixSender(FrameSender):
    add_kind = 0x06


class _SenderOfAnotherKind(Transport):
    name = "two-kinds"
    add_kind = 0x06
    sender_class = _OtherKindSender


class _NoReceiver(Transport):
    name = "no-receiver"
    add_kind = 0x06
    sender_class = _KindSixSender


class _BadVariant(Transport):
    name = "bad-variant"
    variants = ("turbo",)


@pytest.mark.parametrize(
    ("name", "target", "problem"),
    [
        ("not-a-class", "os:getcwd", "not a harness.transports.Transport subclass"),
        ("unnamed", f"{__name__}:_Unnamed", "names itself 'other'"),
        ("bad-kind", f"{__name__}:_BadKind", "outside the out-of-band ADD kinds"),
        ("bad-variant", f"{__name__}:_BadVariant", "unknown variants ['turbo']"),
        ("two-kinds", f"{__name__}:_SenderOfAnotherKind", "its sender_class builds ADDs of kind 0x7"),
        ("no-receiver", f"{__name__}:_NoReceiver", "needs a receiver_class exactly when"),
        ("gone", "no_such_module:X", "cannot be loaded"),
    ],
)
def test_a_registered_transport_that_cannot_serve_is_refused_naming_its_entry_point(
    monkeypatch: pytest.MonkeyPatch, name: str, target: str, problem: str
) -> None:
    monkeypatch.setattr(transport_registry, "_registered", lambda: {**transport_registry._BUILTIN, name: target})
    transport_registry.get_transport.cache_clear()
    try:
        with pytest.raises(KeyError, match=re.escape(problem)) as caught:
            get_transport(name)
        assert f"entry point '{name} = {target}'" in str(caught.value)
        assert name not in [t.name for t in transport_registry.loaded_transports()]  # help still builds
    finally:
        transport_registry.get_transport.cache_clear()


# --- a transport from outside --------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> dict[str, str]:
    source = {"file_transport": example_source()}
    return install_plugin(tmp_path, source, {"file": "file_transport:FileTransport"}, ENTRY_POINT_GROUP)


def test_the_outside_transport_is_a_choice_everywhere(outside: dict[str, str]) -> None:
    for command in ("serve", "run", "micro"):
        done = bench(command, "--help", env=outside)
        assert done.returncode == 0, done.stderr
        text = re.sub(r"\s+", "", done.stdout)  # argparse wraps the choices anywhere
        assert "cuda-ipc,file" in text, command
    serve_help = re.sub(r"\s+", " ", bench("serve", "--help", env=outside).stdout)
    assert "file: through files in a private folder" in serve_help


def test_bench_micro_measures_the_outside_transport(outside: dict[str, str]) -> None:
    before = file_folders()
    argv = ["micro", "--codec", "msgspec-oob", "--payload", "tensor-fp16-336", "--transport", "zmq,file"]
    done = bench(*argv, "--delivery-iterations", "3", "--min-iterations", "3", "--min-time", "0", env=outside)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("msgspec-oob")]
    (file_row,) = [row for row in rows if row[2] == "file"]
    # ok: the receiver's digest of what it decoded matched what was sent (its warm-up sends).
    assert re.match(r"[\d,.]+$", file_row[3]), file_row
    assert file_folders() == before  # the sender's folder went with it


@pytest.mark.slow  # a real server
def test_bench_serve_serves_images_over_the_outside_transport(
    outside: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", outside["PYTHONPATH"])  # the server's processes find it too
    before = file_folders()
    server = start_serve(
        "--transport", "file", "--mm-payload", "tensor", "--shm-threshold", "1024", "--executor", "sim",
        "--verify", codec="msgspec-oob",
    )  # fmt: skip
    try:
        results = asyncio.run(chat_with_images(server.base_url, list(range(6))))
    finally:
        assert server.stop() == 0
    assert [status for status, _ in results] == [200] * 6, results
    assert file_folders() == before  # every file released, the folder removed at stop


def test_a_plugin_that_exits_at_import_is_its_own_error_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SystemExit at import (KeyboardInterrupt is let through) is that entry's error: help still builds."""
    source = {"exiting_transport": "raise SystemExit(3)\n"}
    env = install_plugin(tmp_path, source, {"exits": "exiting_transport:X"}, ENTRY_POINT_GROUP)
    done = bench("micro", "--help", env=env)
    assert done.returncode == 0 and "zmq" in done.stdout, done.stdout + done.stderr
    monkeypatch.syspath_prepend(str(next(tmp_path.rglob("exiting_transport.py")).parent))
    monkeypatch.setattr(
        transport_registry, "_registered", lambda: {**transport_registry._BUILTIN, "exits": "exiting_transport:X"}
    )
    transport_registry.get_transport.cache_clear()
    try:
        with pytest.raises(KeyError, match="cannot be loaded: SystemExit: 3"):
            get_transport("exits")
    finally:
        transport_registry.get_transport.cache_clear()
