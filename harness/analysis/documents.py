"""Result documents: the run, compare, micro and sweep JSON files — their schema, writing and reading.

The one owner of what a result file holds. ``bench load``/``bench run`` write
run documents, ``bench run``/``bench compare`` compare documents, ``bench
micro --json`` micro documents, ``bench sweep`` sweep documents; ``harness.analysis.frames`` (pandas frames), ``bench
compare``, the CI gate and ``bench report`` read them through here.

Schema history (``schema_version`` in every document):

- run 1: vLLM benchmark_serving's field names for what both have, plus
  ``codec``, ``payload_kind``, ``failed``, per-request ``records``,
  ``codec_figures`` (from the server's /metrics), ``schedule_lag``,
  ``metadata`` (versions, machine, flags). Also read: benchmark_serving's own
  files (no ``records``). Later gained ``metadata.own_send_times`` (read by ``own_send_times``),
  ``failures`` (the failed requests counted by status and the server's message) and each record's
  ``status`` and ``error_message``, then each record's ``offered_rps`` (the rate offered at its
  send: a ramp's rate at that request, else ``--request-rate``), then each record's ``send_ns``
  (its send on CLOCK_MONOTONIC) and ``ipc.blocks`` (per figure, one value a block sent: the
  output steps' codec + wire placed in blocks by time, read by ``harness.analysis.blocks``).
- compare 1: ``codecs``, ``repeat``, ``runs`` (codec, round, status, message,
  ``result_file`` relative to the compare file), ``table`` (median and spread
  per figure), ``changes_vs_first``.
- compare 2: adds ``kind: "compare"``, each run's ``figures`` (so a compare
  document stands alone as a compact baseline, without run files; its
  ``result_file`` may be null), ``comparison`` (the verdicts of
  ``harness.analysis.verdicts``), ``metadata``; drops ``changes_vs_first``. Version 1
  files still load: their figures are read from their run files.
- micro 2: a JSON list, one object per codec × payload cell, each with the
  run's metadata (``micro_document``); with ``--transport``, then one object
  per delivery cell (``kind: "delivery"``). Delivery cells later gained, after their
  other keys, ``first_us`` (the first, untimed send) and ``encode_p50_us``,
  ``copy_p50_us``, ``notify_p50_us``, ``decode_p50_us`` (``harness.micro.delivery.PARTS``),
  then ``variant`` ("" or one of ``harness.transports.base.VARIANTS``): a cell's ``transport`` is
  now always a name ``bench serve`` takes. Older cells spelt a variant into it: ``shm-inplace``,
  ``torch-shm-inplace`` (variant ``in-place``), ``shm-bell`` (``bell``), ``shm-store-miss``
  (``store-miss``).
- calibrate: a compare 2 document (written by ``bench calibrate``) with a
  ``calibration`` summary beside it.
- instructions 2: ``kind: "instructions"``, ``calls``, ``layout_shifts`` (each cell the median over
  them, its ``per_layout`` counts beside it; 1 had one count per cell), ``metadata`` (versions, machine,
  valgrind), ``cells``: one per codec × payload × op with ``instructions`` per call
  (``bench micro --count instructions``; ``harness.analysis.instruction_counts``).
- gate-jobs 1: ``kind: "gate-jobs"``, the recipe, exit-code counts and per job the gate's
  primary verdict, paired SD and wall time (``scripts/studies/gate_rates/``).
- sweep 1: ``kind: "sweep"``, axes, payload bytes, the micro and e2e parts
  with per-point intervals and verdicts, crossings, plots
  (``harness/commands/sweep.py`` documents each field).

NaN is written as null and infinity as the string "inf" (``jsonable``), so
every document is strict JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.loadgen.guard import health_dict
from harness.loadgen.ipc import budget_figures
from harness.loadgen.metrics import METRICS, MetricStats, chunk_itls, percentile_key
from harness.loadgen.report import failure_counts
from harness.loadgen.runner import DEFAULT_RESULT_DIR, BenchmarkResult
from harness.loadgen.serverstats import CodecFigures
from harness.loadgen.sysinfo import collect_sysinfo
from harness.wire.spans import CODEC_WIRE_SPANS, STEP_CODEC_WIRE_SPANS, IpcBudget

if TYPE_CHECKING:  # the micro figures only; importing harness.micro would import torch
    from harness.micro.timing import DeliveryMeasurement, Measurement

# The one table of schema versions: kind → the version written now (the history is above).
SCHEMAS = {"run": 1, "compare": 2, "micro": 2, "sweep": 1, "instructions": 2, "gate-jobs": 1}
RUN_SCHEMA, COMPARE_SCHEMA, MICRO_SCHEMA, SWEEP_SCHEMA = (SCHEMAS[k] for k in ("run", "compare", "micro", "sweep"))
# harness.micro.delivery.PARTS's names (importing it here would import zmq and the codecs).
DELIVERY_PARTS = ("encode", "copy", "notify", "decode")


PathLike = str | os.PathLike[str]

# Codec figure columns of runs_frame, in bench run's naming (request_encode_us, ...).
DIRECTIONS = ("request", "output")
DIRECTION_FIELDS = (
    "encode_us",
    "decode_us",
    "encode_cpu_us",
    "decode_cpu_us",
    "bytes_per_message",
    "frames_per_message",
    "messages",
)
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


# ------------------------------------------------------------------ writing


def jsonable(value: Any) -> Any:
    """NaN → None, ±inf → "inf"/"-inf", tuples → lists, unknown objects → str."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def write_json(path: PathLike, doc: Any, indent: int | None = 1) -> Path:
    """Write strict JSON atomically (a reader never sees half a file)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(jsonable(doc), f, indent=indent, allow_nan=False)
        f.write("\n")
    os.replace(tmp, target)
    return target


def _stats_dict(stats: MetricStats) -> dict[str, Any]:
    out: dict[str, Any] = {
        "count": stats.count,
        "mean_ms": stats.mean,
        "median_ms": stats.median,
        "std_ms": stats.std,
    }
    for p, value in stats.percentiles.items():
        out[f"p{percentile_key(p)}_ms"] = value
    return out


def _codec_dict(figures: CodecFigures | None, mean_ttft_ms: float) -> dict[str, Any] | None:
    if figures is None:
        return None
    return {
        "codec": figures.codec,
        "request": dataclasses.asdict(figures.request),
        "output": dataclasses.asdict(figures.output),
        "first_token_path_us": figures.first_token_path_us,
        "ttft_share": figures.ttft_share(mean_ttft_ms),
        "cells": {f"{d}.{op}": dataclasses.asdict(cell) for (d, op), cell in figures.cells.items()},
        "mm_store": figures.mm_store,
        "mm_store_hit_pct": figures.mm_store_hit_pct,
    }


def _ipc_dict(budget: IpcBudget | None, mean_ttft_ms: float) -> dict[str, Any] | None:
    if budget is None:
        return None
    return {**budget.to_dict(), "share_of_ttft": budget.share_of_ttft(mean_ttft_ms)}


def run_document(result: BenchmarkResult, sysinfo: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of one run (already JSON-safe)."""
    m = result.metrics
    s = result.settings
    records = result.records
    doc: dict[str, Any] = {
        "schema_version": RUN_SCHEMA,
        "date": result.started_at.strftime("%Y%m%d-%H%M%S"),
        "started_at": result.started_at.isoformat(),
        "backend": result.backend,
        "model_id": result.model,
        "tokenizer_id": result.tokenizer_id,
        "num_prompts": result.num_prompts,
        "request_rate": s.request_rate,
        "burstiness": s.burstiness,
        "max_concurrency": s.max_concurrency,
        "duration": m.duration_s,
        "completed": m.completed,
        "failed": m.failed,
        "total_input_tokens": m.total_input,
        "total_output_tokens": m.total_output,
        "request_throughput": m.request_throughput,
        "request_goodput": m.request_goodput,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "input_lens": [r.prompt_len for r in records],
        "output_lens": m.output_lens,
        # Seconds, as benchmark_serving; null for a failed request.
        "ttfts": [r.ttft if r.success else None for r in records],
        # Per request, the gaps between output chunks in seconds (benchmark_serving's itls).
        "itls": [chunk_itls(r.chunk_times) if r.success else [] for r in records],
        "generated_texts": [r.generated_text for r in records],
        "errors": [r.error for r in records],
        # The failed requests counted by status (0: no response) and the server's message.
        "failures": [
            {"status": status, "message": message, "count": count}
            for (status, message), count in failure_counts(records)
        ],
    }
    for name in m.selected_metrics:
        for key, value in _stats_dict(m.stats(name)).items():
            if key != "count":
                stat, _, unit = key.rpartition("_")
                doc[f"{stat}_{name}_{unit}"] = value
    doc.update(
        {
            "codec": result.codec,
            "payload_kind": result.payload_kind,
            "endpoint": s.endpoint,
            "base_url": result.base_url,
            "seed": s.seed,
            "interrupted": result.interrupted,
            "warmup_requests": s.warmup_requests,
            "warmup_failed": result.warmup_failed,
            "percentile_metrics": list(m.selected_metrics),
            "metric_percentiles": list(m.selected_percentiles),
            "goodput_slos_ms": m.goodput_slos_ms,
            "metrics": {name: _stats_dict(m.stats(name)) for name in METRICS},
            "schedule_lag": dataclasses.asdict(m.schedule_lag),
            "dispatch_lag": dataclasses.asdict(m.dispatch_lag),
            "codec_figures": _codec_dict(result.codec_figures, m.ttft.mean),
            "ipc": _ipc_dict(result.ipc, m.ttft.mean),
            "client": health_dict(result.client_health),  # the client-bottleneck guard (loadgen/guard.py)
            "saturation": saturation.as_dict() if (saturation := result.saturation) else None,  # loadgen/saturation.py
            "process_cpu": result.process_cpu,  # client, frontend, engine CPU (loadgen/process_cpu.py)
            # generated_text is left out here: generated_texts has it.
            "records": [{k: v for k, v in dataclasses.asdict(r).items() if k != "generated_text"} for r in records],
            "metadata": {
                **(sysinfo or {}),
                "flags": result.flags,
                "engine": result.engine,
                "own_send_times": result.own_send_times,
                **result.extra,
                **user_metadata(result.flags),
            },
        }
    )
    return jsonable(doc)


def micro_document(
    cells: Iterable[Measurement],
    deliveries: Iterable[DeliveryMeasurement],
    settings: dict[str, Any],
    meta: dict[str, Any],
) -> list[dict[str, Any]]:
    """The ``bench micro --json`` document: one object per cell (times in µs, None where the cell
    did not run; each carries the settings and metadata so it stands alone), then one per delivery."""
    doc = [_micro_cell(m, settings, meta) for m in cells]
    for d in deliveries:
        fields = dataclasses.asdict(d.delivery)
        # The first send, the parts and the cold memcpy come after the keys older documents have.
        later = {k: fields.pop(k) for k in ("first_us", *(f"{p}_p50_us" for p in DELIVERY_PARTS))}
        row = {"kind": "delivery", **fields, "memcpy_p50_us": d.memcpy.p50_us, "schema_version": MICRO_SCHEMA}
        later["memcpy_cold_p50_us"] = d.memcpy_cold.p50_us if d.memcpy_cold else None
        later["variant"] = row.pop("variant")
        doc.append({**row, **later})
    return jsonable(doc)


def _micro_cell(m: Measurement, settings: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    cell, memcpy = m.cell, m.memcpy
    rec: dict[str, Any] = {"schema_version": MICRO_SCHEMA, "codec": cell.codec, "payload": cell.payload}
    rec.update(status=cell.status, reason=cell.reason)
    for name, t in (("encode", cell.encode), ("decode", cell.decode)):
        for figure in ("p50_us", "p99_us", "min_us", "iterations"):
            rec[f"{name}_{figure}"] = getattr(t, figure) if t else None
    rec.update(wire_bytes=cell.wire_bytes, frames=cell.frames, payload_bytes=m.payload_bytes)
    # A codec's adapter (vllm: our message to vLLM's and back), outside encode, decode and the ratio.
    rec.update(adapt_p50_us=cell.adapt.p50_us if cell.adapt else None)
    rec.update(memcpy_p50_us=memcpy.p50_us if memcpy else None, memcpy_iterations=memcpy.iterations if memcpy else None)
    rec.update(ratio=m.ratio, settings=settings, metadata=meta)
    return rec


def default_result_path(
    result: BenchmarkResult,
    result_dir: str | os.PathLike[str] = DEFAULT_RESULT_DIR,
    filename: str | None = None,
) -> Path:
    """results/<codec-or-backend>-<YYYYmmdd-HHMMSS>.json unless a filename is given.

    A default name that already exists gets a -1, -2, ... suffix.
    """
    directory = Path(result_dir)
    if filename:
        return directory / filename
    label = (result.flags or {}).get("label") or result.codec or result.backend
    stem = f"{label}-{result.started_at.strftime('%Y%m%d-%H%M%S')}"
    path = directory / f"{stem}.json"
    n = 1
    while path.exists():
        path = directory / f"{stem}-{n}.json"
        n += 1
    return path


def label_prefix(flags: Mapping[str, Any] | None) -> str:
    """``<label>-`` from the run's --label, the start of bench run's file names; else empty."""
    label = (flags or {}).get("label")
    return f"{label}-" if label else ""


def user_metadata(flags: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"user": {KEY: VALUE}}`` from the run's --metadata words (for a document's metadata); else empty."""
    pairs = (flags or {}).get("metadata")
    return {"user": {str(k): str(v) for k, v in pairs}} if pairs else {}


def save_run(
    result: BenchmarkResult,
    path: str | os.PathLike[str] | None = None,
    *,
    result_dir: str | os.PathLike[str] = DEFAULT_RESULT_DIR,
    filename: str | None = None,
    sysinfo: dict[str, Any] | None = None,
) -> Path:
    """Write the JSON file (atomically) and return its path.

    ``path`` wins over ``result_dir``/``filename``; sysinfo is collected
    when not given.
    """
    target = Path(path) if path is not None else default_result_path(result, result_dir, filename)
    write_json(target, run_document(result, sysinfo if sysinfo is not None else collect_sysinfo()))
    return target


# ------------------------------------------------------------------ reading


class ResultsError(ValueError):
    """A result file is missing, unreadable or not what it should be."""


# ------------------------------------------------------------------ files


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file; ResultsError naming the file for anything else."""
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
    doc = read_json(p)
    if is_compare(doc):
        raise ResultsError(f"{p}: is a compare file, not a run file (runs_frame/requests_frame accept it)")
    if not is_run(doc):
        raise ResultsError(f"{p}: not a run file (no 'records' nor benchmark_serving's 'ttfts'/'completed')")
    return doc


def load_compare(path: PathLike) -> dict[str, Any]:
    """One compare-*.json as a dict; ResultsError if it is not one."""
    p = Path(path)
    doc = read_json(p)
    if not is_compare(doc):
        what = "a run file" if is_run(doc) else "not a compare file"
        raise ResultsError(f"{p}: {what}; expected the compare-*.json of `bench run` (keys 'table' and 'runs')")
    if not isinstance(doc.get("codecs"), list):
        doc["codecs"] = list(doc["table"])
    return doc


def as_float(value: Any) -> float:
    """A JSON figure as a float: null → NaN, "inf"/"-inf" → ±inf."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def own_send_times(doc: dict[str, Any]) -> bool:
    """Whether a run sent every request at its own time (a trace's timestamps), as its run file
    records; a file written before that was recorded is judged by its trace flags."""
    meta = doc.get("metadata") or {}
    recorded = meta.get("own_send_times")
    if isinstance(recorded, bool):
        return recorded
    flags = meta.get("flags") or {}
    return flags.get("dataset_name") == "trace" and flags.get("trace_arrivals") == "timestamps"


def _planned_rate(doc: dict[str, Any]) -> float:
    """The rate the run planned its sends at: NaN when the requests' own send times or a load ramp
    set them (its recorded --request-rate, inf by default, played no part), so its throughput is
    never judged as at rate inf: a ramp's throughput is its schedule's, not the server's."""
    ramped = ((doc.get("metadata") or {}).get("flags") or {}).get("ramp_up_strategy")
    if own_send_times(doc) or ramped:
        return math.nan
    return as_float(doc.get("request_rate"))


def run_figures(doc: dict[str, Any]) -> dict[str, float]:
    """Every summary figure of a run document, flat: ``mean_ttft_ms``, ``p99_chunk_itl_ms``,
    ``request_encode_us``, ... (NaN where the document lacks it). The one reader of figures:
    tables, comparisons, the CI gate and ``results.runs_frame`` all use it."""
    out: dict[str, float] = {
        "num_prompts": as_float(doc.get("num_prompts")),
        "completed": as_float(doc.get("completed")),
        "failed": as_float(doc.get("failed")),
        "duration_s": as_float(doc.get("duration")),
        "request_rate": _planned_rate(doc),
        # How well the server kept up with the offered rate, in % (harness.loadgen.saturation).
        "kept_up_pct": 100.0 * as_float((doc.get("saturation") or {}).get("kept_up")),
    }
    for key in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput"):
        out[key] = as_float(doc.get(key))
    metrics = doc.get("metrics")
    for name in METRICS:
        stats = metrics.get(name) if isinstance(metrics, dict) else None
        if isinstance(stats, dict):
            # {"mean_ms", "median_ms", "std_ms", "p99_ms", ...} → mean_ttft_ms, ...
            for key, value in stats.items():
                if key.endswith("_ms"):
                    out[f"{key[:-3]}_{name}_ms"] = as_float(value)
        else:
            # benchmark_serving's flat keys, present for the selected metrics only.
            prefix = re.compile(rf"^(mean|median|std|p[\d.]+)_{name}_ms$")
            for key, value in doc.items():
                if prefix.match(key):
                    out[key] = as_float(value)
    for which in ("schedule_lag", "dispatch_lag"):
        lag = doc.get(which)
        if isinstance(lag, dict):
            for key in ("mean_ms", "p99_ms", "max_ms"):
                out[f"{which}_{key}"] = as_float(lag.get(key))
    codec = doc.get("codec_figures")
    if isinstance(codec, dict):
        for direction in DIRECTIONS:
            figures = codec.get(direction) or {}
            for key in DIRECTION_FIELDS:
                out[f"{direction}_{key}"] = as_float(figures.get(key))  # request_encode_us, ...
        out["first_token_path_us"] = as_float(codec.get("first_token_path_us"))
        out["ttft_share"] = as_float(codec.get("ttft_share"))
        out["codec_share_pct"] = out["ttft_share"] * 100.0
        out["mm_store_hit_pct"] = as_float(codec.get("mm_store_hit_pct"))
    ipc = doc.get("ipc")
    if isinstance(ipc, dict):
        out.update(codec_wire_figures(doc, ipc))
        out.update(budget_figures(ipc))  # ipc_request_wire_p50_us, ipc_ipc_mean_us, ...
        out["ipc_share_pct"] = as_float(ipc.get("share_of_ttft")) * 100.0
        out["loop_lag_p99_ms"] = as_float((ipc.get("loop_lag_ms") or {}).get("p99"))
    return out


def codec_wire_figures(doc: dict[str, Any], ipc: dict[str, Any]) -> dict[str, float]:
    """The codec and the wire, per request on its way to its first token and per output step (µs):
    the mean over the run's requests of each one's sum of ``CODEC_WIRE_SPANS`` (from its record;
    a file without them sums the spans' means), and the sum of the step spans' means."""
    spans = ipc.get("spans_us") or {}

    def mean_of(name: str) -> float:
        return as_float((spans.get(name) or {}).get("mean_us"))

    per_request = [as_float(r.get("codec_wire_us")) for r in doc.get("records") or () if isinstance(r, dict)]
    per_request = [v for v in per_request if math.isfinite(v)]
    first = math.fsum(per_request) / len(per_request) if per_request else sum(map(mean_of, CODEC_WIRE_SPANS))
    return {
        "first_token_codec_wire_us": first,
        "step_codec_wire_us": sum(map(mean_of, STEP_CODEC_WIRE_SPANS)),
    }
