"""The docs hold together and read easily: every relative link and image resolves, prose is
wrapped, and the README stays a newcomer's page.

Checks README.md, docs/*.md, results/README.md and each study's README, offline: a link's file must exist, and a
link to a Markdown file with an #anchor must name a heading of that file (GitHub's slugs).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_WORDS = 1200  # outside code blocks: what a newcomer reads before trying it
PROSE_LINE_MAX = 100  # characters of a prose line; code blocks and table rows may be longer
GENERATED = ("docs/cli.md",)  # the parsers' own help, written by scripts/cli_reference.py

# [text](target) and ![alt](target); the target ends at whitespace or ")" (an optional "title" follows).
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?!\n))*`")  # may wrap a line, never a paragraph
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _docs() -> list[Path]:
    studies = sorted((ROOT / "scripts" / "studies").glob("*/README.md"))
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md", *studies]


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def relative_links(path: Path) -> list[str]:
    targets = LINK.findall(_prose(path.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def broken_links(path: Path) -> list[str]:
    broken: list[str] = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("path", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert path.exists(), path
    assert broken_links(path) == []


def long_prose_lines(text: str) -> list[str]:
    """Lines over PROSE_LINE_MAX characters outside fenced code and tables (a row starts with '|')."""
    prose = FENCE.sub("", text)
    return [line for line in prose.splitlines() if len(line) > PROSE_LINE_MAX and not line.lstrip().startswith("|")]


def prose_words(text: str) -> int:
    """Words outside fenced code blocks."""
    return len(FENCE.sub("", text).split())


@pytest.mark.parametrize(
    "path",
    [p for p in _docs() if str(p.relative_to(ROOT)) not in GENERATED],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_prose_is_wrapped(path: Path) -> None:
    assert long_prose_lines(path.read_text(encoding="utf-8")) == []


def test_the_readme_is_short() -> None:
    words = prose_words((ROOT / "README.md").read_text(encoding="utf-8"))
    assert words <= README_MAX_WORDS, f"README.md has {words} words outside code; move detail into docs/"


def test_the_readme_names_no_history() -> None:
    """A newcomer's page: no commit hashes or issue numbers of this project."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.findall(r"\b(?:issue|task) #?\d+", text, re.IGNORECASE) == []
    commit = r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"  # hex with a letter and a digit
    assert re.findall(commit, _prose(text)) == []


def test_the_prose_checks_count_what_they_should() -> None:
    text = "short line\n" + "x" * 101 + "\n| " + "y" * 200 + " |\n```\n" + "z" * 300 + "\n```\n"
    assert long_prose_lines(text) == ["x" * 101]
    assert prose_words("one two\n```\nthree four five\n```\nsix\n") == 3


def test_the_checks_would_catch_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A title: with `code`, and punctuation!\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-title-with-code-and-punctuation) [ok](other.md#twice-1) [ok](#local)\n"
        "![gone](missing.png) [gone](other.md#nowhere) [web](https://example.com/x) `[code](nope.md)`\n"
        "## Local\n"
    )
    assert broken_links(page) == [
        "missing.png: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
    ]
