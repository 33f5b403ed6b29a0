"""A sweep's PNGs: codec cost and delivery against payload bytes (micro), latency against the
rate or payload (e2e), each captioned with its crossings in words."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.analysis.figures import E2E_FIGURES, MICRO_FIGURES
from harness.analysis.plots import arm_colors, pyplot
from harness.analysis.sweep_grid import (
    IMAGE_SIDE,
    PAYLOAD_AXES,
    PROMPT_LEN,
    REQUEST_RATE,
    Axis,
    axes_of,
    payload_axis,
    x_axis,
)
from harness.analysis.sweep_stats import CONFIDENCE, human_bytes

_LINE_IN = 0.145
_CHARS_PER_IN = 15


def _caption(lines: Sequence[str], width_in: float) -> str:
    wrapped: list[str] = []
    for line in lines:
        wrapped += textwrap.wrap(line, width=int(width_in * _CHARS_PER_IN), subsequent_indent="    ") or [""]
    return "\n".join(wrapped)


def fig_width(ncols: int) -> float:
    return max(7.5, 5.2 * ncols + 0.6)


def _figure(ncols: int, nrows: int, caption: str) -> tuple[Any, Any, tuple[float, float, float, float]]:
    """A figure with its caption at the bottom; lay it out with ``fig.tight_layout(rect=rect)`` once drawn."""
    plt = pyplot()
    width = fig_width(ncols)
    cap_h = (caption.count("\n") + 1) * _LINE_IN + 0.25 if caption else 0.0
    height = 4.0 * nrows + 0.7 + cap_h
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    if caption:
        fig.text(0.01, 0.01, caption, ha="left", va="bottom", fontsize=8, family="monospace")
    return fig, axes, (0.0, (cap_h + 0.05) / height, 1.0, 1.0)


def _curve(
    ax: Any,
    points: Sequence[dict[str, Any]],
    label: str,
    key: str,
    x_of: Callable[[dict[str, Any]], float],
    color: Any,
    geometric: bool = False,
) -> bool:
    """One codec's means with t-interval error bars; a ring marks a verdict (slower or faster). False if empty.

    ``geometric`` (log y axes): the geometric mean and the t-interval of the log values.
    """
    names = ("gmean", "gci_low", "gci_high") if geometric else ("mean", "ci_low", "ci_high")
    xs, ys, lo, hi, rx, ry = [], [], [], [], [], []
    for p in sorted(points, key=x_of):
        row = p["codecs"].get(label) or {}
        if row.get("status", "ok") != "ok":
            continue
        fig = (row.get("figures") or {}).get(key) or {}
        mean = _finite(fig.get(names[0], fig.get("mean")))
        if mean is None or mean <= 0:
            continue
        low, high = _finite(fig.get(names[1])), _finite(fig.get(names[2]))
        xs.append(x_of(p))
        ys.append(mean)
        lo.append(max(0.0, mean - low) if low is not None else 0.0)
        hi.append(max(0.0, high - mean) if high is not None else 0.0)
        verdict = ((row.get("verdicts") or {}).get(key) or {}).get("verdict")
        if verdict in ("slower", "faster"):
            rx.append(xs[-1])
            ry.append(mean)
    if not xs:
        return False
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="-o", ms=4, capsize=3, color=color, label=label)
    if rx:
        ax.scatter(rx, ry, s=140, facecolors="none", edgecolors=color, linewidths=1.6)
    return True


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _top_labels(ax: Any, xs: Sequence[float], texts: Sequence[str]) -> None:
    from matplotlib.ticker import NullLocator

    sec = ax.secondary_xaxis("top")
    sec.set_xticks(list(xs), labels=list(texts))
    sec.xaxis.set_minor_locator(NullLocator())
    sec.tick_params(labelsize=7)


def _bytes_ticks(ax: Any, xs: Sequence[float]) -> None:
    """Ticks at the points' payload bytes (a log axis over less than a decade has no major tick)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(sorted(set(xs))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: human_bytes(x)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=8)


def _tick_label(axis: Axis, value: float) -> str:
    return f"{value:g}" + {IMAGE_SIDE: "px", PROMPT_LEN: "tok", REQUEST_RATE: "/s"}[axis.name]


def caption_for(doc: dict[str, Any], part: str) -> list[str]:
    ref = doc.get("reference", "the first codec")
    lines = [c["text"] for c in doc.get("crossings") or () if c["part"] == part]
    note = (
        f"Points: mean over rounds, bars: {CONFIDENCE:.0%} t-interval of the per-round values (on log axes: "
        f"geometric mean, t-interval of the logs); ring: a verdict against {ref} (Holm-adjusted p < 0.05 "
        "on the paired log ratios)."
    )
    return [note, *lines] if lines else [note, f"(one codec only: nothing to compare with {ref})"]


def draw_micro(doc: dict[str, Any]) -> Any | None:
    """Codec cost (and delivery) against payload bytes, log–log, with the memcpy line; None without micro points."""
    micro = doc.get("micro")
    if not micro or not micro.get("points"):
        return None
    axes_ = axes_of(doc)
    pax = payload_axis(axes_)
    assert pax is not None
    points = sorted(micro["points"], key=lambda p: p["payload_bytes"])
    keys = [
        f
        for f in MICRO_FIGURES
        if any(((r.get("figures") or {}).get(f.key) or {}).get("n") for p in points for r in p["codecs"].values())
    ] or [MICRO_FIGURES[0]]
    ncols = len(keys)
    fig, grid_, rect = _figure(ncols, 1, _caption(caption_for(doc, "micro"), fig_width(ncols)))
    colors = arm_colors(doc["codecs"])
    xs = [p["payload_bytes"] for p in points]
    for ax, f in zip(grid_[0], keys, strict=True):
        ax.plot(xs, [p["memcpy_us"]["mean"] for p in points], "k--", lw=1.2, label="one memcpy of the same bytes")
        for label in doc["codecs"]:
            _curve(ax, points, label, f.key, lambda p: p["payload_bytes"], colors[label], geometric=True)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _bytes_ticks(ax, xs)
        ax.set_xlabel("payload bytes per message")
        ax.set_ylabel("µs per message")
        ax.set_title(f.label, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
        _top_labels(ax, xs, [_tick_label(pax, p["at"][pax.name]) for p in points])
    kind = micro.get("payload_kind", "")
    fig.suptitle(
        f"bench sweep, micro: {kind} payloads, {micro.get('repeat')} interleaved rounds per point\n"
        f"(≥{micro.get('min_iterations')} calls and {micro.get('min_time_s')} s per measurement)",
        fontsize=10,
    )
    fig.tight_layout(rect=rect)
    return fig


def draw_e2e(doc: dict[str, Any]) -> Any | None:
    """TTFT p50/p99 and TPOT mean per codec along the rate (or payload) axis; one row per other-axis value."""
    e2e = doc.get("e2e")
    points = [p for p in (e2e or {}).get("points") or () if p.get("codecs")]
    if not points:
        return None
    axes_ = axes_of(doc)
    along = x_axis(axes_)
    series = next((a for a in axes_ if a is not along), None)
    rows: list[float | None] = list(series.values) if series is not None else [None]
    payload_bytes = doc.get("payload_bytes") or {}
    ncols = len(E2E_FIGURES)
    fig, grid_, rect = _figure(ncols, len(rows), _caption(caption_for(doc, "e2e"), fig_width(ncols)))
    colors = arm_colors(doc["codecs"])
    by_payload = along.name in PAYLOAD_AXES

    def x_of(p: dict[str, Any]) -> float:
        value = float(p["at"][along.name])
        return float(payload_bytes.get(f"{value:g}", value)) if by_payload else value

    for r, sv in enumerate(rows):
        line = [p for p in points if series is None or p["at"].get(series.name) == sv]
        for c, f in enumerate(E2E_FIGURES):
            ax = grid_[r][c]
            means = [
                _finite(((p["codecs"][lb].get("figures") or {}).get(f.key) or {}).get("mean"))
                for p in line
                for lb in p["codecs"]
            ]
            finite = [m for m in means if m is not None and m > 0]
            log_y = bool(finite) and max(finite) / min(finite) > 20  # a knee spans decades
            for label in doc["codecs"]:
                _curve(ax, line, label, f.key, x_of, colors[label], geometric=log_y)
            if log_y:
                ax.set_yscale("log")
            ax.set_title(
                f.label + (f" — {series.text(sv)}" if series is not None and sv is not None else ""), fontsize=10
            )
            ax.set_ylabel("ms")
            ax.grid(True, which="both", alpha=0.25)
            if by_payload:
                ax.set_xscale("log")
                _bytes_ticks(ax, [x_of(p) for p in line])
                ax.set_xlabel("payload bytes per request")
                ordered = sorted(line, key=x_of)
                _top_labels(ax, [x_of(p) for p in ordered], [_tick_label(along, p["at"][along.name]) for p in ordered])
            else:
                ax.set_xlabel(f"{along.label} ({along.unit})")
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
    repeat = (e2e or {}).get("repeat")
    fig.suptitle(f"bench sweep, end to end: {repeat} interleaved rounds per point and codec", fontsize=10)
    fig.tight_layout(rect=rect)
    return fig


def save_plots(doc: dict[str, Any], stem: Path) -> list[Path]:
    """``<stem>-micro.png`` and ``<stem>-e2e.png`` (those that have points)."""
    plt = pyplot()
    written = []
    for part, draw in (("micro", draw_micro), ("e2e", draw_e2e)):
        fig = draw(doc)
        if fig is None:
            continue
        path = stem.with_name(f"{stem.name}-{part}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
