"""Dashboard exports: the figures of a comparison in the formats regression dashboards read.

- github-action-benchmark's ``customSmallerIsBetter`` (and ``customBiggerIsBetter``):
  a JSON list of ``{"name", "unit", "value", "range", "extra"}``. One tool
  input holds one direction, so throughputs (bigger is better) go to a second
  file when asked for (``bigger_path``); by default they are left out.
- Bencher's Metric Format (BMF): ``{benchmark: {measure: {"value", "lower_value",
  "upper_value"}}}``; a measure's direction is set in Bencher, not in the file.

One entry per arm × figure: the median over the arm's rounds, with the
rounds' min and max as the range/bounds. Names are ``<arm>/<figure label>``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.analysis.documents import write_json
from harness.analysis.figures import (
    Figure,
)
from harness.analysis.verdicts import Arm


def unit_of(figure: Figure) -> str:
    key = figure.key
    if key.endswith("_us"):
        return "us"
    if key.endswith("_ms"):
        return "ms"
    return "tok/s" if "output_throughput" in key else "req/s" if "throughput" in key else ""


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-").replace("--", "-")


def _values(arm: Arm, figure: Figure) -> list[float]:
    return [v for v in arm.values(figure.key) if math.isfinite(v)]


def github_benchmark(arms: Sequence[Arm], figures: Sequence[Figure], bigger: bool = False) -> list[dict[str, Any]]:
    """github-action-benchmark entries for the figures of one direction (bigger or smaller is better)."""
    out = []
    for arm in arms:
        for fig in figures:
            values = _values(arm, fig)
            if fig.higher_is_better != bigger or not values:
                continue
            out.append(
                {
                    "name": f"{arm.label}/{fig.label}",
                    "unit": unit_of(fig),
                    "value": statistics.median(values),
                    "range": f"{min(values):.6g} .. {max(values):.6g}",
                    "extra": f"median of {len(values)} rounds",
                }
            )
    return out


def bencher_bmf(arms: Sequence[Arm], figures: Sequence[Figure]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for arm in arms:
        measures = {}
        for fig in figures:
            values = _values(arm, fig)
            if values:
                measures[_slug(fig.label)] = {
                    "value": statistics.median(values),
                    "lower_value": min(values),
                    "upper_value": max(values),
                }
        if measures:
            out[arm.label] = measures
    return out


def write_exports(
    arms: Sequence[Arm],
    figures: Sequence[Figure],
    *,
    github_path: Path | None = None,
    github_bigger_path: Path | None = None,
    bencher_path: Path | None = None,
) -> None:
    if github_path is not None:
        write_json(github_path, github_benchmark(arms, figures), indent=2)
    if github_bigger_path is not None:
        write_json(github_bigger_path, github_benchmark(arms, figures, bigger=True), indent=2)
    if bencher_path is not None:
        write_json(bencher_path, bencher_bmf(arms, figures), indent=2)
