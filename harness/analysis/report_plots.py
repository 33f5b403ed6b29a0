"""The HTML report's plots of runs: latency CDFs, the codec and IPC budget, send times over the run
(and, for a ramped load, the figures against the offered rate, drawn as a sweep's curves); each a
matplotlib figure, embedded by ``figure_uri`` as a data URI."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from harness.analysis.documents import as_float
from harness.analysis.figures import CODEC_FIGURES, IPC_SPAN_FIGURES
from harness.analysis.plots import arm_colors, pyplot
from harness.analysis.runs import RunEntry
from harness.analysis.student_t import interval
from harness.analysis.sweep_plots import _curve
from harness.loadgen.ramp import EXPONENTIAL, Ramp, by_offered_rate, ramp_from

MIME = {"png": "image/png", "svg": "image/svg+xml"}


def figure_uri(fig: Any, fmt: str = "png") -> str:
    """A matplotlib figure as a data: URI (the figure is closed)."""
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
    plt.close(fig)
    return f"data:{MIME[fmt]};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"


def cdf_figure(requests: Any, codecs: Sequence[str]) -> Any | None:
    """Empirical CDFs of per-request TTFT and TPOT per codec (rounds pooled)."""
    import numpy as np

    if requests.empty:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = arm_colors(codecs)
    for ax, column, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        spans = []
        for codec in codecs:
            values = np.sort(requests.loc[requests["codec"] == codec, column].dropna().to_numpy())
            if not len(values):
                continue
            ys = np.arange(1, len(values) + 1) / len(values)
            ax.step(values, ys, where="post", color=colors[codec], label=f"{codec} (n={len(values)})")
            spans += [values[0], values[-1]]
        positive = [v for v in spans if v > 0]
        if positive and max(positive) / min(positive) > 20:
            ax.set_xscale("log")
        ax.set_title(f"{title} per request, empirical CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests ≤ x")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        for q in (0.5, 0.99):
            ax.axhline(q, color="gray", lw=0.6, ls=":")
        if spans:
            ax.legend(fontsize=8, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    return fig


def codec_columns(runs: Any) -> list[str]:
    """The codec figures (µs per message per direction) that some run of the frame carries."""
    return [f.key for f in CODEC_FIGURES if f.key in runs and runs[f.key].notna().any()]


def draw_codec_bars(ax: Any, runs: Any, codecs: Sequence[str], columns: Sequence[str]) -> None:
    """Codec µs per message per direction on ``ax``: per arm the median over runs, whiskers min to max."""
    labels = {f.key: f.long_label for f in CODEC_FIGURES}
    width = 0.8 / len(columns)
    for j, column in enumerate(columns):
        mids, lows, highs = [], [], []
        for codec in codecs:
            values = runs.loc[runs["codec"] == codec, column].dropna()
            mid = float(values.median()) if len(values) else math.nan
            mids.append(mid)
            lows.append(mid - float(values.min()) if len(values) else 0.0)
            highs.append(float(values.max()) - mid if len(values) else 0.0)
        xs = [i + (j - (len(columns) - 1) / 2) * width for i in range(len(codecs))]
        ax.bar(xs, mids, width, yerr=[lows, highs], capsize=3, label=labels[column])
    ax.set_xticks(range(len(codecs)), codecs, rotation=15)
    ax.set_ylabel("µs per message")
    ax.set_title("Codec cost per message (server /metrics)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def budget_figure(runs: Any, codecs: Sequence[str]) -> Any | None:
    """Codec µs per direction (median over runs, min–max whiskers) and the IPC budget per arm (stacked p50s)."""
    import numpy as np

    codec_cols = codec_columns(runs)
    ipc_cols = [f.key for f in IPC_SPAN_FIGURES if f.key in runs and runs[f.key].notna().any()]
    if not codec_cols and not ipc_cols:
        return None
    plt = pyplot()
    panels = (1 if codec_cols else 0) + (1 if ipc_cols else 0)
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 4.4), squeeze=False)
    col = 0
    if codec_cols:
        draw_codec_bars(axes[0][col], runs, codecs, codec_cols)
        col += 1
    if ipc_cols:
        ax = axes[0][col]
        labels = {f.key: f.long_label for f in IPC_SPAN_FIGURES}
        left = np.zeros(len(codecs))
        cmap = plt.get_cmap("tab20")
        for j, column in enumerate(ipc_cols):
            values = []
            for codec in codecs:
                v = runs.loc[runs["codec"] == codec, column].dropna()
                values.append(float(v.median()) if len(v) else 0.0)
            ax.barh(range(len(codecs)), values, left=left, color=cmap(j % 20), label=labels[column])
            left += np.array(values)
        ax.set_yticks(range(len(codecs)), codecs)
        ax.invert_yaxis()
        ax.set_xlabel("µs (p50 of each span, median over rounds)")
        ax.set_title("IPC budget on the first-token path")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def send_times(entries: Sequence[RunEntry]) -> list[dict[str, Any]]:
    """Per successful request: codec, round, run (its entry's place), seconds since the run's first send,
    TTFT ms, and for a ramped run (``harness.loadgen.ramp``) its ramp, offered rate and codec µs."""
    rows = []
    for run, entry in enumerate(entries):
        records = (entry.doc or {}).get("records")
        if not isinstance(records, list):
            continue
        sends = [r.get("actual_send") for r in records if isinstance(r, dict)]
        finite = [s for s in sends if isinstance(s, (int, float)) and math.isfinite(s)]
        if not finite:
            continue
        start = min(finite)
        ramp = ramp_of(entry)
        for r in records:
            send, ttft = r.get("actual_send"), r.get("ttft")
            if not (r.get("success") and isinstance(send, (int, float)) and isinstance(ttft, (int, float))):
                continue
            row: dict[str, Any] = {"codec": entry.codec, "round": entry.round, "run": run}
            row.update(t_s=send - start, ttft_ms=ttft * 1e3)
            if ramp is not None:
                row.update({key: as_float(r.get(key)) for key in RAMP_RECORD_KEYS}, ramp=ramp)
            rows.append(row)
    return rows


RAMP_RECORD_KEYS = ("offered_rps", "codec_us", "codec_wire_us")  # what a ramped run's rows add


def ramp_of(entry: RunEntry) -> Ramp | None:
    """The load ramp a run file's flags record (--ramp-up-strategy), None without a usable one."""
    flags = ((entry.doc or {}).get("metadata") or {}).get("flags") or {}
    try:
        return ramp_from(flags.get("ramp_up_strategy"), flags.get("ramp_up_start_rps"), flags.get("ramp_up_end_rps"))
    except (ValueError, TypeError):
        return None


class _Request(NamedTuple):
    """A row of ``send_times`` as ``ramp.by_offered_rate`` reads a request."""

    offered_rps: float
    ttft: float  # seconds
    codec_us: float
    codec_wire_us: float
    success: bool = True


# What the ramp panels show per offered-rate bucket: (RateBucket field, title, unit).
RAMP_FIGURES = (
    ("ttft_p50_ms", "TTFT p50", "ms"),
    ("ttft_mean_ms", "TTFT mean", "ms"),
    ("codec_us", "Codec µs, first-token path", "µs"),
)


def ramp_points(rows: Sequence[dict[str, Any]], codecs: Sequence[str]) -> tuple[Ramp, list[dict[str, Any]]] | None:
    """A ramped run's figures per offered-rate bucket, shaped as a sweep's points (``sweep_plots``):
    per bucket and codec the t-interval over its runs of each run's bucket figure. None without a ramp;
    runs of another ramp than the first met are left out."""
    ramp = next((r["ramp"] for r in rows if r.get("ramp") is not None), None)
    if ramp is None:
        return None
    runs: dict[tuple[str, int], list[_Request]] = {}
    for r in rows:
        if r.get("ramp") == ramp:
            request = _Request(r["offered_rps"], r["ttft_ms"] / 1e3, r["codec_us"], r["codec_wire_us"])
            runs.setdefault((r["codec"], r["run"]), []).append(request)
    buckets = {key: by_offered_rate(requests, ramp) for key, requests in runs.items()}
    points = []
    for k, bucket in enumerate(next(iter(buckets.values()))):
        per_codec = {}
        for codec in codecs:
            mine = [bs[k] for (c, _), bs in buckets.items() if c == codec]
            if mine:
                figures = {key: interval([getattr(b, key) for b in mine]) for key, _, _ in RAMP_FIGURES}
                per_codec[codec] = {"figures": figures}
        points.append({"at": {"offered_rps": ramp.centre(bucket.low_rps, bucket.high_rps)}, "codecs": per_codec})
    return ramp, points


def timeline_figure(rows: Sequence[dict[str, Any]], codecs: Sequence[str]) -> Any | None:
    """TTFT against send time, one panel per codec, rounds overlaid, with a running median; for a ramped
    run, below them TTFT and the codec's µs against the offered rate (``ramp_points``)."""
    if not rows:
        return None
    plt = pyplot()
    present = [c for c in codecs if any(r["codec"] == c for r in rows)]
    ncols = min(3, len(present))
    nrows = math.ceil(len(present) / ncols)
    size = (4.4 * ncols, 3.4 * nrows)
    ramped = ramp_points(rows, codecs)
    if ramped is None:
        fig = plt.figure(figsize=size)
        _draw_timeline(fig, rows, codecs, present, ncols, nrows)
        fig.tight_layout()
        return fig
    ramp, points = ramped
    shown = [f for f in RAMP_FIGURES if _has_values(points, f[0])]
    ramp_height = 3.8
    fig = plt.figure(figsize=(max(size[0], 4.4 * len(shown)), size[1] + ramp_height), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=(size[1], ramp_height))
    _draw_timeline(top, rows, codecs, present, ncols, nrows)
    _draw_ramp(bottom, ramp, points, codecs, shown)
    return fig


def _has_values(points: Sequence[dict[str, Any]], key: str) -> bool:
    return any(row["figures"][key]["n"] for p in points for row in p["codecs"].values())


def _draw_timeline(
    container: Any,
    rows: Sequence[dict[str, Any]],
    codecs: Sequence[str],
    present: Sequence[str],
    ncols: int,
    nrows: int,
) -> None:
    import numpy as np

    axes = container.subplots(nrows, ncols, squeeze=False, sharey=True)
    colors = arm_colors(codecs)
    for i, codec in enumerate(present):
        ax = axes[i // ncols][i % ncols]
        mine = sorted((r for r in rows if r["codec"] == codec), key=lambda r: r["t_s"])
        rounds = sorted({r["round"] for r in mine if r["round"] is not None})
        ax.scatter([r["t_s"] for r in mine], [r["ttft_ms"] for r in mine], s=6, alpha=0.45, color=colors[codec], lw=0)
        ts = np.array([r["t_s"] for r in mine])
        ys = np.array([r["ttft_ms"] for r in mine])
        window = max(5, len(ys) // 20)
        if len(ys) >= window:
            med = [float(np.median(ys[max(0, k - window + 1) : k + 1])) for k in range(len(ys))]
            ax.plot(ts, med, color="black", lw=1.2, label=f"running median of {window}")
            ax.legend(fontsize=7, loc="upper right")
        ax.set_title(f"{codec} ({len(rounds) or 1} round{'s' if len(rounds) > 1 else ''} overlaid)", fontsize=10)
        ax.set_xlabel("send time since the run's first request (s)")
        if i % ncols == 0:
            ax.set_ylabel("TTFT (ms)")
        ax.grid(alpha=0.3)
    for j in range(len(present), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)


def _draw_ramp(
    container: Any,
    ramp: Ramp,
    points: Sequence[dict[str, Any]],
    codecs: Sequence[str],
    shown: Sequence[tuple[str, str, str]],
) -> None:
    """One panel per figure against the offered rate, drawn as a sweep's curves (mean over runs, t-interval)."""
    if not shown:
        return
    axes = container.subplots(1, len(shown), squeeze=False)[0]
    colors = arm_colors(codecs)
    for ax, (key, title, unit) in zip(axes, shown, strict=True):
        drawn = [codec for codec in codecs if _curve(ax, points, codec, key, _offered, colors[codec])]
        if ramp.strategy == EXPONENTIAL:
            ax.set_xscale("log")
        ax.set_title(f"{title}, by offered rate", fontsize=10)
        ax.set_xlabel("offered rate, bucket centre (req/s)")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.25)
        if drawn:
            ax.legend(fontsize=7)
    container.suptitle(
        f"{ramp.describe()}: each run's figure per offered-rate bucket, mean over runs (bars: t-interval)",
        fontsize=10,
    )


def _offered(point: dict[str, Any]) -> float:
    return float(point["at"]["offered_rps"])


# --- HTML pieces ----------------------------------------------------------------------------------
