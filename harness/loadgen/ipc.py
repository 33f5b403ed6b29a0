"""The IPC budget of a run, from the server's request timelines (``harness.wire.spans``).

Before the load, ``spans_cursor`` notes where the server's timeline rings
stand; after it, ``fetch_budget`` reads what came after, keeps the timelines
of this run's requests (matched by the response id every SSE chunk carries)
and the output batches of the run, and summarises them: p50/p99/mean per span
in µs, and the IPC share of mean TTFT. A server without the spans endpoint
(any other OpenAI-compatible server) has no budget; one whose engine runs on
another host says its spans are unavailable.

Output batches are shared by the requests of a step, so a run in blocks places
them by time: a block's window runs from its first request's send to its last
one's end (``block_windows``, on the client's CLOCK_MONOTONIC, which is the
server's on one host), and a batch belongs to the block whose window holds its
encode start (``step_block_means``); one between windows belongs to none.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp

from harness.loadgen.client import RequestRecord
from harness.wire.spans import REQUEST_SPANS, IpcBudget, budget, device_time, span_stats

SPANS_PATH = "/v1/wirebench/spans"
_TIMEOUT = aiohttp.ClientTimeout(total=30)
Window = tuple[int, int]  # a block's first send and last end, ns of CLOCK_MONOTONIC
# The figure a run in blocks keeps per block from its output steps (the run document's ``ipc.blocks``):
# each block's mean of STEP_CODEC_WIRE_SPANS' sum over its batches, judged as harness.analysis.blocks says.
STEP_BLOCK_FIGURE = "step_codec_wire_us"


async def _get(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    try:
        async with session.get(url, timeout=_TIMEOUT) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
            return body if isinstance(body, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def spans_cursor(session: aiohttp.ClientSession, base_url: str) -> dict[str, int] | None:
    """Where the server's rings stand now (None: a server without spans)."""
    body = await _get(session, f"{base_url.rstrip('/')}{SPANS_PATH}?since_request=-1&since_batch=-1&since_lag=-1")
    if body is None:
        return None
    cursor = body.get("cursor")
    return {k: int(v) for k, v in cursor.items()} if isinstance(cursor, dict) else None


async def fetch_budget(
    session: aiohttp.ClientSession,
    base_url: str,
    cursor: dict[str, int] | None,
    server_ids: Sequence[str],
    windows: Sequence[Window | None] = (),
) -> IpcBudget | None:
    """The run's IPC budget: its requests' timelines and the output batches since ``cursor``; with
    ``windows`` (``block_windows``), each block's mean codec + wire µs per output step."""
    if cursor is None:
        return None
    query = f"?since_request={cursor['request']}&since_batch={cursor['batch']}&since_lag={cursor['lag']}"
    body = await _get(session, f"{base_url.rstrip('/')}{SPANS_PATH}{query}")
    if body is None:
        return None
    if not body.get("available"):
        return IpcBudget(unavailable=str(body.get("unavailable") or "not recorded"))
    wanted = set(server_ids)
    timelines = [t for t in body.get("requests") or () if t.get("request_id") in wanted]
    result = budget(timelines, body.get("loop_lag_ms") or {})
    for what in ("adapt", "encode", "encode_cpu", "wire", "decode", "decode_cpu"):  # per step, every batch of the run
        values = [float(b["spans_us"][what]) for b in body.get("batches") or () if b.get("spans_us")]
        result.spans[f"step.{what}"] = span_stats(values)
    result.device = device_time(body.get("batches") or ())
    if windows:
        steps = (_batch_step(b) for b in body.get("batches") or () if b.get("spans_us"))
        result.blocks[STEP_BLOCK_FIGURE] = step_block_means(steps, windows)
    return result


# --- output steps per block -------------------------------------------------------------------


def block_windows(blocks: Sequence[Sequence[RequestRecord]]) -> list[Window | None]:
    """Per block (the records it sent, in the order the blocks went), its window: from its first
    request's send to its last request's end (the end of its stream, or its last chunk for one that
    failed); None for a block that sent nothing."""
    windows: list[Window | None] = []
    for block in blocks:
        sent = [r for r in block if r.send_ns > 0]
        windows.append((min(r.send_ns for r in sent), max(map(_end_ns, sent))) if sent else None)
    return windows


def _end_ns(record: RequestRecord) -> int:
    """When a request ended on CLOCK_MONOTONIC: its latency, else its last chunk, after its send."""
    last = record.latency if math.isfinite(record.latency) else max(record.chunk_times, default=0.0)
    return record.send_ns + round(last * 1e9)


def step_block_means(steps: Iterable[tuple[float, float]], windows: Sequence[Window | None]) -> list[float]:
    """Per window, the mean µs of the output steps (encode start ns, codec + wire µs) whose encode
    started inside it (ends included); NaN for a window without a step, or none."""
    ordered = sorted((at, us) for at, us in steps if math.isfinite(us))
    starts = [at for at, _ in ordered]
    means = []
    for window in windows:
        inside = (
            ordered[bisect.bisect_left(starts, window[0]) : bisect.bisect_right(starts, window[1])] if window else []
        )
        means.append(math.fsum(us for _, us in inside) / len(inside) if inside else math.nan)
    return means


def _batch_step(batch: dict[str, Any]) -> tuple[int, float]:
    """One batch of the spans endpoint as (its encode start ns, its encode + wire + decode µs)."""
    spans = batch["spans_us"]
    parts = [float(spans[what]) if spans.get(what) is not None else math.nan for what in ("encode", "wire", "decode")]
    return int(batch.get("encode_start") or 0), sum(parts)


# --- the report ------------------------------------------------------------------------------

ROWS: tuple[tuple[str, str, str | None], ...] = (
    # (label, span, its CPU span)
    ("Request encode", "request.encode", "request.encode_cpu"),
    ("Request wire, send -> receive", "request.wire", None),
    ("Request decode", "request.decode", "request.decode_cpu"),
    ("Engine input queue", "request.queue", None),
    ("Output queue before encode", "output.queue", None),
    ("Output encode", "output.encode", "output.encode_cpu"),
    ("Output wire, send -> receive", "output.wire", None),
    ("Output decode", "output.decode", "output.decode_cpu"),
    # A real SGLang's second output hop, and the detokenizer's work before it (not IPC).
    ("Detokenizer work (not IPC)", "detok.work", None),
    ("Detokenizer -> tokenizer encode", "detok.encode", None),
    ("Detokenizer -> tokenizer wire", "detok.wire", None),
    ("Detokenizer -> tokenizer decode", "detok.decode", None),
    ("IPC, first-token path", "ipc", None),
    # Only for a codec with an adapter (vllm): building its messages from ours and back, not IPC.
    ("Codec adapter, request", "request.adapt", None),
    ("Codec adapter, first output", "output.adapt", None),
    ("Every step: codec adapter", "step.adapt", None),
    ("Every step: output encode", "step.encode", "step.encode_cpu"),
    ("Every step: output wire", "step.wire", None),
    ("Every step: output decode", "step.decode", "step.decode_cpu"),
)


# The queue spans of the IPC total, which a server may not expose (a vLLM whose plugin records no queues:
# harness.loadgen.vllm_spans).
QUEUE_SPANS = ("request.queue", "output.queue")


def _counted(ipc: IpcBudget, name: str) -> bool:
    span = ipc.spans.get(name)
    return span is not None and span.count > 0


def _fmt(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:,.1f}" if x < 10_000 else f"{x:,.0f}"


def report_lines(ipc: IpcBudget | None, mean_ttft_ms: float, width: int = 50) -> list[str]:
    """The console section: p50 / p99 µs per span (wall, and CPU where the span is a codec call)."""
    title = f"{' IPC budget, µs (p50 / p99) ':-^{width}}"
    if ipc is None:
        return [title, "n/a (the server exposes no request timelines)"]
    if ipc.unavailable:
        return [title, f"unavailable: {ipc.unavailable}"]
    lines = [title, f"{'span':<32}{'wall':>17}{'CPU':>17}"]
    traced = _counted(ipc, "ipc")
    for label, name, cpu in ROWS:
        s = ipc.spans.get(name)
        if s is None or not s.count or (name.endswith(".adapt") and not s.p99_us):
            if traced and name in QUEUE_SPANS:  # a span the total would sum, not exposed by this server
                lines.append(f"{label:<32}{'-':>17}")
            continue
        c = ipc.spans.get(cpu) if cpu else None
        cpu_text = f"{_fmt(c.p50_us)} / {_fmt(c.p99_us)}" if c is not None and c.count else ""
        lines.append(f"{label:<32}{_fmt(s.p50_us) + ' / ' + _fmt(s.p99_us):>17}{cpu_text:>17}")
    share = ipc.share_of_ttft(mean_ttft_ms)
    # Not the codec share (the codec calls alone); the queues only where the server exposes them.
    queues = [_counted(ipc, q) for q in QUEUE_SPANS]
    summed = "codec, wire, queues" + ("" if all(queues) else " where seen") if any(queues) else "codec, wire"
    ipc_share = f"IPC ({summed}) % of TTFT:"
    lines.append(f"{ipc_share:<40} {share * 100:.2f}" if math.isfinite(share) else "")
    lag = ipc.loop_lag
    if lag.get("samples"):
        lines.append(f"{'Frontend loop lag p99 / max (ms):':<40} {lag['p99']:.2f} / {lag['max']:.2f}")
    lines.append(f"{'Requests traced:':<40} {ipc.requests}")
    return [line for line in lines if line]


def budget_figures(ipc: dict[str, Any] | None) -> dict[str, float]:
    """Flat figures of a run document's ``ipc`` section (for tables and comparisons): ``ipc_<span>_p50_us``..."""
    out: dict[str, float] = {}
    spans = (ipc or {}).get("spans_us") or {}
    extra = (
        "ipc",
        "step.wire",
        "request.adapt",
        "output.adapt",
        "detok.work",
        "detok.encode",
        "detok.wire",
        "detok.decode",
    )
    for name in (*(f"{d}.{w}" for d, w in REQUEST_SPANS), *extra):
        s = spans.get(name) or {}
        key = name.replace(".", "_")
        for stat in ("p50_us", "p99_us", "mean_us"):
            value = s.get(stat)
            out[f"ipc_{key}_{stat}"] = float(value) if isinstance(value, (int, float)) else math.nan
    return out
