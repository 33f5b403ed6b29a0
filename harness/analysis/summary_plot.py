"""One PNG of saved runs at a glance (``bench report --png``): per arm, box plots of per-request TTFT and
TPOT and of per-token ITL (``harness.loadgen.metrics``' ``itl``: a chunk of k tokens gives k samples), all
rounds pooled, beside the codec's µs per message per direction (median over runs, whiskers min to max)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.analysis.documents import ResultsError
from harness.analysis.frames import itls_frame, requests_frame, runs_frame
from harness.analysis.plots import pyplot
from harness.analysis.report_plots import codec_columns, draw_codec_bars

ITL_CLIP_PCT = 99.0  # the ITL panel's linear axis stops a little above this percentile


def _box(
    ax: Any,
    frame: Any,
    column: str,
    codecs: Sequence[str],
    title: str,
    log: bool,
    clip_pct: float | None = None,
) -> None:
    """One box per arm; with clip_pct (linear scale only) the y axis stops a little above that percentile
    and the samples beyond it are counted on the plot, so a long tail does not flatten the boxes into lines."""
    import numpy as np

    data, labels = [], []
    for codec in codecs:
        values = frame.loc[frame["codec"] == codec, column].dropna()
        data.append(values.to_numpy())
        labels.append(f"{codec}\nn={len(values)}")
    ax.set_title(title)
    ax.set_ylabel("ms")
    ax.grid(axis="y", alpha=0.3)
    if not any(len(d) for d in data):
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        return
    # Labels set apart: boxplot's keyword was renamed in matplotlib 3.9 (labels → tick_labels).
    ax.boxplot(
        data,
        showmeans=True,
        flierprops={"markersize": 3, "alpha": 0.5},
        meanprops={"marker": "^", "markerfacecolor": "white", "markeredgecolor": "black"},
    )
    ax.set_xticks(range(1, len(labels) + 1), labels)
    if log:
        ax.set_yscale("log")
        return
    if clip_pct is None:
        return
    top = 1.15 * max(float(np.percentile(d, clip_pct)) for d in data if len(d))
    if not any(len(d) and d.max() > top for d in data):
        return
    low = min(float(d.min()) for d in data if len(d))
    ax.set_ylim(bottom=min(0.0, low) - 0.02 * top, top=top)
    for i, d in enumerate(data, 1):
        above = d[d > top] if len(d) else d
        if len(above):
            ax.annotate(
                f"+{len(above)} above, max {above.max():.3g} ms",
                (i, top),
                xytext=(0, -4),
                textcoords="offset points",
                ha="center",
                va="top",
                fontsize="small",
                color="dimgray",
            )
    ax.set_title(f"{title} (y axis cut above p{clip_pct:g}; --log-scale shows all)")


def summary_figure(sources: Sequence[str], log: bool = False) -> Any:
    """The four panels as one matplotlib figure; ResultsError when no request succeeded."""
    runs = runs_frame(list(sources))
    requests = requests_frame(list(sources))
    itls = itls_frame(list(sources), per="token")
    if requests.empty:
        raise ResultsError("no successful request in the given results: nothing to plot")
    codecs = list(dict.fromkeys(runs["codec"]))
    itl_kind = "per token" if (itls["per"] == "token").all() else "per chunk (no records saved)"

    fig, axes = pyplot().subplots(2, 2, figsize=(12, 9))
    _box(axes[0, 0], requests, "ttft_ms", codecs, "TTFT per request", log)
    _box(axes[0, 1], requests, "tpot_ms", codecs, "TPOT per request", log)
    _box(axes[1, 0], itls, "itl_ms", codecs, f"ITL {itl_kind}", log, clip_pct=ITL_CLIP_PCT)
    columns = codec_columns(runs)
    if columns:
        draw_codec_bars(axes[1, 1], runs, codecs, columns)
    else:
        ax = axes[1, 1]
        ax.text(
            0.5,
            0.5,
            "no codec figures\n(server without wirebench /metrics)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_title("Codec cost per message")
    rounds = runs.groupby("codec").size()
    fig.suptitle(
        "wirebench: "
        + ", ".join(f"{c} ({rounds.get(c, 0)} run{'s' if rounds.get(c, 0) != 1 else ''})" for c in codecs)
        + "; rounds pooled; box = quartiles, ▲ = mean"
    )
    fig.tight_layout()
    return fig


def save_summary_png(sources: Sequence[str], out: Path, log: bool = False) -> Path:
    """Draw the summary of ``sources`` (compare files, run files, folders of run files) into the PNG ``out``."""
    fig = summary_figure(sources, log)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    return out
