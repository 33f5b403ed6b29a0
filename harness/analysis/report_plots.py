"""The HTML report's plots of runs: latency CDFs, the codec and IPC budget, send times over the run;
each a matplotlib figure, embedded by ``figure_uri`` as a data URI."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any

from harness.analysis.figures import CODEC_FIGURES, IPC_SPAN_FIGURES
from harness.analysis.plots import arm_colors, pyplot
from harness.analysis.runs import RunEntry

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
    """Per successful request: codec, round, seconds since the run's first send, TTFT ms."""
    rows = []
    for entry in entries:
        records = (entry.doc or {}).get("records")
        if not isinstance(records, list):
            continue
        sends = [r.get("actual_send") for r in records if isinstance(r, dict)]
        finite = [s for s in sends if isinstance(s, (int, float)) and math.isfinite(s)]
        if not finite:
            continue
        start = min(finite)
        for r in records:
            send, ttft = r.get("actual_send"), r.get("ttft")
            if not (r.get("success") and isinstance(send, (int, float)) and isinstance(ttft, (int, float))):
                continue
            rows.append({"codec": entry.codec, "round": entry.round, "t_s": send - start, "ttft_ms": ttft * 1e3})
    return rows


def timeline_figure(rows: Sequence[dict[str, Any]], codecs: Sequence[str]) -> Any | None:
    """TTFT against send time, one panel per codec, rounds overlaid, with a running median."""
    import numpy as np

    if not rows:
        return None
    plt = pyplot()
    present = [c for c in codecs if any(r["codec"] == c for r in rows)]
    ncols = min(3, len(present))
    nrows = math.ceil(len(present) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols, 3.4 * nrows), squeeze=False, sharey=True)
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
    fig.tight_layout()
    return fig


# --- HTML pieces ----------------------------------------------------------------------------------
