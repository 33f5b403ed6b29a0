"""Printing and saving a BenchmarkResult; nothing here measures anything.

The console block copies benchmark_serving's layout (40-wide labels, the
same row names) so results read side by side with vLLM's, then adds
wirebench's own section: the codec's cost per direction, its share of TTFT,
and the client's schedule lag.

The JSON file uses benchmark_serving's field names for what both have and
adds wirebench's (``schema_version``, ``codec``, ``payload_kind``,
``failed``, ``records``, ``codec_figures``, ``schedule_lag``, ``metadata``).
NaN is written as null and infinity as the string "inf".
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from harness.loadgen.metrics import METRICS, MetricStats, chunk_itls, percentile_key
from harness.loadgen.runner import BenchmarkResult
from harness.loadgen.serverstats import CodecFigures, DirectionFigures
from harness.loadgen.sysinfo import collect_sysinfo

SCHEMA_VERSION = 1
WIDTH = 50
DEFAULT_RESULT_DIR = "results"


def _title(text: str, fill: str) -> str:
    return f"{text:{fill}^{WIDTH}}"


def _row(label: str, value: Any, fmt: str = "") -> str:
    if isinstance(value, float) and fmt:
        text = "n/a" if math.isnan(value) else format(value, fmt)
    else:
        text = str(value)
    return f"{label:<40} {text:<10}"


def _stats_rows(name: str, stats: MetricStats) -> list[str]:
    label, header = METRICS[name]
    rows = [
        _title(header, "-"),
        _row(f"Mean {label} (ms):", stats.mean, ".2f"),
        _row(f"Median {label} (ms):", stats.median, ".2f"),
    ]
    for p, value in stats.percentiles.items():
        rows.append(_row(f"P{percentile_key(p)} {label} (ms):", value, ".2f"))
    return rows


def _direction_rows(title: str, d: DirectionFigures) -> list[str]:
    return [
        _title(title, "-"),
        _row("Encode (us/msg):", d.encode_us, ".2f"),
        _row("Decode (us/msg):", d.decode_us, ".2f"),
        _row("Bytes per message:", d.bytes_per_message, ".1f"),
        _row("Frames per message:", d.frames_per_message, ".2f"),
        _row("Messages:", int(d.messages)),
    ]


def format_report(result: BenchmarkResult) -> str:
    """The console block: benchmark_serving's section, then wirebench's."""
    m = result.metrics
    s = result.settings
    lines = [
        _title(" Serving Benchmark Result ", "="),
        _row("Successful requests:", m.completed),
        _row("Failed requests:", m.failed),
        _row("Benchmark duration (s):", m.duration_s, ".2f"),
        _row("Total input tokens:", m.total_input),
        _row("Total generated tokens:", m.total_output),
        _row("Request throughput (req/s):", m.request_throughput, ".2f"),
    ]
    if m.request_goodput is not None:
        lines.append(_row("Request goodput (req/s):", m.request_goodput, ".2f"))
    lines += [
        _row("Output token throughput (tok/s):", m.output_throughput, ".2f"),
        _row("Total Token throughput (tok/s):", m.total_token_throughput, ".2f"),
    ]
    for name in m.selected_metrics:
        lines += _stats_rows(name, m.stats(name))
    lines.append("=" * WIDTH)

    lines += [
        _title(" wirebench ", "="),
        _row("Codec:", result.codec or "unknown"),
        _row("Payload kind:", result.payload_kind),
        _row("Endpoint:", s.endpoint),
        _row("Request rate (req/s):", "inf" if math.isinf(s.request_rate) else f"{s.request_rate:g}"),
        _row("Burstiness:", f"{s.burstiness:g}"),
        _row("Max concurrency:", s.max_concurrency if s.max_concurrency else "none"),
    ]
    lines += _codec_rows(result.codec_figures, m.ttft.mean)
    lag = m.schedule_lag
    lines += [
        _title("Client schedule lag", "-"),
        _row("Mean schedule lag (ms):", lag.mean_ms, ".3f"),
        _row("P99 schedule lag (ms):", lag.p99_ms, ".3f"),
        _row("Max schedule lag (ms):", lag.max_ms, ".3f"),
    ]
    if s.max_concurrency:
        lines.append(_row("Max dispatch lag (ms):", m.dispatch_lag.max_ms, ".3f"))
    if result.warmup_failed:
        lines.append(_row("Failed warmup requests:", result.warmup_failed))
    if m.failed:
        lines.append(_title("Errors", "-"))
        errors = Counter(r.error or "unknown error" for r in result.records if not r.success)
        for error, count in errors.most_common(5):
            lines.append(f"{count:>6} x {_one_line(error)[:100]}")
    if result.interrupted:
        lines.append("Interrupted: unfinished requests were counted as failed (cancelled).")
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def _codec_rows(figures: CodecFigures | None, mean_ttft_ms: float) -> list[str]:
    if figures is None:
        return [_row("Codec figures:", "n/a (no wirebench codec counters at /metrics)")]
    share = figures.ttft_share(mean_ttft_ms)
    return [
        *_direction_rows("Codec: request (frontend->engine)", figures.request),
        *_direction_rows("Codec: output (engine->frontend)", figures.output),
        _title("Serialization in TTFT", "-"),
        _row("Serialization, first-token path (us):", figures.first_token_path_us, ".2f"),
        _row("Share of mean TTFT (%):", share * 100.0, ".3f"),
    ]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def print_report(result: BenchmarkResult, file: TextIO | None = None) -> None:
    print(format_report(result), file=file, flush=True)


# ---------------------------------------------------------------- JSON


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
    }


def result_to_dict(result: BenchmarkResult, sysinfo: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of one run (already JSON-safe)."""
    m = result.metrics
    s = result.settings
    records = result.records
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
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
            # generated_text is left out here: generated_texts has it.
            "records": [{k: v for k, v in dataclasses.asdict(r).items() if k != "generated_text"} for r in records],
            "metadata": {**(sysinfo or {}), "flags": result.flags, **result.extra},
        }
    )
    return jsonable(doc)


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
    stem = f"{result.codec or result.backend}-{result.started_at.strftime('%Y%m%d-%H%M%S')}"
    path = directory / f"{stem}.json"
    n = 1
    while path.exists():
        path = directory / f"{stem}-{n}.json"
        n += 1
    return path


def save_result(
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
    doc = result_to_dict(result, sysinfo if sysinfo is not None else collect_sysinfo())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, target)
    return target
