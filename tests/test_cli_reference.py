"""docs/cli.md is the parsers' own help: a flag added, renamed or reworded shows up there or this fails."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The codec listing in --help names vllm as "not installed" where it is missing; the page is written
# with it installed, as scripts/setup.sh --test (and so CI) installs it.
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM not installed (scripts/setup.sh --with-vllm)"
)
def test_the_cli_reference_is_the_parsers_help() -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == _generator().render(), "docs/cli.md is out of date: run scripts/cli_reference.py"


def test_every_command_has_a_section() -> None:
    from harness.cli import COMMANDS

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"## bench {name}\n" in page
        assert f"usage: bench {name}" in page
