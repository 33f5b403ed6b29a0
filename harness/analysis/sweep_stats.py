"""A sweep's numbers: per-point intervals over rounds, verdicts per point, and crossings.

``interval`` is the t-interval of per-round values (and of their logs, around the
geometric mean, which the log–log plots draw). A *crossing* is the first grid point
(in axis order) where a codec's Holm-adjusted verdict becomes "slower" or "faster"
than the reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from harness.analysis import stats
from harness.analysis.figures import E2E_FIGURES, MICRO_FIGURES, Figure
from harness.analysis.student_t import CONFIDENCE
from harness.analysis.sweep_grid import PAYLOAD_AXES, Axis, axes_of, payload_axis, x_axis
from harness.analysis.verdicts import verdict_dict


def judge_family(
    ref: Mapping[str, Sequence[float]],
    others: Mapping[str, Mapping[str, Sequence[float]]],
    figures: Sequence[Figure],
    margin_pct: float,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Every (codec, figure) of one point against the reference, Holm over the point; verdict dicts.

    Rounds pair when both sides have one value per round (same length), else Welch.
    """
    keys: list[tuple[str, Figure]] = []
    family: list[stats.PairStats | None] = []
    for codec, values in others.items():
        for fig in figures:
            a, b = list(ref.get(fig.key) or ()), list(values.get(fig.key) or ())
            if not a and not b:  # not measured at all (delivery switched off): no verdict, not in the family
                continue
            keys.append((codec, fig))
            if not a or not b:
                family.append(None)
                continue
            paired = len(a) == len(b)
            family.append(stats.compare_arms(a, b, paired=paired, confidence=CONFIDENCE))
    if not family:
        return {}
    verdicts = stats.judge(family, higher_is_better=[f.higher_is_better for _, f in keys], margin_pct=margin_pct)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (codec, fig), verdict in zip(keys, verdicts, strict=True):
        out.setdefault(codec, {})[fig.key] = verdict_dict(verdict)
    return out


def _fmt_pct(v: dict[str, Any]) -> str:
    def p(x: Any) -> str:
        return f"{x:+.1f}%" if isinstance(x, (int, float)) and math.isfinite(x) else "?"

    return f"{p(v.get('change_pct'))} [{p(v.get('ci_low_pct'))}, {p(v.get('ci_high_pct'))}]"


def _where(axis: Axis, value: float, payload_bytes: dict[str, int]) -> str:
    text = axis.text(value)
    nbytes = payload_bytes.get(f"{value:g}")
    return f"{text} ({human_bytes(nbytes)})" if nbytes and axis.name in PAYLOAD_AXES else text


def human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def find_crossings(
    points: Sequence[dict[str, Any]],
    *,
    part: str,
    labels: Sequence[str],
    figures: Sequence[Figure],
    along: Axis,
    series: Axis | None,
    payload_bytes: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Per codec x figure (x series), the first point along ``along`` where the verdict becomes slower/faster."""
    payload_bytes = payload_bytes or {}
    ref = labels[0]
    out = []
    series_values: list[float | None] = list(series.values) if series is not None else [None]
    for sv in series_values:
        line = [p for p in points if series is None or p["at"].get(series.name) == sv]
        line.sort(key=lambda p: p["at"][along.name])
        for label in labels[1:]:
            for fig in figures:
                seq: list[tuple[dict[str, Any], dict[str, Any] | None, str]] = []
                for p in line:
                    row = p["codecs"].get(label) or {}
                    verdict = (row.get("verdicts") or {}).get(fig.key)
                    if row.get("status") not in (None, "ok"):
                        seq.append((p, None, str(row.get("status"))))
                    else:
                        seq.append((p, verdict, (verdict or {}).get("verdict", "not measured")))
                entry = _crossing_entry(part, label, ref, fig, along, series, sv, seq, payload_bytes)
                if entry is not None:
                    out.append(entry)
    return out


def _crossing_entry(
    part: str,
    label: str,
    ref: str,
    fig: Figure,
    along: Axis,
    series: Axis | None,
    sv: float | None,
    seq: list[tuple[dict[str, Any], dict[str, Any] | None, str]],
    payload_bytes: dict[str, int],
) -> dict[str, Any] | None:
    if not seq:
        return None
    if all(v is None for _, v, _ in seq):
        return None  # never measured for this codec (unsupported everywhere, or the figure switched off)
    head = f"{label}, {fig.label}" + (f" at {series.text(sv)}" if series is not None and sv is not None else "")
    words = [w for _, _, w in seq]
    first = None
    for i, (p, v, w) in enumerate(seq):
        if w in ("slower", "faster"):
            first = (i, p, v, w)
            break
    span = f"{along.text(seq[0][0]['at'][along.name])} – {along.text(seq[-1][0]['at'][along.name])}"
    entry: dict[str, Any] = {
        "part": part,
        "codec": label,
        "figure": fig.key,
        "label": fig.label,
        "series": {series.name: sv} if series is not None and sv is not None else None,
        "verdict": None,
        "at": None,
        "change_pct": None,
        "ci_low_pct": None,
        "ci_high_pct": None,
        "verdicts": [{"at": p["at"], "verdict": w} for p, _, w in seq],
    }
    if first is None:
        counts: dict[str, int] = {}
        for w in words:
            counts[w] = counts.get(w, 0) + 1
        tally = ", ".join(f"{w} at {n} point{'s' if n > 1 else ''}" for w, n in counts.items())
        entry["text"] = f"{head}: no verdict against {ref} over {span} ({tally})"
        return entry
    i, p, v, w = first
    value = p["at"][along.name]
    assert v is not None
    where = _where(along, value, payload_bytes)
    if i == 0:
        text = f"{head}: {w} than {ref} from the first point, {where}, on: {_fmt_pct(v)}"
    else:
        before = ", ".join(f"{along.text(q['at'][along.name])} {ww}" for q, _, ww in seq[:i] if ww is not None)
        text = f"{head}: becomes {w} than {ref} at {where}: {_fmt_pct(v)} (before: {before})"
    after = seq[i + 1 :]
    if any(ww != w for _, _, ww in after):  # every later point, so a gap of "inconclusive" shows
        text += " (later: " + ", ".join(f"{along.text(q['at'][along.name])} {ww}" for q, _, ww in after) + ")"
    entry.update(
        {
            "verdict": w,
            "at": p["at"],
            "change_pct": v.get("change_pct"),
            "ci_low_pct": v.get("ci_low_pct"),
            "ci_high_pct": v.get("ci_high_pct"),
            "text": text,
        }
    )
    return entry


def all_crossings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The crossings of both parts of a sweep document."""
    axes = axes_of(doc)
    labels = doc["codecs"]
    if len(labels) < 2:
        return []
    payload_bytes = doc.get("payload_bytes") or {}
    out = []
    pax = payload_axis(axes)
    micro = doc.get("micro")
    if micro and pax is not None:
        out += find_crossings(
            micro["points"],
            part="micro",
            labels=labels,
            figures=MICRO_FIGURES,
            along=pax,
            series=None,
            payload_bytes=payload_bytes,
        )
    e2e = doc.get("e2e")
    if e2e:
        along = x_axis(axes)
        series = next((a for a in axes if a is not along), None)
        out += find_crossings(
            [p for p in e2e["points"] if p.get("codecs")],
            part="e2e",
            labels=labels,
            figures=E2E_FIGURES,
            along=along,
            series=series,
            payload_bytes=payload_bytes,
        )
    return out
