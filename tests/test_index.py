"""The one index of the code holds true to the tree.

docs/architecture.md's table ("Packages, bottom-up") has one row per package folder under harness/ and
codecs/, naming each of its modules, and a row naming each study under scripts/studies/; a row's
modules cell is items parted by "; ", each led by its name in backticks. The package docstrings point
there instead of keeping lists of their own, and docs/README.md links every page under docs/.
Offline: the files are read, nothing is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCS_INDEX = ROOT / "docs" / "README.md"
STUDIES = ROOT / "scripts" / "studies"
STUDIES_ROW = "scripts/studies/"
SECTION = "## Packages, bottom-up"
CODE_FOLDERS = ("harness", "codecs")

# A line of a module list as the package docstrings used to keep them: "name    its job" or
# "- :mod:`.name`: its job".
LIST_ENTRY = re.compile(r"^\s*(?:-\s+)?(?::mod:)?`*\.?(\w+)`*(?::|\s{2,})")
LINK_TARGET = re.compile(r"\]\(\s*<?([^)#\s>]+)")


def table_rows(text: str) -> dict[str, list[str]]:
    """Each row of the table under SECTION: its folder (as written, e.g. 'harness/engine/') → its cells."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):  # the header and the separator name no folder
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        folder = cells[0].strip("`")
        assert folder not in rows, f"{ARCHITECTURE.name}: two rows for {folder}"
        rows[folder] = cells
    return rows


def named(cell: str) -> list[str]:
    """The name leading each item of a modules cell; an item led by no name is returned whole."""
    if not cell:
        return []
    names = []
    for item in cell.split("; "):
        lead = re.match(r"`([^`]+)`", item.strip())
        names.append(lead.group(1) if lead else item.strip())
    return names


def packages() -> dict[str, set[str]]:
    """Each package folder under harness/ and codecs/, as the table writes it, → its modules' names."""
    found: dict[str, set[str]] = {}
    for top in CODE_FOLDERS:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            folder = init.parent
            key = folder.relative_to(ROOT).as_posix() + "/"
            found[key] = {path.stem for path in folder.glob("*.py") if path.name != "__init__.py"}
    return found


def studies() -> set[str]:
    return {path.name for path in STUDIES.iterdir() if path.is_dir() and not path.name.startswith((".", "__"))}


def name_problems(where: str, listed: list[str], present: set[str]) -> list[str]:
    """What a row gets wrong against the tree: names missing, named twice, or naming nothing there."""
    problems = [f"{where}: no entry for `{name}`" for name in sorted(present - set(listed))]
    problems += [f"{where}: `{name}` is not there" for name in sorted(set(listed) - present)]
    problems += [f"{where}: `{name}` named twice" for name in sorted({n for n in listed if listed.count(n) > 1})]
    return problems


def test_every_package_has_a_row_naming_each_of_its_modules() -> None:
    rows = table_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    found = packages()
    problems: list[str] = []
    for folder, modules in found.items():
        if folder not in rows:
            problems.append(f"{folder}: no row")
            continue
        cells = rows[folder]
        if len(cells) != 3:
            problems.append(f"{folder}: {len(cells)} cells, not folder | what it is | modules")
            continue
        problems += name_problems(folder, named(cells[2]), modules)
    problems += [
        f"{folder}: a row, but no package there"
        for folder in rows
        if folder.startswith(CODE_FOLDERS) and folder not in found
    ]
    assert problems == [], f"docs/{ARCHITECTURE.name} ({SECTION[3:]}):\n" + "\n".join(problems)


def test_every_study_is_listed_once_and_has_a_readme() -> None:
    rows = table_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    assert STUDIES_ROW in rows, f"docs/{ARCHITECTURE.name}: no row for {STUDIES_ROW}"
    problems = name_problems(STUDIES_ROW, named(rows[STUDIES_ROW][-1]), studies())
    assert problems == [], "\n".join(problems)
    without = sorted(name for name in studies() if not (STUDIES / name / "README.md").is_file())
    assert without == [], f"studies without a README.md: {without}"


def test_the_docs_index_links_every_page() -> None:
    linked = {Path(target).name for target in LINK_TARGET.findall(DOCS_INDEX.read_text(encoding="utf-8"))}
    pages = {path.name for path in DOCS_INDEX.parent.glob("*.md")} - {DOCS_INDEX.name}
    unlinked = sorted(pages - linked)
    assert unlinked == [], f"docs/{DOCS_INDEX.name} does not link {unlinked}: add an entry for each"


def package_docstring(folder: str) -> str:
    return ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text(encoding="utf-8"))) or ""


def test_package_docstrings_point_to_the_index_and_list_no_modules() -> None:
    problems: list[str] = []
    for folder, modules in packages().items():
        if folder == "harness/":  # the project's own docstring, not a package's
            continue
        doc = package_docstring(folder)
        if "docs/architecture.md" not in doc:
            problems.append(f"{folder}__init__.py: its docstring does not point to docs/architecture.md")
        for line in doc.splitlines():
            entry = LIST_ENTRY.match(line)
            if entry and entry.group(1) in modules:
                problems.append(f"{folder}__init__.py lists a module: {line.strip()!r}")
    assert problems == [], "\n".join(problems)


def test_the_parsers_read_what_they_should() -> None:
    text = (
        f"{SECTION}\n\n| folder | what it is | modules |\n| --- | --- | --- |\n"
        "| `pkg/` | a package | `a`: one job; `b`: two (`--flag`, `x`); no name here |\n"
        "| `data/` | not a package | |\n\n## Next\n\n| `later/` | x | |\n"
    )
    rows = table_rows(text)
    assert list(rows) == ["pkg/", "data/"]
    assert named(rows["pkg/"][2]) == ["a", "b", "no name here"]
    assert named(rows["data/"][2]) == []
    assert name_problems("pkg/", ["a", "b", "b"], {"a", "c"}) == [
        "pkg/: no entry for `c`",
        "pkg/: `b` is not there",
        "pkg/: `b` named twice",
    ]
    entries = ["process    the spawned process", "- :mod:`.spans`: times every message", "  flags     the flags"]
    prose = ["Scheduler, the DetokenizerManager). There it", "spans (the link's rules)", "process of its own"]
    assert [m.group(1) for line in entries if (m := LIST_ENTRY.match(line))] == ["process", "spans", "flags"]
    assert [line for line in prose if LIST_ENTRY.match(line)] == []
    assert LINK_TARGET.findall("- [a.md](a.md#x) — and [up](../README.md)") == ["a.md", "../README.md"]
