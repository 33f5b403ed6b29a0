#!/usr/bin/env python
"""Plot per-request latencies and codec costs of saved runs, one PNG.

    scripts/plot_results.py RESULTS... [--out PNG] [--log]

RESULTS: compare-*.json files of ``bench run`` (their run files are
followed), run files, or folders of run files. Panels: box plots per codec of
per-request TTFT and TPOT and of per-token ITL (metrics.py's ``itl``: a chunk
of k tokens gives k samples), all rounds pooled; and a bar chart of the
codec's µs per message per direction and operation (median over runs, the
whiskers span min to max). Prints the PNG's path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from harness.analysis.frames import CODEC_US_COLUMNS, ResultsError, itls_frame, requests_frame, runs_frame  # noqa: E402

BAR_LABELS = {
    "request_encode_us": "request encode (frontend)",
    "request_decode_us": "request decode (engine)",
    "output_encode_us": "output encode (engine)",
    "output_decode_us": "output decode (frontend)",
}


def default_out(first: Path) -> Path:
    """Next to the first input: compare-X.json → compare-X.png; a folder → folder/plot.png."""
    return first / "plot.png" if first.is_dir() else first.with_suffix(".png")


def _box(
    ax: plt.Axes,
    frame: pd.DataFrame,
    column: str,
    codecs: list[str],
    title: str,
    log: bool,
    clip_pct: float | None = None,
) -> None:
    """One box per codec; with clip_pct (linear scale only) the y axis stops a
    little above that percentile and the samples beyond it are counted on the
    plot, so a long tail does not flatten the boxes into lines."""
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
    ax.set_title(f"{title} (y axis cut above p{clip_pct:g}; --log shows all)")


def _bars(ax: plt.Axes, runs: pd.DataFrame, codecs: list[str]) -> None:
    columns = [c for c in CODEC_US_COLUMNS if c in runs and runs[c].notna().any()]
    if not columns:
        ax.text(
            0.5,
            0.5,
            "no codec figures\n(server without wirebench /metrics)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_title("Codec cost per message")
        return
    width = 0.8 / len(columns)
    for j, column in enumerate(columns):
        medians, lows, highs = [], [], []
        for codec in codecs:
            values = runs.loc[runs["codec"] == codec, column].dropna()
            mid = values.median() if len(values) else float("nan")
            medians.append(mid)
            lows.append(mid - values.min() if len(values) else 0.0)
            highs.append(values.max() - mid if len(values) else 0.0)
        xs = [i + (j - (len(columns) - 1) / 2) * width for i in range(len(codecs))]
        ax.bar(xs, medians, width, yerr=[lows, highs], capsize=3, label=BAR_LABELS.get(column, column))
    ax.set_xticks(range(len(codecs)), codecs)
    ax.set_title("Codec cost per message (median over runs, min–max)")
    ax.set_ylabel("µs per message")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)


def plot(sources: list[str], out: Path, log: bool = False) -> Path:
    runs = runs_frame(sources)
    requests = requests_frame(sources)
    itls = itls_frame(sources, per="token")
    if requests.empty:
        raise ResultsError("no successful request in the given results: nothing to plot")
    codecs = list(dict.fromkeys(runs["codec"]))
    itl_kind = "per token" if (itls["per"] == "token").all() else "per chunk (no records saved)"

    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    _box(axes[0, 0], requests, "ttft_ms", codecs, "TTFT per request", log)
    _box(axes[0, 1], requests, "tpot_ms", codecs, "TPOT per request", log)
    _box(axes[1, 0], itls, "itl_ms", codecs, f"ITL {itl_kind}", log, clip_pct=99)
    _bars(axes[1, 1], runs, codecs)
    rounds = runs.groupby("codec").size()
    fig.suptitle(
        "wirebench: "
        + ", ".join(f"{c} ({rounds.get(c, 0)} run{'s' if rounds.get(c, 0) != 1 else ''})" for c in codecs)
        + "; rounds pooled; box = quartiles, ▲ = mean"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="compare-*.json, run files or folders of run files")
    parser.add_argument(
        "--out", type=Path, default=None, help="PNG to write (default: next to the first input, same name with .png)"
    )
    parser.add_argument(
        "--log",
        action="store_true",
        help="log scale for the latency panels, for long tails (zero values are not drawn)",
    )
    args = parser.parse_args(argv)
    out = args.out or default_out(Path(args.results[0]))
    try:
        path = plot(args.results, out, log=args.log)
    except ResultsError as exc:
        print(f"plot_results: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
