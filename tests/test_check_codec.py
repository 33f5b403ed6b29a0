"""``bench check-codec``: a good codec passes, a codec that loses a field fails naming the check, and the
example codec of docs/architecture.md passes as a plugin would install it.

Plugins are installed as a real (tiny) distribution: a ``*.dist-info`` folder
with ``entry_points.txt`` next to the code, in a temporary folder on the
subprocess's ``PYTHONPATH``, so ``importlib.metadata`` finds it exactly as it
would a pip-installed package.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from harness import cli
from harness.wire.messages import EngineCoreOutputs
from wirecodecs import Frame, conformance
from wirecodecs.pickle_codec import PickleCodec

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"

LOSSY_SOURCE = '''
"""A pickle codec that forgets one field of a request on the way."""
from typing import ClassVar

from wirecodecs.pickle_codec import PickleCodec


class LossyPickleCodec(PickleCodec):
    name: ClassVar[str] = "lossy-pickle"

    def decode(self, frames, msg_type):
        msg = super().decode(frames, msg_type)
        if hasattr(msg, "priority"):
            msg.priority = 0  # a request's priority is lost
        return msg
'''


class LossyPickleCodec(PickleCodec):
    """LOSSY_SOURCE's codec, for the checks in this process."""

    name: ClassVar[str] = "lossy-pickle"

    def decode(self, frames: Sequence[Frame], msg_type: type[Any]) -> Any:
        msg = super().decode(frames, msg_type)
        if hasattr(msg, "priority"):
            msg.priority = 0
        return msg


def install_plugin(
    folder: Path, modules: dict[str, str], entry_points: dict[str, str], group: str = "wirebench.codecs"
) -> dict[str, str]:
    """``modules`` (dotted name → source) and a distribution declaring ``entry_points`` (name → target) in
    ``group`` in ``folder``; returns the environment under which a subprocess finds them."""
    for dotted, source in modules.items():
        path = folder.joinpath(*dotted.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(folder).parents[:-1]:
            (folder / parent / "__init__.py").touch()
        path.write_text(source)
    dist_info = folder / "wirebench_check_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: wirebench-check-plugin\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def check_codec(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "check-codec", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


# --- the command ---------------------------------------------------------------------


def test_pickle_passes() -> None:
    done = check_codec("pickle")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^pickle: \d+ passed, 0 failed", done.stdout, re.MULTILINE), done.stdout
    assert "FAIL" not in done.stdout
    for check in conformance.CHECKS:
        assert re.search(rf"^(PASS|SKIP) pickle {check}: ", done.stdout, re.MULTILINE), check


def test_a_plugin_that_loses_a_field_fails_naming_the_check(tmp_path: Path) -> None:
    env = install_plugin(tmp_path, {"lossy_plugin": LOSSY_SOURCE}, {"lossy-pickle": "lossy_plugin:LossyPickleCodec"})
    done = check_codec("lossy-pickle", env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    failed = re.search(r"^FAIL lossy-pickle text_messages: (.*)$", done.stdout, re.MULTILINE)
    assert failed, out
    assert "text request" in failed.group(1) and "priority" in failed.group(1)
    # What does not touch a request's priority still passes: the check names the one broken part.
    assert re.search(r"^PASS lossy-pickle output_batch_of_64: ", done.stdout, re.MULTILINE), out
    assert re.search(r"FAILED lossy-pickle: .*text_messages", done.stderr), done.stderr


def test_an_unknown_name_exits_2_listing_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-codec", "pickle", "no-such-codec"]) == 2
    out, err = capsys.readouterr()
    assert "'no-such-codec'" in err
    for name in ("pickle", "msgspec", "msgspec-oob"):
        assert name in err
    assert out == ""  # every name is looked up before anything runs


def test_only_runs_the_named_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-codec", "msgspec", "--only", "unicode", "--only", "images"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]
    assert [line.split(":")[0] for line in lines] == ["PASS msgspec unicode", "PASS msgspec images"]


# --- codecs whose own code misbehaves: bounded, each a check's failure --------------------------

HOSTILE_SOURCE = '''
"""Pickle codecs that misbehave, each its own way, when they meet an abort message (and only then)."""
import os
import time
from typing import ClassVar

from wirecodecs.pickle_codec import PickleCodec


class Hostile(PickleCodec):
    def encode(self, msg):
        if type(msg).__name__ == "EngineCoreAbort":
            self.misbehave()
        return super().encode(msg)

    def misbehave(self):
        pass


class UnreadableError(Exception):
    def __str__(self):
        raise ValueError("no message")


class Hangs(Hostile):
    name: ClassVar[str] = "hangs"

    def misbehave(self):
        time.sleep(3600)


class Exits(Hostile):
    name: ClassVar[str] = "exits"

    def misbehave(self):
        raise SystemExit(0)


class Interrupts(Hostile):
    name: ClassVar[str] = "interrupts"

    def misbehave(self):
        raise KeyboardInterrupt


class EndsProcess(Hostile):
    name: ClassVar[str] = "ends-process"

    def misbehave(self):
        os._exit(0)


class Unreadable(Hostile):
    name: ClassVar[str] = "unreadable"

    def misbehave(self):
        raise UnreadableError()


class Verbose(Hostile):
    name: ClassVar[str] = "verbose"

    def misbehave(self):
        raise RuntimeError("x" * 20_000_000)
'''
HOSTILE = {
    "hangs": "Hangs",
    "exits": "Exits",
    "interrupts": "Interrupts",
    "ends-process": "EndsProcess",
    "unreadable": "Unreadable",
    "verbose": "Verbose",
}
# text_messages meets an abort; output_batch_of_64 does not, so it passes: the failure is that check's alone.
TWO_CHECKS = ("--only", "text_messages", "--only", "output_batch_of_64")


@pytest.fixture
def hostile(tmp_path: Path) -> dict[str, str]:
    entry_points = {name: f"hostile_codecs:{cls}" for name, cls in HOSTILE.items()}
    return install_plugin(tmp_path, {"hostile_codecs": HOSTILE_SOURCE}, entry_points)


def result_of(out: str, codec: str, check: str) -> str:
    """``MARK: message`` of one check's line in ``bench check-codec``'s output."""
    found = re.search(rf"^(PASS|FAIL|SKIP) {re.escape(codec)} {check}: (.*)$", out, re.MULTILINE)
    assert found, f"no line for {codec} {check} in:\n{out[:5000]}"
    return f"{found.group(1)}: {found.group(2)}"


def test_a_hanging_check_fails_naming_its_time_limit_and_the_rest_still_run(hostile: dict[str, str]) -> None:
    done = check_codec("hangs", *TWO_CHECKS, "--timeout", "3", env=hostile)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        result_of(done.stdout, "hangs", "text_messages") == "FAIL: did not finish within the time limit of 3 s: stopped"
    )
    assert result_of(done.stdout, "hangs", "output_batch_of_64").startswith("PASS")
    assert done.stderr.strip() == "bench check-codec: FAILED hangs: text_messages"


def test_whatever_a_codec_raises_or_does_to_its_process_is_that_checks_failure(hostile: dict[str, str]) -> None:
    names = [name for name in HOSTILE if name != "hangs"]
    done = check_codec(*names, *TWO_CHECKS, env=hostile)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[:5000]
    assert "Traceback" not in out
    expected = {
        "exits": "FAIL: text abort: SystemExit: 0",
        "interrupts": "FAIL: KeyboardInterrupt",
        "ends-process": "FAIL: the process running it ended during the check (exit code 0)",
        "unreadable": "FAIL: text abort: UnreadableError: <its message could not be read: str() raised ValueError>",
    }
    for name, line in expected.items():
        assert result_of(done.stdout, name, "text_messages") == line
    # Twenty million characters of message become a readable line that says what was cut.
    verbose = result_of(done.stdout, "verbose", "text_messages")
    assert verbose.startswith("FAIL: text abort: RuntimeError: xxx") and verbose.endswith(" more characters cut]")
    assert len(verbose) < 2100 and len(out) < 20_000
    for name in names:
        assert result_of(done.stdout, name, "output_batch_of_64").startswith("PASS"), name
    assert done.stderr.strip() == "bench check-codec: FAILED " + "; ".join(f"{n}: text_messages" for n in names)


def test_the_time_limit_must_be_a_positive_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["check-codec", "pickle", "--timeout", "0"])
    assert exited.value.code == 2
    assert "--timeout: must be a positive finite number" in capsys.readouterr().err


class FiniteLogprobsPickleCodec(PickleCodec):
    """Clamps logprobs to finite values on the way, as a codec for a format without NaN or inf would."""

    name: ClassVar[str] = "finite-logprobs"

    def decode(self, frames: Sequence[Frame], msg_type: type[Any]) -> Any:
        msg = super().decode(frames, msg_type)
        if isinstance(msg, EngineCoreOutputs):
            for out in msg.outputs:
                if out.new_logprobs is not None:
                    rows = out.new_logprobs.logprobs
                    out.new_logprobs.logprobs = [[v if math.isfinite(v) else -1e4 for v in row] for row in rows]
        return msg


def test_a_codec_that_loses_nan_or_inf_in_logprobs_fails_special_floats() -> None:
    results = {r.name: r for r in conformance.run_checks(FiniteLogprobsPickleCodec)}
    assert [name for name, r in results.items() if not r.passed] == ["special_floats"]
    assert (
        "outputs with nan: msg.outputs[0].new_logprobs.logprobs[0][0]: nan != -10000.0"
        in results["special_floats"].message
    )


# --- the checks as functions -----------------------------------------------------------


def test_the_checks_take_a_class_that_is_not_registered() -> None:
    results = {r.name: r for r in conformance.run_checks(LossyPickleCodec)}
    assert set(results) == set(conformance.CHECKS)
    assert not results["text_messages"].passed
    assert "msg.priority: -3 != 0" in results["text_messages"].message
    assert results["output_batch_of_64"].passed and results["tensors"].passed
    with pytest.raises(AssertionError, match="priority"):
        conformance.check_unicode(LossyPickleCodec)


def test_every_check_passes_on_a_good_codec_given_by_name_class_or_instance() -> None:
    for codec in ("pickle-oob", PickleCodec, PickleCodec()):
        failed = [r for r in conformance.run_checks(codec) if not r.passed]
        assert failed == [], codec


def test_a_codec_that_cannot_refuse_fails_the_refusal() -> None:
    """A text-only codec that leaves images to the serializer's TypeError fails the multimodal checks."""

    class CarelessCodec(PickleCodec):
        name: ClassVar[str] = "careless"
        carries_multimodal: ClassVar[bool] = False

    results = {r.name: r for r in conformance.run_checks(CarelessCodec)}
    for check in ("tensors", "arrays", "images", "mixed_multimodal"):
        assert not results[check].passed, check
    assert "cannot carry" in results["images"].message
    assert results["text_messages"].passed


# --- the example codec of docs/architecture.md ----------------------------------------


def fenced_block(text: str, language: str, first_line: str) -> str:
    """The code of the ``language`` block whose text contains ``first_line`` (exactly one)."""
    blocks = [b for b in re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL) if first_line in b]
    assert len(blocks) == 1, f"{len(blocks)} {language} blocks with {first_line!r} in {ARCHITECTURE.name}"
    return blocks[0]


def doc_example() -> tuple[str, dict[str, str]]:
    """The example codec's source and its entry points (codec name → module:Class), as the doc writes them."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    source = fenced_block(text, "python", "# my_package/codec.py")
    toml = fenced_block(text, "toml", '[project.entry-points."wirebench.codecs"]')
    entry_points = dict(re.findall(r'^([\w.-]+)\s*=\s*"([^"]+)"', toml, re.MULTILINE))
    assert entry_points, toml
    return source, entry_points


def test_the_docs_example_codec_passes_every_check() -> None:
    source, entry_points = doc_example()
    (name, target), *_ = entry_points.items()
    module_name, _, class_name = target.partition(":")
    spec = importlib.util.spec_from_loader(f"docs_example_{module_name}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(textwrap.dedent(source), str(ARCHITECTURE), "exec"), module.__dict__)
    codec_class = getattr(module, class_name)
    assert codec_class.name == name
    failed = [f"{r.name}: {r.message}" for r in conformance.run_checks(codec_class) if not r.passed]
    assert failed == []


def test_bench_check_codec_passes_the_docs_example_installed_as_a_plugin(tmp_path: Path) -> None:
    source, entry_points = doc_example()
    modules = {target.partition(":")[0]: source for target in entry_points.values()}
    env = install_plugin(tmp_path, modules, entry_points)
    done = check_codec(*entry_points, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every check passed" in done.stdout
