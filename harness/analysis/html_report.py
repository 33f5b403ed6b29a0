"""``bench report RESULTS... -o report.html``: one self-contained HTML page of saved results.

RESULTS: compare files of ``bench run``/``bench compare`` (their run files are
followed), run files, folders of run files, and sweep documents of ``bench
sweep`` (``sweep-*.json``; a folder's sweep documents are picked up too). The
page needs nothing else: CSS inline, every plot a ``data:`` URI (PNG by
default, ``--image-format svg`` for vector plots), no script, no network.

Sections, and how each is made:

- **Comparison** (per compare file; runs given directly form one more): the
  side-by-side table (median over rounds ± half the range,
  ``harness.analysis.verdicts.median_cell``) and the verdicts of every arm against the
  first (``harness.analysis.verdicts.compare``: paired log ratios over rounds, 95% CI,
  the primary figure first, the others once it is resolved; ``method_line``). Arms whose
  settings differ (``harness.analysis.like_for_like``) get no verdict: the page is refused
  (``UnlikeArms``), or with ``unlike`` shows their figures under a note naming each difference.
- **Latency distributions**: the empirical CDF of per-request TTFT and TPOT per
  codec, every round pooled (``harness.analysis.frames.requests_frame``).
- **Codec and IPC budget**: codec µs per message per direction and operation
  from the server's /metrics (``runs_frame``, median over runs, whiskers min–max),
  and the IPC budget per arm from each run's ``ipc`` section (p50 of each span
  on the first-token path, median over rounds; ``figures.IPC_FIGURES``).
- **TTFT over the run**: each request's TTFT against its send time since the
  run's first send, one panel per codec, rounds overlaid, with a running
  median: warm-up and drift show as a slope.
- **Sweeps**: the curves of ``bench sweep`` (redrawn from the document) and
  where each codec crosses the reference, in words.
- **Run metadata**: machine, versions, git revision and the flags (those that
  differ between runs listed apart).

The sections are one ordered tuple, ``SECTIONS``, of ``Section(id, title,
render)``: ``render`` takes the ``ReportContext`` (the inputs, read once, and
what several sections share) and returns the section's HTML body. A new section
is a render function and one entry there; the page adds its heading and its
link in the navigation.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from harness.analysis import stats
from harness.analysis.documents import ResultsError, is_compare, read_json
from harness.analysis.figures import (
    IPC_FIGURES,
    SHOWN_FIGURES,
    Figure,
)
from harness.analysis.like_for_like import Difference, UnlikeArms, differences, not_judged_line, side_by_side
from harness.analysis.report_plots import budget_figure, cdf_figure, figure_uri, send_times, timeline_figure
from harness.analysis.runs import RunEntry, collect_runs, entries_of
from harness.analysis.sweep_plots import draw_e2e, draw_micro
from harness.analysis.sweep_stats import all_crossings
from harness.analysis.verdict_text import judge_arms
from harness.analysis.verdicts import Arm, arms_by_label, median_cell, method_line, summary_line

IMAGE_FORMATS = ("png", "svg")
VERDICT_CLASS = {
    "slower": "slower",
    "faster": "faster",
    "equivalent": "equivalent",
    "inconclusive": "inconclusive",
}
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1250px;
       padding: 0 1em; color: #1d1d1f; background: #fff; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 0.2em;
margin-top: 2em; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.85em; }
th, td { border: 1px solid #d0d0d0; padding: 0.25em 0.5em; text-align: right; vertical-align: top; }
th { background: #f3f3f3; } td.label, th.label { text-align: left; }
td.slower { background: #fde2e1; } td.faster { background: #dff5e1; }
td.equivalent { background: #eef1f5; } td.inconclusive { background: #fff5d6; }
td.slower, td.faster, td.equivalent, td.inconclusive { text-align: left; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; max-width: 1100px; }
.note { color: #555; font-size: 0.9em; } code, pre { font-size: 0.85em; background: #f6f6f6; }
pre { padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
nav a { margin-right: 1em; } ul.crossings li { margin: 0.2em 0; }
div.unlike { background: #fff5d6; border-left: 4px solid #e0a800; padding: 0.2em 0.8em; margin: 0.6em 0; }
.wide { overflow-x: auto; } table.kv td { text-align: left; } details summary { cursor: pointer; margin: 0.6em 0; }
"""


# --- inputs ---------------------------------------------------------------------------------------


@dataclass
class Inputs:
    """What the RESULTS arguments hold: run/compare sources, compare files, sweep documents."""

    runs: dict[str, list[RunEntry]] = field(default_factory=dict)  # per run/compare source, read once
    compares: list[str] = field(default_factory=list)
    direct: list[str] = field(default_factory=list)  # run files and folders (not compare files)
    sweeps: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)

    def entries(self, sources: Sequence[str] | None = None) -> list[RunEntry]:
        """The runs of these sources (default all), a run named by two of them once."""
        chosen = self.runs if sources is None else sources
        picked = [e for item in chosen for e in self.runs[item]]
        return collect_runs(picked) if picked else []


def classify(results: Sequence[str]) -> Inputs:
    """Sort the arguments; ResultsError for a missing path or a file that is none of the kinds."""
    out = Inputs()
    for item in results:
        path = Path(item)
        if path.is_dir():
            sweeps = sorted(path.glob("sweep-*.json"))
            for s in sweeps:
                doc = read_json(s)
                if doc.get("kind") == "sweep":
                    out.sweeps.append((s, _with_crossings(doc)))
            runs = _runs_in(path)
            if runs:
                out.runs[item] = runs
                out.direct.append(item)
            elif not sweeps:
                raise ResultsError(f"{path}: no run files and no sweep documents in this folder")
            continue
        doc = read_json(path)
        if doc.get("kind") == "sweep":
            out.sweeps.append((path, _with_crossings(doc)))
        else:
            out.runs[item] = entries_of(path, doc)  # the file is read once
            (out.compares if is_compare(doc) else out.direct).append(item)
    return out


def _runs_in(folder: Path) -> list[RunEntry]:
    try:
        return collect_runs(folder)
    except ResultsError:
        return []


# --- plots ----------------------------------------------------------------------------------------


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def img(uri: str, alt: str, caption: str) -> str:
    return f'<figure><img src="{uri}" alt="{esc(alt)}"><figcaption>{esc(caption)}</figcaption></figure>'


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    classes: Sequence[Sequence[str]] | None = None,
    kind: str = "",
) -> str:
    """An HTML table (escaped), in a box that scrolls sideways when it is wider than the page."""
    head = "".join(f'<th class="{"label" if i == 0 else ""}">{esc(h)}</th>' for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        cells = []
        for i, value in enumerate(row):
            cls = ["label"] if i == 0 else []
            if classes is not None and classes[r][i]:
                cls.append(classes[r][i])
            cells.append(f'<td class="{" ".join(cls)}">{esc(value)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    attr = f' class="{kind}"' if kind else ""
    return f'<div class="wide"><table{attr}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def comparison_html(
    title: str, arms: list[Arm], margin_pct: float, unlike: Sequence[Difference] = ()
) -> tuple[str, str]:
    """(section html, one summary line) for one set of arms; arms whose settings differ (``unlike``)
    are shown side by side under a note that says so, without verdicts."""
    if unlike:
        return unlike_html(title, arms, unlike)
    comparison, full = judge_arms(arms, margin_pct)  # as bench run judges them
    parts = figures_html(title, arms, full.figures)
    if comparison is None or not comparison.cells:
        parts.append('<p class="note">One measured arm: nothing to judge.</p>')
        return "\n".join(parts), f"{title}: one measured arm, no verdicts"
    others = comparison.arms[1:]
    vrows, vclasses = [], []
    for fig in comparison.figures:
        row: list[str] = [fig.label]
        cls = [""]
        for arm in others:
            cell = comparison.cell(arm.label, fig.key)
            row.append(cell.verdict.text if cell else "-")
            cls.append(VERDICT_CLASS.get(cell.verdict.verdict, "") if cell else "")
        vrows.append(row)
        vclasses.append(cls)
    parts.append(
        f"<p>Verdicts against <b>{esc(comparison.reference.label)}</b>: change of the other arm; "
        f"{esc(method_line(comparison))}.</p>"
    )
    parts.append(table(["figure", *(a.label for a in others)], vrows, vclasses))
    summary = summary_line(comparison)
    parts.append(f"<p>In all: {esc(summary)}.</p>")
    return "\n".join(parts), f"{title}: {summary}"


def figures_html(title: str, arms: list[Arm], judged: Sequence[Figure]) -> list[str]:
    """The heading and the side-by-side table of one set of arms, and the arms that measured nothing."""
    figures: list[Figure] = [*judged, *(f for f in SHOWN_FIGURES if f not in judged)]
    rows = [[a.label, len(a.measured), *(median_cell(a, f.key) for f in figures)] for a in arms]
    parts = [f"<h3>{esc(title)}</h3>", table(["arm", "rounds", *(f.label for f in figures)], rows)]
    parts.append(
        '<p class="note">Median over rounds ± half the range; ms unless marked µs (codec µs per message '
        "from the server's /metrics).</p>"
    )
    failed = [f"{a.label}: {r.status}: {r.message}" for a in arms if not a.measured for r in a.runs[:1]]
    if failed:
        parts.append("<ul>" + "".join(f"<li>{esc(t)}</li>" for t in failed) + "</ul>")
    return parts


def unlike_html(title: str, arms: list[Arm], unlike: Sequence[Difference]) -> tuple[str, str]:
    """Arms whose settings differ: their figures and what differs, no verdict (bench report --unlike)."""
    header = not_judged_line(unlike)
    note = [f'<div class="unlike"><p><b>{esc(header)}</b>: their figures are shown, not compared.</p>']
    note.append("<ul>" + "".join(f"<li>{esc(d.text)}</li>" for d in unlike) + "</ul></div>")
    parts = figures_html(title, arms, side_by_side(arms).figures)
    parts[1:1] = note  # under the heading, above the table
    return "\n".join(parts), f"{title}: {header}"


def ipc_table(arms: list[Arm]) -> str:
    if not any(math.isfinite(v) for a in arms for v in a.values("ipc_ipc_mean_us")):
        return '<p class="note">No IPC budget: the runs carry no request timelines (server without spans).</p>'
    rows = [[a.label, *(median_cell(a, f.key) for f in IPC_FIGURES)] for a in arms if a.measured]
    return (
        table(["arm", *(f.label for f in IPC_FIGURES)], rows)
        + '<p class="note">IPC budget, µs: p50 over each run\'s requests on the first-token path, median over '
        "rounds; wire = send → receive; IPC mean = the sum on a request's path to its first token.</p>"
    )


def _with_crossings(doc: dict[str, Any]) -> dict[str, Any]:
    """A sweep document with its crossings (an interrupted sweep saved none): the section and the summary
    read the same ones."""
    return doc if doc.get("crossings") else {**doc, "crossings": all_crossings(doc)}


def sweep_html(path: Path, doc: dict[str, Any], fmt: str) -> str:

    parts = [f"<h3>{esc(path.name)}</h3>"]
    axes = ", ".join(
        f"{a['label']} {', '.join(f'{v:g}' for v in a['values'])} {a['unit']}" for a in doc.get("axes") or ()
    )
    parts.append(
        f"<p>Codecs {esc(', '.join(doc.get('codecs') or ()))} (reference {esc(doc.get('reference'))}); "
        f"axes: {esc(axes)}; wall time {esc(_num(doc.get('wall_s')))} s"
        + ("; <b>interrupted</b>" if doc.get("interrupted") else "")
        + "</p>"
    )
    for part, draw, caption in (
        (
            "micro",
            draw_micro,
            "Codec cost (encode p50 + decode p50) and delivery per message against payload bytes, log–log, "
            "with one memcpy of the same bytes; mean over interleaved rounds with its 95% t-interval.",
        ),
        (
            "e2e",
            draw_e2e,
            "TTFT p50, TTFT p99 and TPOT mean per codec at each grid point (bench run per point, fresh server "
            "per codec and round); mean over rounds with its 95% t-interval.",
        ),
    ):
        fig = draw(doc)
        if fig is not None:
            parts.append(img(figure_uri(fig, fmt), f"sweep {part} curves", caption))
        lines = [c["text"] for c in doc["crossings"] if c["part"] == part]
        if lines:
            parts.append('<ul class="crossings">' + "".join(f"<li>{esc(t)}</li>" for t in lines) + "</ul>")
    return "\n".join(parts)


def _num(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


METADATA_KEYS = ("hostname", "cpu_model", "cpu_count", "cpu_usable", "machine", "platform", "gpu", "python")


def metadata_html(entries: Sequence[RunEntry], sweeps: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    metas: list[tuple[dict[str, Any], RunEntry | None]] = [
        ((e.doc or {}).get("metadata") or {}, e) for e in entries if e.doc is not None
    ]
    metas += [(doc.get("metadata") or {}, None) for _, doc in sweeps]
    if not metas:
        return '<p class="note">No run file with metadata (compact baselines carry figures only).</p>'
    machines: dict[str, list[str]] = {}
    for meta, entry in metas:
        facts = {k: meta.get(k) for k in METADATA_KEYS if k in meta}
        facts["libraries"] = meta.get("libraries")
        facts["git"] = meta.get("git")
        key = json.dumps(facts, sort_keys=True, default=str)
        machines.setdefault(key, []).append(_run_name(entry))
    parts = []
    for key, runs in machines.items():
        facts = json.loads(key)
        rows = [[k, v] for k, v in facts.items() if k not in ("libraries", "git") and v is not None]
        for lib, version in (facts.get("libraries") or {}).items():
            rows.append([lib, version])
        git = facts.get("git") or {}
        if git:
            rows.append(["git revision", f"{git.get('commit')}{' (dirty)' if git.get('dirty') else ''}"])
        parts.append(f"<h3>Machine and versions ({len(runs)} document{'s' if len(runs) != 1 else ''})</h3>")
        parts.append(table(["", ""], [[str(k), _short_value(v)] for k, v in rows], kind="kv"))
    flags = [((meta.get("flags") or {}), entry) for meta, entry in metas if isinstance(meta.get("flags"), dict)]
    if flags:
        keys = sorted({k for f, _ in flags for k in f})
        common: list[str] = []
        differing: list[str] = []
        for k in keys:
            values = {json.dumps(f.get(k), sort_keys=True, default=str) for f, _ in flags}
            (common if len(values) == 1 else differing).append(k)
        parts.append("<h3>Flags</h3>")
        if differing:
            parts.append("<p>Flags that differ between documents:</p>")
            rows = [[_run_name(e), *(_short_value(f.get(k)) for k in differing)] for f, e in flags]
            parts.append(table(["document", *differing], rows, kind="kv"))
        parts.append(f"<details><summary>{len(common)} flags every document shares</summary>")
        parts.append(table(["flag", "value"], [[k, _short_value(flags[0][0].get(k))] for k in common], kind="kv"))
        parts.append("</details>")
    return "\n".join(parts)


def _run_name(entry: RunEntry | None) -> str:
    if entry is None:
        return "sweep document"
    return entry.path.name if entry.path else f"{entry.codec} round {entry.round}"


def _short_value(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the sections ---------------------------------------------------------------------------------


class ReportContext:
    """What every section renders from: the RESULTS arguments read once, and what several sections share."""

    def __init__(self, inputs: Inputs, fmt: str, margin_pct: float) -> None:
        self.inputs = inputs
        self.fmt = fmt
        self.margin_pct = margin_pct

    @cached_property
    def entries(self) -> list[RunEntry]:
        return self.inputs.entries()

    @cached_property
    def codecs(self) -> list[str]:
        return list(dict.fromkeys(e.codec for e in self.entries))

    @cached_property
    def arm_sets(self) -> list[tuple[str, list[Arm], list[Difference]]]:
        """(title, arms, the settings they differ in) of each comparison: one per compare file (the arms of
        one bench run, alike by construction: their arm flags differ on purpose), then one for the runs
        given directly, gathered from separate runs."""
        out: list[tuple[str, list[Arm], list[Difference]]] = [
            (Path(item).name, arms_by_label(self.inputs.runs[item]), []) for item in self.inputs.compares
        ]
        if self.inputs.direct:
            name = "runs given directly: " + ", ".join(Path(d).name for d in self.inputs.direct)
            arms = arms_by_label(self.inputs.entries(self.inputs.direct))
            out.append((name, arms, differences(arms)))
        return out

    @cached_property
    def comparisons(self) -> list[tuple[str, str]]:
        """(html, summary line) of each set of arms; verdicts only where their settings agree."""
        return [comparison_html(title, arms, self.margin_pct, unlike) for title, arms, unlike in self.arm_sets]

    def unlike_lines(self) -> list[str]:
        """Each difference of settings within a set of arms, named with its set."""
        return [f"[{title}] {d.text}" for title, _, unlike in self.arm_sets for d in unlike]


@dataclass(frozen=True)
class Section:
    """One section of the page: its anchor, its heading, and the function that writes its body."""

    id: str
    title: str
    render: Callable[[ReportContext], str]


NO_RUNS = '<p class="note">No run files given.</p>'


def render_summary(ctx: ReportContext) -> str:
    lines = [line for _, line in ctx.comparisons]
    for p, d in ctx.inputs.sweeps:
        crossings = [c for c in d.get("crossings") or () if c.get("verdict")]
        plural = "s" if len(crossings) != 1 else ""
        lines.append(f"{p.name}: {len(crossings)} crossing{plural} (Holm-adjusted verdicts)")
    if not lines:
        return '<p class="note">Nothing to summarise.</p>'
    return "<ul>" + "".join(f"<li>{esc(s)}</li>" for s in lines) + "</ul>"


def render_comparison(ctx: ReportContext) -> str:
    return "\n".join(body for body, _ in ctx.comparisons) or '<p class="note">No compare or run files given.</p>'


def render_distributions(ctx: ReportContext) -> str:
    from harness.analysis.frames import requests_frame

    if not ctx.entries:
        return NO_RUNS
    fig = cdf_figure(requests_frame(ctx.entries), ctx.codecs)
    if fig is None:
        return '<p class="note">No per-request records.</p>'
    return img(
        figure_uri(fig, ctx.fmt),
        "CDF of TTFT and TPOT per codec",
        "Empirical CDF of each successful request's TTFT (send → first output chunk) and TPOT "
        "((E2EL − TTFT) / (output tokens − 1)), every round pooled; dotted lines at p50 and p99. "
        "From harness.analysis.frames.requests_frame.",
    )


def render_budget(ctx: ReportContext) -> str:
    from harness.analysis.frames import runs_frame

    if not ctx.entries:
        return NO_RUNS
    fig = budget_figure(runs_frame(ctx.entries), ctx.codecs)
    if fig is None:
        bars = '<p class="note">No codec figures (a server without wirebench /metrics).</p>'
    else:
        bars = img(
            figure_uri(fig, ctx.fmt),
            "codec and IPC budget per codec",
            "Left: codec µs per message per direction and operation from the server's /metrics "
            "(runs_frame; median over runs, whiskers min–max). Right: the IPC budget on a request's "
            "first-token path, p50 of each span (encode, wire = send → receive, decode, queues) from the "
            "run's request timelines, median over rounds.",
        )
    return bars + ipc_table(arms_by_label(ctx.entries))


def render_timeline(ctx: ReportContext) -> str:
    if not ctx.entries:
        return NO_RUNS
    fig = timeline_figure(send_times(ctx.entries), ctx.codecs)
    if fig is None:
        return '<p class="note">No per-request send times (files without records).</p>'
    return img(
        figure_uri(fig, ctx.fmt),
        "TTFT over the course of each run",
        "Each request's TTFT against its send time since the run's first request, rounds overlaid, "
        "with a running median: a falling start is warm-up, a slope is drift.",
    )


def render_sweeps(ctx: ReportContext) -> str:
    if not ctx.inputs.sweeps:
        return '<p class="note">No sweep document given (bench sweep writes sweep-*.json).</p>'
    return "\n".join(sweep_html(p, d, ctx.fmt) for p, d in ctx.inputs.sweeps)


def render_metadata(ctx: ReportContext) -> str:
    return metadata_html(ctx.entries, ctx.inputs.sweeps)


# The page's sections, in order. A new section is a render function and one entry here; it gets
# its heading and its link in the page's navigation.
SECTIONS: tuple[Section, ...] = (
    Section("summary", "Summary", render_summary),
    Section("comparison", "Comparison and verdicts", render_comparison),
    Section("distributions", "Latency distributions", render_distributions),
    Section("budget", "Codec and IPC budget", render_budget),
    Section("timeline", "TTFT over the run", render_timeline),
    Section("sweeps", "Sweeps", render_sweeps),
    Section("metadata", "Run metadata", render_metadata),
)


# --- the page -------------------------------------------------------------------------------------


def build_report(
    results: Sequence[str],
    *,
    title: str = "wirebench report",
    fmt: str = "png",
    margin_pct: float = stats.DEFAULT_MARGIN_PCT,
    unlike: bool = False,
) -> str:
    """The whole page as a string; ResultsError when the inputs cannot be read, UnlikeArms when a set
    of arms differs in its settings and ``unlike`` (show them without verdicts) was not given."""
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"image format must be one of {', '.join(IMAGE_FORMATS)}")
    ctx = ReportContext(classify(results), fmt, margin_pct)
    if not unlike and (found := ctx.unlike_lines()):
        raise UnlikeArms(found)
    return page(title, [str(r) for r in results], [(section, section.render(ctx)) for section in SECTIONS])


def page(title: str, results: Sequence[str], sections: Sequence[tuple[Section, str]]) -> str:
    nav = "".join(f'<a href="#{s.id}">{esc(s.title)}</a>' for s, _ in sections)
    body = "\n".join(f'<section id="{s.id}">\n<h2>{esc(s.title)}</h2>\n{html}\n</section>' for s, html in sections)
    made = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>{esc(title)}</h1>
<p class="note">Made by <code>bench report</code> on {esc(made)} from {esc(", ".join(results))}.
Self-contained: no script, no network.</p>
<nav>{nav}</nav>
{body}
</body>
</html>
"""
