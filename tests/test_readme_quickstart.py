"""The README's quickstart still says what the command prints.

The quickstart shows a real run's comparison. This runs the README's own command (smaller, so it
takes about a minute) and checks that every line of the README's output has a line of the same
shape in what the command printed: the same label, numbers aside. A renamed column, a reworded
verdict line or a changed flag then fails here instead of misleading a newcomer.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALLER = ("--num-prompts", "40", "--no-progress")  # flags given last win: the README's workload, shrunk


def quickstart() -> tuple[list[str], list[str]]:
    """The quickstart's command (as bench arguments) and its output block's lines."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Quickstart") :]
    section = section[: section.index("\n## ", 1)]
    command = re.search(r"```bash\n(.+?)\n```", section, re.DOTALL)
    output = re.search(r"```text\n(.+?)\n```", section, re.DOTALL)
    assert command and output, "the quickstart needs a bash block and a text block"
    words = shlex.split(command.group(1))
    assert words[:2] == [".venv/bin/bench", "run"], words
    return words[1:], output.group(1).splitlines()


def label(line: str) -> str:
    """A line's shape: its text up to the first ':' or run of two spaces, every number masked."""
    head = re.split(r":|\s{2,}", line.strip(), maxsplit=1)[0]
    return re.sub(r"\d+(?:[.,]\d+)*", "#", head)


def test_label_keeps_the_words_and_drops_the_numbers() -> None:
    assert label("  TTFT mean (primary)  inconclusive: -0.4% [-13.8%, +15.0%]") == "TTFT mean (primary)"
    assert label("msgspec       3  28.62 ±2.5%") == "msgspec"
    assert label("IPC budget, µs: p50 over each run's requests") == "IPC budget, µs"
    assert label("then 0 secondary figures, margin ±5%") == label("then 11 secondary figures, margin ±5%")


@pytest.mark.slow
def test_the_quickstart_output_is_what_the_command_prints(tmp_path: Path) -> None:
    args, shown = quickstart()
    cmd = [sys.executable, "-m", "harness.cli", *args, *SMALLER, "--result-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = done.stdout.splitlines()
    printed = printed[next(i for i, line in enumerate(printed) if "Codec comparison" in line) :]
    labels = {label(line) for line in printed}
    # A line indented four or more is the wrapped rest of the line above: where it breaks depends on the numbers.
    missing = [line for line in shown if line.strip() and not line.startswith("    ") and label(line) not in labels]
    assert missing == [], "README quickstart lines the command no longer prints (update README.md)"
