"""Reading saved results into pandas, for notebooks, plots and CI scripts.

Two kinds of file come out of ``bench load`` / ``bench run``:

- a run file (``<codec>-r<round>-<stamp>.json``), written by
  ``harness.loadgen.report.result_to_dict``: benchmark_serving's field names,
  per-request ``records``, ``codec_figures``, ``metadata``;
- a compare file (``compare-<stamp>.json``), written by ``bench run``: the
  codecs, every run's status and ``result_file``, and the side-by-side table.

Every loader here accepts a *source*: a compare file (its ``result_file``
paths are followed), a run file, a folder (every run file in it; compare files
and other JSON there are skipped), or a list mixing those. Bad input raises
``ResultsError`` with a message naming the file.

Column definitions are the ones of ``harness.loadgen.metrics`` (its module
docstring); the per-request figures are computed with that module's own
functions (``request_tpot``, ``token_itls``, ``chunk_itls``), so a frame's
mean agrees with the run file's summary.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.loadgen.client import RequestRecord
from harness.loadgen.metrics import METRICS, chunk_itls, request_tpot, token_itls

PathLike = str | os.PathLike[str]
# One file or folder, or several.
Source = PathLike | Iterable[PathLike]

# Codec figure columns of runs_frame, in bench run's naming (request_encode_us, ...).
DIRECTIONS = ("request", "output")
DIRECTION_FIELDS = ("encode_us", "decode_us", "bytes_per_message", "frames_per_message", "messages")
CODEC_US_COLUMNS = tuple(f"{d}_{op}_us" for d in DIRECTIONS for op in ("encode", "decode"))

# runs_frame always has these columns (NaN where unknown).
ALWAYS_COLUMNS = (
    "num_prompts",
    "completed",
    "failed",
    "duration_s",
    "request_throughput",
    "output_throughput",
    *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")),
    *CODEC_US_COLUMNS,
)

_ROUND_IN_NAME = re.compile(r"-r(\d+)-")


class ResultsError(ValueError):
    """A result file is missing, unreadable or not what it should be."""


# ------------------------------------------------------------------ files


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ResultsError(f"{path}: is a folder, expected a JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def is_compare(doc: dict[str, Any]) -> bool:
    return isinstance(doc.get("table"), dict) and isinstance(doc.get("runs"), list)


def is_run(doc: dict[str, Any]) -> bool:
    # benchmark_serving files have ttfts/completed too; wirebench's add records.
    return "records" in doc or ("ttfts" in doc and "completed" in doc)


def load_run(path: PathLike) -> dict[str, Any]:
    """One run file as a dict (exactly the JSON); ResultsError if it is not one."""
    p = Path(path)
    doc = _read_json(p)
    if is_compare(doc):
        raise ResultsError(f"{p}: is a compare file, not a run file (runs_frame/requests_frame accept it)")
    if not is_run(doc):
        raise ResultsError(f"{p}: not a run file (no 'records' nor benchmark_serving's 'ttfts'/'completed')")
    return doc


def load_compare(path: PathLike) -> dict[str, Any]:
    """One compare-*.json as a dict; ResultsError if it is not one."""
    p = Path(path)
    doc = _read_json(p)
    if not is_compare(doc):
        what = "a run file" if is_run(doc) else "not a compare file"
        raise ResultsError(f"{p}: {what}; expected the compare-*.json of `bench run` (keys 'table' and 'runs')")
    if not isinstance(doc.get("codecs"), list):
        doc["codecs"] = list(doc["table"])
    return doc


@dataclass
class RunEntry:
    """One run of a source: where its file is (None for a run that saved none) and what it is."""

    codec: str
    round: int | None
    status: str
    message: str
    path: Path | None
    doc: dict[str, Any] | None


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
    codec = doc.get("codec") or flags.get("codec") or "unknown"
    rnd = flags.get("round")
    if rnd is None:
        match = _ROUND_IN_NAME.search(path.name)
        rnd = int(match.group(1)) if match else None
    return RunEntry(str(codec), rnd, _run_status(doc), "", path, doc)


def _run_status(doc: dict[str, Any]) -> str:
    """bench run's status words, for a run file read on its own."""
    if doc.get("interrupted"):
        return "interrupted"
    return "failures" if doc.get("failed") else "ok"


def _entries_from_compare(path: Path, doc: dict[str, Any]) -> list[RunEntry]:
    entries = []
    for i, run in enumerate(doc["runs"]):
        if not isinstance(run, dict) or "codec" not in run:
            raise ResultsError(f"{path}: runs[{i}] is not a run entry (no 'codec')")
        file = run.get("result_file")
        run_path = resolve_result_file(file, path) if file else None
        run_doc = load_run(run_path) if run_path else None
        entries.append(
            RunEntry(
                str(run["codec"]),
                run.get("round"),
                str(run.get("status") or "ok"),
                str(run.get("message") or ""),
                run_path,
                run_doc,
            )
        )
    return entries


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
        p = Path(item)
        if p.is_dir():
            for child in sorted(p.glob("*.json")):
                if child.name.startswith("."):
                    continue
                doc = _read_json(child)
                if is_run(doc) and not is_compare(doc):
                    add(_entry_from_run(child, doc))
            continue
        doc = _read_json(p)
        if is_compare(doc):
            for entry in _entries_from_compare(p, doc):
                add(entry)
        elif is_run(doc):
            add(_entry_from_run(p, doc))
        else:
            raise ResultsError(f"{p}: neither a run file nor a compare file")
    return entries


# ------------------------------------------------------------------ frames


def _num(value: Any) -> float:
    """A JSON figure as a float: null → NaN, "inf"/"-inf" → ±inf."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _run_figures(doc: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {
        "num_prompts": _num(doc.get("num_prompts")),
        "completed": _num(doc.get("completed")),
        "failed": _num(doc.get("failed")),
        "duration_s": _num(doc.get("duration")),
        "request_rate": _num(doc.get("request_rate")),
    }
    for key in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput"):
        out[key] = _num(doc.get(key))
    metrics = doc.get("metrics")
    for name in METRICS:
        stats = metrics.get(name) if isinstance(metrics, dict) else None
        if isinstance(stats, dict):
            # {"mean_ms", "median_ms", "std_ms", "p99_ms", ...} → mean_ttft_ms, ...
            for key, value in stats.items():
                if key.endswith("_ms"):
                    out[f"{key[:-3]}_{name}_ms"] = _num(value)
        else:
            # benchmark_serving's flat keys, present for the selected metrics only.
            prefix = re.compile(rf"^(mean|median|std|p[\d.]+)_{name}_ms$")
            for key, value in doc.items():
                if prefix.match(key):
                    out[key] = _num(value)
    for which in ("schedule_lag", "dispatch_lag"):
        lag = doc.get(which)
        if isinstance(lag, dict):
            for key in ("mean_ms", "p99_ms", "max_ms"):
                out[f"{which}_{key}"] = _num(lag.get(key))
    codec = doc.get("codec_figures")
    if isinstance(codec, dict):
        for direction in DIRECTIONS:
            figures = codec.get(direction) or {}
            for key in DIRECTION_FIELDS:
                out[f"{direction}_{key}"] = _num(figures.get(key))  # request_encode_us, ...
        out["first_token_path_us"] = _num(codec.get("first_token_path_us"))
        out["ttft_share"] = _num(codec.get("ttft_share"))
    return out


def runs_frame(source: Source) -> pd.DataFrame:
    """One row per run: codec, round, status, message, file, then the run's figures.

    Figures (NaN when the file lacks them, e.g. a run that saved no file):
    ``num_prompts, completed, failed, duration_s, request_rate``; the
    throughputs (``request_throughput``, ``request_goodput``,
    ``output_throughput``, ``total_token_throughput``); for each metric of
    ``harness.loadgen.metrics.METRICS`` (ttft, tpot, itl, chunk_itl, e2el)
    ``mean_<m>_ms, median_<m>_ms, std_<m>_ms`` and every saved percentile
    ``p<P>_<m>_ms``; ``schedule_lag_{mean,p99,max}_ms`` and the same for
    ``dispatch_lag``; codec cost per message from the server's /metrics,
    per direction d in (request, output): ``d_encode_us, d_decode_us,
    d_bytes_per_message, d_frames_per_message, d_messages``; then
    ``first_token_path_us`` and ``ttft_share`` (see serverstats.CodecFigures).
    The columns of ``ALWAYS_COLUMNS`` exist even when no file has them.
    """
    rows = []
    for entry in collect_runs(source):
        row: dict[str, Any] = {
            "codec": entry.codec,
            "round": entry.round,
            "status": entry.status,
            "message": entry.message,
            "file": str(entry.path) if entry.path else None,
        }
        if entry.doc is not None:
            row.update(_run_figures(entry.doc))
        rows.append(row)
    frame = pd.DataFrame(rows)
    for column in ALWAYS_COLUMNS:  # so code can rely on them; NaN when no file has them
        if column not in frame:
            frame[column] = math.nan
    for column in ("round", "num_prompts", "completed", "failed"):
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    return frame


def _records(entry: RunEntry) -> list[RequestRecord] | None:
    """The run's successful requests as RequestRecords, or None when the file has no records."""
    assert entry.doc is not None
    raw = entry.doc.get("records")
    if not isinstance(raw, list):
        return None
    names = {f.name for f in dataclasses.fields(RequestRecord)}
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ResultsError(f"{entry.path}: records[{i}] is not an object")
        if not item.get("success"):
            continue
        fields = {k: v for k, v in item.items() if k in names}
        # report.jsonable wrote NaN as null; the dataclass wants floats.
        for key in ("planned_send", "dispatched", "actual_send", "ttft", "latency"):
            if key in fields:
                fields[key] = _num(fields[key])
        try:
            out.append(RequestRecord(**fields))
        except TypeError as exc:
            raise ResultsError(f"{entry.path}: records[{i}]: {exc}") from None
    return out


def _ms(seconds: float | None) -> float:
    return math.nan if seconds is None else seconds * 1000.0


def requests_frame(source: Source) -> pd.DataFrame:
    """One row per successful request of every run in the source.

    Columns (definitions of harness/loadgen/metrics.py; times in ms):

    - ``codec``, ``round``, ``index`` (the request's position in the workload), ``file``;
    - ``ttft_ms``: actual send → first chunk carrying output (record ``ttft``);
    - ``tpot_ms``: ``(E2EL − TTFT) / (output_tokens − 1)`` (``metrics.request_tpot``),
      NaN for a request with at most one output token;
    - ``e2el_ms``: actual send → ``data: [DONE]`` (record ``latency``);
    - ``output_tokens``: tokens generated (as counted by the client from usage);
    - ``prompt_len``: the workload's prompt length (what metrics counts as input);
    - ``prompt_tokens``: the server's usage count, NaN when it sent none;
    - ``chunks``: output-carrying chunks received;
    - ``schedule_lag_ms``: actual − planned send (``RequestRecord.schedule_lag``).

    A run file without ``records`` (benchmark_serving's own files) gives
    ttft_ms, output_tokens and prompt_len from ``ttfts``/``output_lens``/
    ``input_lens`` and NaN elsewhere.
    """
    rows = []
    for entry in collect_runs(source):
        if entry.doc is None:
            continue
        records = _records(entry)
        if records is None:
            rows += _rows_without_records(entry)
            continue
        for rec in records:
            rows.append(
                {
                    "codec": entry.codec,
                    "round": entry.round,
                    "index": rec.index,
                    "ttft_ms": _ms(rec.ttft),
                    "tpot_ms": _ms(request_tpot(rec)),
                    "e2el_ms": _ms(rec.latency),
                    "output_tokens": rec.output_tokens,
                    "prompt_len": rec.prompt_len,
                    "prompt_tokens": _num(rec.prompt_tokens),
                    "chunks": len(rec.chunk_times),
                    "schedule_lag_ms": _ms(rec.schedule_lag),
                    "file": str(entry.path),
                }
            )
    return _frame(rows, REQUEST_COLUMNS)


REQUEST_COLUMNS = (
    "codec",
    "round",
    "index",
    "ttft_ms",
    "tpot_ms",
    "e2el_ms",
    "output_tokens",
    "prompt_len",
    "prompt_tokens",
    "chunks",
    "schedule_lag_ms",
    "file",
)


def _rows_without_records(entry: RunEntry) -> list[dict[str, Any]]:
    doc = entry.doc or {}
    ttfts = doc.get("ttfts") or []
    inputs = doc.get("input_lens") or []
    outputs = doc.get("output_lens") or []
    rows = []
    for i, ttft in enumerate(ttfts):
        if ttft is None:  # a failed request
            continue
        rows.append(
            {
                "codec": entry.codec,
                "round": entry.round,
                "index": i,
                "ttft_ms": _ms(_num(ttft)),
                "tpot_ms": math.nan,
                "e2el_ms": math.nan,
                "output_tokens": outputs[i] if i < len(outputs) else math.nan,
                "prompt_len": inputs[i] if i < len(inputs) else math.nan,
                "prompt_tokens": math.nan,
                "chunks": math.nan,
                "schedule_lag_ms": math.nan,
                "file": str(entry.path),
            }
        )
    return rows


def itls_frame(source: Source, per: str = "token") -> pd.DataFrame:
    """Long frame of inter-token latencies: codec, round, index, itl_ms, per.

    ``per="token"``: metric ``itl`` of metrics.py (a chunk of k tokens gives k
    samples of gap/k, ``metrics.token_itls``); ``per="chunk"``: metric
    ``chunk_itl`` (one gap per chunk, ``metrics.chunk_itls``, the run file's
    ``itls``). A file without records has only chunk gaps (its ``itls``):
    those rows say ``per="chunk"`` whatever was asked.
    """
    if per not in ("token", "chunk"):
        raise ValueError(f"per must be 'token' or 'chunk', got {per!r}")
    rows = []
    for entry in collect_runs(source):
        if entry.doc is None:
            continue
        records = _records(entry)
        if records is None:
            for i, gaps in enumerate(entry.doc.get("itls") or []):
                rows += [
                    {"codec": entry.codec, "round": entry.round, "index": i, "itl_ms": _ms(_num(g)), "per": "chunk"}
                    for g in gaps or []
                ]
            continue
        for rec in records:
            gaps = token_itls(rec.chunk_times, rec.chunk_tokens) if per == "token" else chunk_itls(rec.chunk_times)
            rows += [
                {"codec": entry.codec, "round": entry.round, "index": rec.index, "itl_ms": g * 1000.0, "per": per}
                for g in gaps
            ]
    return _frame(rows, ("codec", "round", "index", "itl_ms", "per"))


def _frame(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    frame["round"] = frame["round"].astype("Int64")
    return frame
