"""harness/sglang_hook without SGLang: the sgl_kernel stand-in is loud and yields to a real module, the
timed socket functions carry messages as SGLang's do in both IPC modes and write one record each, the
import hook rebinds io_struct's names before anyone binds them, and nothing happens unless asked."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from harness.sglang_hook import cpu_standins, records, spans

ROOT = Path(__file__).resolve().parents[1]


# --- the sgl_kernel stand-in -------------------------------------------------------------------------------


def test_the_stand_in_holds_only_the_listed_names_and_each_call_says_what_it_is() -> None:
    module = cpu_standins.sgl_kernel_module()
    assert sorted(n for n in vars(module) if n.endswith("_cpu")) == sorted(cpu_standins.SGL_KERNEL_NAMES)
    with pytest.raises(cpu_standins.StandInCalled, match=r"wirebench stand-in sgl_kernel\.fill_bonus_tokens_cpu"):
        module.fill_bonus_tokens_cpu(1, 2)
    assert not hasattr(module, "rmsnorm_cpu")  # any other name: missing, as without the module


def test_the_finder_stands_in_only_where_no_real_sgl_kernel_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    finder = cpu_standins.StandInFinder()
    spec = finder.find_spec("sgl_kernel", None)
    assert spec is not None and spec.loader is not None
    assert finder.find_spec("sgl_kernel.allreduce", None) is None  # submodules stay missing
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert finder.find_spec("sgl_kernel", None) is None  # the real one wins


# --- the timed socket functions ----------------------------------------------------------------------------


class GenerateReq(msgspec.Struct, tag=True):  # tagged, as SGLang's io_struct messages are
    rid: str
    input_ids: list[int]


class BatchOut(msgspec.Struct, tag=True):
    rids: list[str]
    tokens: list[int]


def _io_struct(use_pickle: bool) -> types.ModuleType:
    """A stand-in for SGLang's io_struct: its mode flag, its msgpack pair and the four socket functions."""
    module = types.ModuleType("fake_io_struct")
    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder(GenerateReq | BatchOut)
    module._USE_PICKLE_IPC = use_pickle  # type: ignore[attr-defined]
    module.msgpack_encode = encoder.encode  # type: ignore[attr-defined]
    module.msgpack_decode = decoder.decode  # type: ignore[attr-defined]
    for name in spans.REPLACED:
        setattr(module, name, None)
    return module


@pytest.mark.parametrize("use_pickle", [True, False], ids=["pickle", "msgpack"])
def test_timed_send_and_receive_carry_the_message_and_record_each_hop(
    use_pickle: bool, tmp_path: Path, zmq_pair: tuple[zmq.Socket, zmq.Socket]
) -> None:
    io_struct = _io_struct(use_pickle)
    timed = spans.instrument(io_struct, str(tmp_path))
    sender, receiver = zmq_pair
    request = GenerateReq("req-1", list(range(550)))
    io_struct.sock_send(sender, request)
    assert io_struct.sock_recv(receiver) == request
    io_struct.sock_send(sender, BatchOut(["req-1", "req-2"], [7]))
    assert io_struct.sock_recv(receiver).tokens == [7]
    with pytest.raises(zmq.Again):  # nothing waiting: raised as SGLang's would, and not recorded
        io_struct.sock_recv(receiver, zmq.NOBLOCK)

    (path,) = tmp_path.glob("*.jsonl")
    assert path.stat().st_mode & 0o777 == 0o600 and tmp_path.stat().st_mode & 0o777 == 0o700
    assert timed.recorder is not None
    timed.recorder.flush()  # its thread writes every 0.2 s
    meta, *rows = records.read_rows(path)[0]
    assert meta[1]["ipc"] == ("pickle" if use_pickle else "msgpack") and meta[1]["role"] == "tokenizer"
    assert [r[:3] for r in rows] == [
        ["send", "GenerateReq", "req-1"],
        ["recv", "GenerateReq", "req-1"],
        ["send", "BatchOut", ["req-1", "req-2"]],
        ["recv", "BatchOut", ["req-1", "req-2"]],
    ]
    wire = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL) if use_pickle else msgspec.msgpack.encode(request)
    assert rows[0][6] == rows[1][6] == len(wire)  # the bytes that crossed, as SGLang's own encoder makes them
    for row in rows:
        start, middle, end = row[3:6]
        assert 0 < start <= middle <= end


def test_async_forms_are_timed_too(tmp_path: Path) -> None:
    import asyncio

    import zmq.asyncio

    io_struct = _io_struct(False)
    timed = spans.instrument(io_struct, str(tmp_path))

    async def exchange() -> Any:
        ctx = zmq.asyncio.Context()
        address = f"inproc://sglang-hook-{os.getpid()}"
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        pull.bind(address)
        push.connect(address)
        try:
            await io_struct.async_sock_send(push, GenerateReq("a", [1]))
            return await io_struct.async_sock_recv(pull)
        finally:
            push.close(0)
            pull.close(0)
            ctx.term()

    assert asyncio.run(exchange()) == GenerateReq("a", [1])
    assert timed.recorder is not None
    timed.recorder.flush()
    (path,) = tmp_path.glob("*.jsonl")
    assert [r[0] for r in records.read_rows(path)[0][1:]] == ["send", "recv"]


def test_hops_pair_each_send_with_its_receipt_in_the_other_process(tmp_path: Path) -> None:
    def write(role: str, rows: list[list[Any]]) -> None:
        lines = [["meta", {"role": role, "pid": 1}], *rows]
        (tmp_path / f"{role}-1.jsonl").write_text("".join(f"{json.dumps(r)}\n" for r in lines))

    write("tokenizer", [["send", "Req", "r", 100, 130, 140, 500], ["recv", "Str", ["r"], 0, 900, 910, 40]])
    write("scheduler", [["recv", "Req", "r", 50, 200, 260, 500], ["send", "Tok", ["r", "s"], 300, 320, 330, 60]])
    write("detokenizer", [["recv", "Tok", ["r", "s"], 0, 400, 420, 60], ["send", "Str", ["r"], 500, 530, 540, 40]])
    found = {(h.message, h.sender, h.receiver): h for h in records.hops(tmp_path, "r")}
    assert set(found) == {("Req", "tokenizer", "scheduler"), ("Tok", "scheduler", "detokenizer"),
                          ("Str", "detokenizer", "tokenizer")}  # fmt: skip
    req = found["Req", "tokenizer", "scheduler"]
    assert (req.encode_us, req.wire_us, req.decode_us, req.bytes) == (0.03, 0.07, 0.06, 500)
    assert found["Str", "detokenizer", "tokenizer"].wire_us == pytest.approx(0.37)
    assert records.hops(tmp_path, "unknown") == []


def test_a_planted_link_is_not_followed_and_the_messages_go_on_untimed(
    tmp_path: Path, zmq_pair: tuple[zmq.Socket, zmq.Socket], capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    folder = tmp_path / "spans"
    folder.mkdir(mode=0o700)
    (folder / f"tokenizer-{os.getpid()}.jsonl").symlink_to(target)
    io_struct = _io_struct(True)
    spans.instrument(io_struct, str(folder))
    sender, receiver = zmq_pair
    io_struct.sock_send(sender, GenerateReq("x", []))
    assert io_struct.sock_recv(receiver) == GenerateReq("x", [])
    assert target.read_text() == ""
    assert "cannot write timings" in capsys.readouterr().err


def test_an_io_struct_without_the_names_is_refused_in_one_line() -> None:
    io_struct = _io_struct(True)
    del io_struct.msgpack_decode
    with pytest.raises(spans.LayoutError, match=r"is not laid out as the hook knows it: .* lacks msgpack_decode$"):
        spans.instrument(io_struct, "/nonexistent")


# --- the import hook and the start-up line -----------------------------------------------------------------


def test_the_import_hook_rebinds_before_an_importer_binds_the_names(tmp_path: Path) -> None:
    """As SGLang's managers do ``from io_struct import sock_send``: they must get the timed one."""
    package = tmp_path / "fakesgl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "io_struct.py").write_text(
        textwrap.dedent(
            """
            _USE_PICKLE_IPC = True
            def msgpack_encode(obj): raise AssertionError
            def msgpack_decode(data): raise AssertionError
            def sock_send(socket, obj, flags=0): raise AssertionError("untimed")
            sock_recv = async_sock_send = async_sock_recv = sock_send
            """
        )
    )
    (package / "manager.py").write_text("from fakesgl.io_struct import sock_send\n")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from harness.sglang_hook import spans
        spans.IO_STRUCT = "fakesgl.io_struct"
        spans.install({str(tmp_path / "out")!r})
        from fakesgl.manager import sock_send
        print(type(sock_send).__name__, sock_send.__self__.__class__.__name__)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["method", "Spans"]


@pytest.mark.parametrize("spans_on", [False, True])
def test_the_start_up_line_times_nothing_unless_asked(spans_on: bool, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "WIREBENCH_SGLANG_SPANS"}
    if spans_on:
        env["WIREBENCH_SGLANG_SPANS"] = str(tmp_path)
    script = (
        "import sys, harness.sglang_hook.startup\n"
        "print(sorted({type(f).__name__ for f in sys.meta_path} & {'StandInFinder', 'AfterImport'}))\n"
        "print('torch' in sys.modules, 'sglang' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    finders, imported = done.stdout.splitlines()
    assert finders == str(["AfterImport", "StandInFinder"] if spans_on else ["StandInFinder"])
    assert imported == "False False"  # the hook keeps interpreter start cheap


def test_the_setup_installs_torch_dependents_without_deps_and_pins_torch_for_the_rest() -> None:
    env = {**os.environ, "WIREBENCH_SETUP_DRY_RUN": "1", "WIREBENCH_SGLANG_VENV": "/nonexistent/venv"}
    done = subprocess.run(
        [str(ROOT / "scripts" / "setup_sglang_cpu.sh")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    installs = [line for line in done.stdout.splitlines() if " install " in line]
    assert "torch==2.13.0+cpu" in installs[0]
    assert any("--no-deps sglang==0.5.23 torchvision==" in line for line in installs)
    (rest,) = [line for line in installs if " -c " in line]
    packages = rest.split(" -c ")[1].split()[1:]
    assert "transformers==5.19.0" in packages
    assert not any(p.split("==")[0] in {"torch", "torchvision", "sglang"} for p in packages)
    assert any("wirebench_sglang_hook.pth" in line for line in done.stdout.splitlines())
