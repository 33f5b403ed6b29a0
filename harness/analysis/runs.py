"""Runs as comparisons see them: one ``RunEntry`` per run of a source (a run file, a folder of
them, or a compare document with its runs), with the figures ``documents.run_figures`` reads."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.analysis.blocks import block_values
from harness.analysis.documents import (
    PathLike,
    ResultsError,
    as_float,
    is_compare,
    is_run,
    load_run,
    read_json,
    run_figures,
)

# One file or folder, or several; runs already collected (RunEntry) pass through as they are.
Source = PathLike | Iterable["PathLike | RunEntry"]
_ROUND_IN_NAME = re.compile(r"-r(\d+)-")  # a run file's round, from its name


@dataclass
class RunEntry:
    """One run of a source: where its file is (None for a run that saved none) and what it is.

    ``figures`` are the run's summary figures (``run_figures``): from its run
    file when there is one, else as a compare document embedded them (compact
    baselines carry figures, not files); None when neither exists.
    """

    codec: str
    round: int | None
    status: str
    message: str
    path: Path | None
    doc: dict[str, Any] | None
    figures: dict[str, float] | None = None
    # A run in blocks: each block's figures (harness.analysis.blocks), what a sequential verdict pairs.
    blocks: dict[str, list[float]] | None = None
    # Minutes of --until-resolved its run was made with (0: a fixed number of rounds).
    until_resolved: float = 0.0


def until_resolved_of(doc: dict[str, Any] | None) -> float:
    """The --until-resolved minutes a run or compare document records (0 when none)."""
    flags = ((doc or {}).get("metadata") or {}).get("flags") or {}
    value = as_float(flags.get("until_resolved"))
    return value if value > 0 else 0.0


def resolve_result_file(result_file: str, compare_path: Path) -> Path:
    """A compare file's ``result_file``: as written if absolute or existing,
    else relative to the compare file's folder, else its name in that folder
    (a results folder that was moved or copied as a whole)."""
    given = Path(result_file)
    folder = compare_path.parent
    candidates = [given] if given.is_absolute() else [given, folder / given]
    candidates.append(folder / given.name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise ResultsError(f"{compare_path}: result file {result_file!r} not found (tried {tried})")


def _entry_from_run(path: Path, doc: dict[str, Any]) -> RunEntry:
    flags = (doc.get("metadata") or {}).get("flags") or {}
    # bench run labels its arms (the same codec twice in an A/A run): the label wins.
    codec = flags.get("arm") or doc.get("codec") or flags.get("codec") or "unknown"
    rnd = flags.get("round")
    if rnd is None:
        match = _ROUND_IN_NAME.search(path.name)
        rnd = int(match.group(1)) if match else None
    status = _run_status(doc)
    return RunEntry(str(codec), rnd, status, "", path, doc, run_figures(doc), block_values(doc), until_resolved_of(doc))


def _run_status(doc: dict[str, Any]) -> str:
    """bench run's status words, for a run file read on its own."""
    if doc.get("interrupted"):
        return "interrupted"
    return "failures" if doc.get("failed") else "ok"


def _entries_from_compare(path: Path, doc: dict[str, Any]) -> list[RunEntry]:
    """The runs a compare document lists. A run's figures come from its run file, or, when
    that file is absent and the document embeds them (compare 2, compact baselines), from there."""
    entries = []
    for i, run in enumerate(doc["runs"]):
        if not isinstance(run, dict) or "codec" not in run:
            raise ResultsError(f"{path}: runs[{i}] is not a run entry (no 'codec')")
        file = run.get("result_file")
        embedded = run.get("figures") if isinstance(run.get("figures"), dict) else None
        run_path = run_doc = None
        if file:
            try:
                run_path = resolve_result_file(file, path)
            except ResultsError:
                if embedded is None:
                    raise
        if run_path is not None:
            run_doc = load_run(run_path)
        figures = run_figures(run_doc) if run_doc is not None else _figures_of(embedded)
        blocks = block_values(run_doc) if run_doc is not None else _blocks_of(run.get("blocks"))
        entries.append(
            RunEntry(
                str(run["codec"]),
                run.get("round"),
                str(run.get("status") or "ok"),
                str(run.get("message") or ""),
                run_path,
                run_doc,
                figures,
                blocks,
                until_resolved_of(run_doc) or until_resolved_of(doc) or _judged_sequentially(doc),
            )
        )
    return entries


def _judged_sequentially(doc: dict[str, Any]) -> float:
    """A compare document judged sequentially but without its flags (bench compare --json of one): its
    runs were made until resolved, for minutes it does not say (1.0 stands for "some")."""
    return 1.0 if (doc.get("comparison") or {}).get("sequential") else 0.0


def _blocks_of(embedded: Any) -> dict[str, list[float]] | None:
    if not isinstance(embedded, dict):
        return None
    return {str(k): [as_float(v) for v in values] for k, values in embedded.items() if isinstance(values, list)}


def _figures_of(embedded: dict[str, Any] | None) -> dict[str, float] | None:
    return None if embedded is None else {str(k): as_float(v) for k, v in embedded.items()}


def collect_runs(source: Source) -> list[RunEntry]:
    """Every run a source names, each file loaded once, in the order given."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise ResultsError("no result files given")
    entries: list[RunEntry] = []
    seen: set[Path] = set()

    def add(entry: RunEntry) -> None:
        if entry.path is not None:
            key = entry.path.resolve()
            if key in seen:
                return
            seen.add(key)
        entries.append(entry)

    for item in items:
        if isinstance(item, RunEntry):
            add(item)
            continue
        p = Path(item)
        if p.is_dir():
            for child in sorted(p.glob("*.json")):
                if child.name.startswith("."):
                    continue
                doc = read_json(child)
                if is_run(doc) and not is_compare(doc):
                    add(_entry_from_run(child, doc))
            continue
        for entry in entries_of(p, read_json(p)):
            add(entry)
    return entries


def entries_of(path: Path, doc: dict[str, Any]) -> list[RunEntry]:
    """The runs of one file already read: a compare document's, or the run itself."""
    if is_compare(doc):
        return _entries_from_compare(path, doc)
    if is_run(doc):
        return [_entry_from_run(path, doc)]
    raise ResultsError(f"{path}: neither a run file nor a compare file")
