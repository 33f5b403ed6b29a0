"""``bench micro``'s cells of SGLang's own messages: measured in SGLang's venv (where
scripts/setup.sh --with-sglang-cpu made it), and clear cells or a clear refusal where that venv is
missing or broken."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import wirecodecs
from harness import cli
from harness.commands import micro
from harness.micro import payloads, sglang_cells
from harness.micro.timing import MicroCell

FAST = ["--min-iterations", "3", "--min-time", "0"]


def cells(found: Iterable[MicroCell | dict[str, Any]]) -> list[MicroCell]:
    """The cells of ``sglang_cells.measure``'s output, without the versions line."""
    return [c for c in found if isinstance(c, MicroCell)]


def test_sglang_cells_without_sglangs_python_are_refused_with_the_setup(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["micro", "--codec", "pickle,sglang-msgspec", "--sglang-python", "/nonexistent/python", *FAST]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "sglang-msgspec need SGLang's Python, none at /nonexistent/python" in err
    assert "scripts/setup.sh --with-sglang-cpu" in err


def test_the_default_set_leaves_sglang_out_and_says_so_without_its_python() -> None:
    codecs, note = micro.chosen_codecs(None, "/nonexistent/python")
    assert codecs == wirecodecs.available_codecs()
    assert note is not None and "SGLang's messages not timed: no Python at /nonexistent/python" in note
    codecs, note = micro.chosen_codecs(None, sys.executable)  # a Python is there: SGLang's cells are in
    assert codecs == [*wirecodecs.available_codecs(), *sglang_cells.codec_names()] and note is None
    assert micro.chosen_codecs("pickle", "/nonexistent/python") == (["pickle"], None)


def test_a_python_without_sglang_gives_error_cells_with_its_message() -> None:
    # wirebench's own venv runs the module but has no SGLang: every timed cell says so, nothing raises.
    found = sglang_cells.measure(sys.executable, ["sglang-pickle"], ["text-550", "image-336"], 3, 0.0)
    text, image = cells(found)
    assert (text.status, image.status) == ("error", "unsupported")
    assert text.reason is not None and "exited 1" in text.reason and "sglang" in text.reason
    assert image.reason == sglang_cells.NO_MM


def test_payloads_sglang_has_no_message_for_say_why() -> None:
    found = sglang_cells.measure("/nonexistent/python", ["sglang-pickle"], ["outputs-64-stats", "text-550"], 3, 0)
    stats, text = cells(found)
    assert [(c.status, c.payload) for c in (stats, text)] == [
        ("unsupported", "outputs-64-stats"),
        ("error", "text-550"),
    ]
    assert stats.reason is not None and "scheduler state" in stats.reason
    assert text.reason is not None and "No such file" in text.reason


@pytest.mark.slow  # SGLang's import alone is ~10 s
@pytest.mark.sglang_cpu
def test_sglang_messages_timed_in_both_ipc_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "micro.json"
    argv = ["micro", "--codec", "pickle,sglang-pickle,sglang-msgspec", "--payload", "text-550,outputs-64", *FAST]
    assert cli.main([*argv, "--json", str(out)]) == 0
    assert "TokenizedGenerateReqInput" in capsys.readouterr().out  # the legend says what the rows time
    by_cell = {(r["codec"], r["payload"]): r for r in json.loads(out.read_text())}
    for mode in ("sglang-pickle", "sglang-msgspec"):
        for payload in ("text-550", "outputs-64"):
            cell = by_cell[mode, payload]
            assert cell["status"] == "ok", cell  # the decoded message matched the one sent
            assert cell["encode_p50_us"] > 0 and cell["decode_p50_us"] > 0 and cell["frames"] == 1
            # Beside the same payload's bytes and memcpy as wirebench's own rows.
            assert cell["memcpy_p50_us"] == by_cell["pickle", payload]["memcpy_p50_us"]
            assert cell["metadata"]["sglang"]["sglang"]
    request = payloads.payload_nbytes(payloads.PAYLOADS["text-550"]())
    # The request carries the prompt's 550 ids as int64 and its string: at least the payload's bytes.
    assert by_cell["sglang-msgspec", "text-550"]["wire_bytes"] >= request
    assert by_cell["sglang-msgspec", "text-550"]["wire_bytes"] < by_cell["sglang-pickle", "text-550"]["wire_bytes"]
