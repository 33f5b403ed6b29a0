"""Printing and saving a BenchmarkResult; nothing here measures anything.

The console block copies benchmark_serving's layout (40-wide labels, the
same row names) so results read side by side with vLLM's, then adds
wirebench's own section: the codec's cost per direction, its share of TTFT,
and the client's schedule lag.

The JSON result file is ``harness.analysis.documents``' (``save_run``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

from harness.loadgen import conversations, process_cpu
from harness.loadgen.client import RequestRecord, describe_failure, failure_key
from harness.loadgen.guard import format_lines as client_health_lines
from harness.loadgen.ipc import report_lines as ipc_report_lines
from harness.loadgen.metrics import METRICS, MetricStats, percentile_key
from harness.loadgen.ramp import bucket_lines, by_offered_rate
from harness.loadgen.runner import BenchmarkResult
from harness.loadgen.saturation import stall_note, stalled
from harness.loadgen.serverstats import CodecFigures, DirectionFigures
from harness.loadgen.settings import LoadSettings
from harness.server_metrics import engine_info

WIDTH = 50


def codec_label(codec: str | None, engine: dict | None) -> str:
    """The run's codec, with the outputs' own when the engine used another (--output-codec)."""
    outputs = (engine or {}).get("output_codec")
    name = codec or "unknown"
    return f"{name} (outputs: {outputs})" if outputs and outputs != codec else name


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
        _row("Encode (µs/msg):", d.encode_us, ".2f"),
        _row("Encode CPU (µs/msg):", d.encode_cpu_us, ".2f"),
        _row("Decode (µs/msg):", d.decode_us, ".2f"),
        _row("Decode CPU (µs/msg):", d.decode_cpu_us, ".2f"),
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
        _row("Codec:", codec_label(result.codec, result.engine)),
        _row("Payload kind:", result.payload_kind),
        _row("Endpoint:", s.endpoint),
        _rate_row(s),
        _row("Burstiness:", f"{s.burstiness:g}"),
        _row("Max concurrency:", s.max_concurrency if s.max_concurrency else "none"),
    ]
    lines += _codec_rows(result.codec_figures, m.ttft.mean)
    reserve = [r.prompt_len + r.expected_output_len for r in result.records]  # KV each request reserves
    lines += [_row(k, v) for k, v in engine_info.report_rows(result.engine, sum(reserve) / max(len(reserve), 1))]
    lines += ipc_report_lines(result.ipc, m.ttft.mean, WIDTH)
    lines += ramp_lines(result)
    lines += turn_lines(result)
    lag = m.schedule_lag
    lines += [
        _title("Client schedule lag", "-"),
        _row("Mean schedule lag (ms):", lag.mean_ms, ".3f"),
        _row("P99 schedule lag (ms):", lag.p99_ms, ".3f"),
        _row("Max schedule lag (ms):", lag.max_ms, ".3f"),
    ]
    if s.max_concurrency:
        lines.append(_row("Max dispatch lag (ms):", m.dispatch_lag.max_ms, ".3f"))
    lines += client_health_lines(result.client_health)
    lines += process_cpu.format_lines(result.process_cpu)
    if result.warmup_failed:
        lines.append(_row("Failed warmup requests:", result.warmup_failed))
    if m.failed:
        lines.append(_title("Errors, by status and the server's message", "-"))
        for (status, message), count in failure_counts(result.records)[:5]:
            lines.append(f"{count:>6} x {_one_line(describe_failure(status, message))[:100]}")
    if result.interrupted:
        lines.append("Interrupted: unfinished requests were counted as failed (cancelled).")
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def _rate_row(s: LoadSettings) -> str:
    ramp = s.ramp
    if ramp is not None:
        return _row("Request rate (req/s):", f"{ramp.strategy} ramp {ramp.start_rps:g} -> {ramp.end_rps:g}")
    return _row("Request rate (req/s):", "inf" if math.isinf(s.request_rate) else f"{s.request_rate:g}")


def ramp_lines(result: BenchmarkResult) -> list[str]:
    """A ramped run's TTFT and codec figures per offered-rate bucket (harness.loadgen.ramp); none without a ramp."""
    ramp = result.settings.ramp
    if ramp is None or result.own_send_times:
        return []
    return [_title("TTFT and codec by offered rate", "-"), *bucket_lines(by_offered_rate(result.records, ramp))]


def turn_lines(result: BenchmarkResult) -> list[str]:
    """A multi-turn run's figures per turn index (harness.loadgen.conversations); none without conversations."""
    rows = conversations.by_turn(result.records)
    return [_title("Conversations, by turn", "-"), *conversations.turn_lines(rows)] if rows else []


def _codec_rows(figures: CodecFigures | None, mean_ttft_ms: float) -> list[str]:
    if figures is None:
        return [_row("Codec figures:", "n/a (no wirebench codec counters at /metrics)")]
    share = figures.ttft_share(mean_ttft_ms)
    return [
        *_direction_rows("Codec: request (frontend->engine)", figures.request),
        *_direction_rows("Codec: output (engine->frontend)", figures.output),
        # Codec calls alone; the IPC budget's share adds the wire and the queues.
        _title("Codec time in TTFT", "-"),
        _row("Codec time, first-token path (µs):", figures.first_token_path_us, ".2f"),
        _row("Codec share of mean TTFT (%):", share * 100.0, ".3f"),
        # --transport shm-store: the share of frames the store already held, measured over the run.
        *([_row("Store hit rate (%):", figures.mm_store_hit_pct, ".2f")] if figures.mm_store else []),
    ]


def failure_counts(records: Sequence[RequestRecord]) -> list[tuple[tuple[int, str], int]]:
    """The failed requests counted by (status, the server's message), most frequent first."""
    return Counter(failure_key(r) for r in records if not r.success).most_common()


def failures_line(result: BenchmarkResult, top: int = 3) -> str:
    """The last line a run with failures prints, and its outcome's message: how many failed, then the
    commonest reasons with their counts ("40 of 40 requests failed: 40 x HTTP 503: ...")."""
    counts = failure_counts(result.records)
    shown = "; ".join(f"{n} x {_one_line(describe_failure(*key))[:160]}" for key, n in counts[:top])
    more = f" (and {len(counts) - top} more reasons)" if len(counts) > top else ""
    return f"{result.failed} of {result.num_prompts} requests failed: {shown}{more}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run_line(result: BenchmarkResult) -> str:
    """One run in a line (bench run's default; --full-report prints format_report): requests served,
    mean TTFT and TPOT, and the codec's request encode where the server measured it."""
    m = result.metrics
    line = f"{m.completed}/{m.completed + m.failed} in {m.duration_s:.1f} s"
    if math.isfinite(m.ttft.mean):  # none completed: no latency to give
        line += f"; TTFT mean {m.ttft.mean:.2f} ms"
    if math.isfinite(m.tpot.mean):
        line += f", TPOT mean {m.tpot.mean:.2f} ms"
    figures = result.codec_figures
    if figures is not None and math.isfinite(figures.request.encode_us):
        line += f"; req encode {figures.request.encode_us:.1f} µs"
    saturation = result.saturation
    if saturation is not None and saturation.saturated:
        line += f"; {saturation.note}"
    if stalled(m.ttft.mean, m.ttft.median):
        line += f"; {stall_note(m.ttft.mean, m.ttft.median)}"
    return line


def print_report(result: BenchmarkResult, file: TextIO | None = None) -> None:
    print(format_report(result), file=file, flush=True)
