"""A flag a command does not take: the command's usage, one error line naming the closest flag, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import cli


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """(the usage's first line, the error line) of ``bench ARGV``, which must exit 2."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    return err[0], err[-1]


def test_a_misspelt_flag_gets_the_commands_usage_and_the_closest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    usage, error = refusal(["run", "--num-promts", "10"], capsys)
    assert usage.startswith("usage: bench run ")
    assert error == "bench run: error: unrecognized argument --num-promts (did you mean --num-prompts?)"


def test_each_unknown_flag_is_named_with_its_own_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    usage, error = refusal(["micro", "--codecs", "pickle", "--paylod=text-550"], capsys)
    assert usage.startswith("usage: bench micro ")
    assert error == (
        "bench micro: error: unrecognized arguments --codecs (did you mean --codec?), "
        "--paylod=text-550 (did you mean --payload?)"
    )


def test_nothing_close_is_suggested_for_nothing_close(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(["micro", "--zzzzzz"], capsys)[1] == "bench micro: error: unrecognized argument --zzzzzz"
    assert refusal(["micro", "stray"], capsys)[1] == "bench micro: error: unrecognized argument stray"


def test_the_suggestion_comes_from_the_commands_own_flags() -> None:
    flags = ["-h", "--help", "--num-prompts", "--seed"]
    assert cli.unrecognized(["--sed", "4"], flags) == "unrecognized argument --sed (did you mean --seed?)"
    assert cli.unrecognized(["--num-promts=3"], flags).endswith("(did you mean --num-prompts?)")


def test_the_command_line_says_it_in_one_line_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--num-promts", "10"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "bench run: error: unrecognized argument --num-promts (did you mean --num-prompts?)"
    )
