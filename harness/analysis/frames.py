"""Saved results as pandas frames, for notebooks, plots and CI scripts.

The files are ``harness.analysis.documents``' (its docstring has their schema):

- a run file (``<codec>-r<round>-<stamp>.json``): benchmark_serving's field
  names, per-request ``records``, ``codec_figures``, ``metadata``;
- a compare file (``compare-<stamp>.json``), written by ``bench run`` and
  ``bench compare``: the arms, every run's status, ``result_file`` and
  figures, the side-by-side table and the verdicts.

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
import math
from typing import Any

import pandas as pd

from harness.analysis.documents import ALWAYS_COLUMNS, CODEC_US_COLUMNS, ResultsError, as_float, load_compare, load_run
from harness.analysis.runs import RunEntry, Source, collect_runs
from harness.loadgen.client import RequestRecord
from harness.loadgen.metrics import chunk_itls, request_tpot, token_itls

# Re-exported for notebooks: everything a reader needs comes from here.
__all__ = [
    "CODEC_US_COLUMNS",
    "ResultsError",
    "itls_frame",
    "load_compare",
    "load_run",
    "requests_frame",
    "runs_frame",
]


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
        if entry.figures is not None:  # from its run file, or embedded in a compact compare document
            row.update(entry.figures)
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
        # documents.jsonable wrote NaN as null; the dataclass wants floats.
        for key in ("planned_send", "dispatched", "actual_send", "ttft", "latency"):
            if key in fields:
                fields[key] = as_float(fields[key])
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
                    "prompt_tokens": as_float(rec.prompt_tokens),
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
                "ttft_ms": _ms(as_float(ttft)),
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
                    {"codec": entry.codec, "round": entry.round, "index": i, "itl_ms": _ms(as_float(g)), "per": "chunk"}
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
