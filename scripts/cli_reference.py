"""Write docs/cli.md, the reference of every ``bench`` flag, from the parsers themselves.

The flags are declared once, in the code; this page is their help text as ``bench COMMAND --help``
prints it, at a fixed width so the file does not depend on the terminal. tests/test_cli_reference.py
fails when the page and the parsers disagree: run this script after changing a flag.

    .venv/bin/python scripts/cli_reference.py            # rewrite docs/cli.md
    .venv/bin/python scripts/cli_reference.py --check    # exit 1 when docs/cli.md is out of date
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

from harness.cli import COMMANDS, build_parser

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
WIDTH = "100"  # argparse wraps help at $COLUMNS

INTRO = """\
# CLI reference

Every `bench` command and flag, as `bench COMMAND --help` prints it. This page is generated from
the parsers by `scripts/cli_reference.py`; a test fails when the two disagree. Which command to
reach for, and worked examples: [guide.md](guide.md). What the figures mean: [method.md](method.md).
"""


def help_text(argv: list[str]) -> str:
    """What ``bench ARGV --help`` prints."""
    parser, _ = build_parser(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser.parse_args([*argv, "--help"])
    return out.getvalue().rstrip() + "\n"


def render() -> str:
    """The whole page."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parts = [INTRO, "## bench\n\n```text\n" + help_text([]) + "```\n"]
        parts += [f"## bench {name}\n\n```text\n{help_text([name])}```\n" for name in COMMANDS]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description="Write docs/cli.md from the bench parsers.")
    ap.add_argument("--check", action="store_true", help="only report whether docs/cli.md is up to date")
    args = ap.parse_args()
    page = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != page:
            print(f"{PAGE} is out of date: run scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
