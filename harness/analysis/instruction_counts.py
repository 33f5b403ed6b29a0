"""Instruction counts of codec calls as a document, and the gate over them.

Counts repeat (callgrind, one process per count, a fixed hash seed, gc off in the
loop: the same count to 0.001% run after run here), so unlike latency they can be
judged against a committed baseline from another session: a cell fails when its
count rose by more than ``threshold_pct``. No statistics are needed, and none are
claimed; what must match is what changes the count on the same code: the Python
and library versions and the machine's architecture (each difference is named).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness.analysis import table as text_table
from harness.analysis.documents import SCHEMAS, ResultsError, jsonable

EXIT_PASS, EXIT_REGRESSION, EXIT_UNUSABLE, EXIT_MISSING = 0, 1, 2, 3
DEFAULT_THRESHOLD_PCT = 1.0
# What must match for counts to be compared: versions that run the counted code, and the ISA.
SAME = ("python", "machine", "msgspec", "pyzmq", "numpy", "valgrind")


def instructions_document(
    counts: Iterable[Any], calls: int, meta: dict[str, Any], layout_shifts: Iterable[int] = ()
) -> dict[str, Any]:
    """``bench micro --count instructions --json``: one cell per codec × payload × op (the median over
    the layouts, and each layout's count)."""
    cells = [
        {"codec": c.codec, "payload": c.payload, "op": c.op, "instructions": c.per_call, "per_layout": c.per_layout}
        for c in counts
    ]
    return jsonable(
        {
            "kind": "instructions",
            "schema_version": SCHEMAS["instructions"],
            "calls": calls,
            "layout_shifts": list(layout_shifts),
            "metadata": meta,
            "cells": cells,
        }
    )


def check_document(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("kind") != "instructions":
        raise ResultsError(f"{what}: not an instructions document (bench micro --count instructions --json)")
    if doc.get("schema_version") != SCHEMAS["instructions"]:
        raise ResultsError(
            f"{what}: instructions schema {doc.get('schema_version')}, expected {SCHEMAS['instructions']}"
        )
    return doc


def versions(meta: dict[str, Any]) -> dict[str, Any]:
    libs = meta.get("libraries") or {}
    return {key: meta.get(key, libs.get(key)) for key in SAME}


def differences(current: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    now, then = versions(current.get("metadata") or {}), versions(baseline.get("metadata") or {})
    return [f"{k}: baseline {then[k]!r}, current {now[k]!r}" for k in SAME if now[k] != then[k]]


@dataclass(frozen=True)
class CountRow:
    codec: str
    payload: str
    op: str
    baseline: float
    current: float
    outcome: str  # ok | REGRESSION | faster

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.current / self.baseline - 1.0) if self.baseline else float("inf")


@dataclass
class CountGate:
    rows: list[CountRow]
    missing: list[str]  # baseline cells not counted now
    threshold_pct: float

    @property
    def exit_code(self) -> int:
        if any(r.outcome == "REGRESSION" for r in self.rows):
            return EXIT_REGRESSION
        return EXIT_MISSING if self.missing else EXIT_PASS


def judge(current: dict[str, Any], baseline: dict[str, Any], threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> CountGate:
    """Each cell of ``baseline`` against the same cell now; ResultsError when the two cannot be compared."""
    differ = differences(current, baseline)
    if differ:
        raise ResultsError("counts from different versions or machines: " + "; ".join(differ))

    def key(cell: dict[str, Any]) -> tuple[str, str, str]:
        return cell["codec"], cell["payload"], cell["op"]

    now = {key(c): float(c["instructions"]) for c in current["cells"]}
    rows, missing = [], []
    for cell in baseline["cells"]:
        k = key(cell)
        if k not in now:
            missing.append("/".join(k))
            continue
        old, new = float(cell["instructions"]), now[k]
        change = 100.0 * (new / old - 1.0) if old else float("inf")
        outcome = "REGRESSION" if change > threshold_pct else "faster" if change < -threshold_pct else "ok"
        rows.append(CountRow(*k, old, new, outcome))
    return CountGate(rows, missing, threshold_pct)


def format_gate(gate: CountGate) -> list[str]:
    rows = [
        [r.codec, r.payload, r.op, f"{r.baseline:,.0f}", f"{r.current:,.0f}", f"{r.change_pct:+.2f}%", r.outcome]
        for r in gate.rows
    ]
    lines = text_table.format_table(["codec", "payload", "op", "baseline", "current", "change", "gate"], rows, left=3)
    bad = sum(r.outcome == "REGRESSION" for r in gate.rows)
    lines.append(
        f"instruction gate (threshold +{gate.threshold_pct:g}%): {bad} regression(s) of {len(gate.rows)} cells"
    )
    if gate.missing:
        lines.append(f"in the baseline, not counted now: {', '.join(gate.missing)}")
    return lines
