"""Where each request's IPC time goes: timestamps from both processes on one clock.

Both processes take ``time.monotonic_ns()`` (CLOCK_MONOTONIC), which on one
host is one clock for every process, so a frontend timestamp and an engine
timestamp can be subtracted. Across hosts they cannot: the engine tells its
boot id (``host_clock_id``) and the frontend marks spans unavailable when it
differs from its own.

What is recorded, per request (the first-token path) — points in ns:

  frontend  http_received → prepared → encode_start → encode_end → sent
  engine    received (input thread's recv returned) → decode_end → added (busy loop
            hands it to the scheduler) → first_scheduled (start of the step that
            first schedules it) → first_sampled (end of the step that samples its
            first token); the output batch carrying that token: its sequence number
  frontend  first_output_received (reader's recv returned) → first_output_decoded
            → first_sse_written (the first chunk written to the HTTP response)

and per output batch (one per engine step, shared by the batch's requests):
engine encode_start/encode_end/sent, frontend received/decoded. Encode and
decode also carry CPU time (``time.thread_time_ns``) beside wall time: on a
busy machine the two differ by what the thread waited for the GIL or a core.

Spans (``request_spans``), in µs: request direction ``encode``, ``wire``
(encode end → engine receive returned: the send call, ZeroMQ's socket copies
and the receive), ``decode``, ``queue`` (engine input queue until the busy
loop takes it); output direction ``queue`` (sampled → its batch's encode
starts), ``encode``, ``wire`` (encode end → frontend receive returned),
``decode``. **IPC on the first-token path** is their sum; the rest of TTFT is
the frontend's own work (tokenize, images, detokenize, SSE), the engine's
scheduling wait and the compute.

A codec with an adapter (``vllm``: our message to vLLM's and back) has it timed
apart as ``request.adapt`` / ``output.adapt``, taken out of the queue and relay
spans it falls in, and left out of the IPC sum: a server built on those
messages does not pay it.

Engine timestamps travel in their own JSON messages (``SPANS``), never inside
the codec under test: every codec carries exactly the bytes it carried before.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Per-request span names → (direction, what), in the order of the path.
REQUEST_SPANS: tuple[tuple[str, str], ...] = (
    ("request", "encode"),
    ("request", "wire"),
    ("request", "decode"),
    ("request", "queue"),
    ("output", "queue"),
    ("output", "encode"),
    ("output", "wire"),
    ("output", "decode"),
)
# The codec and the wire on a request's way to its first token (the queues and the adapter left out):
# what a change of codec or transport changes, judged per request in its own family.
CODEC_WIRE_SPANS: tuple[str, ...] = tuple(f"{d}.{w}" for d, w in REQUEST_SPANS if w in ("encode", "wire", "decode"))
STEP_CODEC_WIRE_SPANS: tuple[str, ...] = ("step.encode", "step.wire", "step.decode")
# The codec's four calls alone on that path.
CODEC_SPANS: tuple[str, ...] = tuple(name for name in CODEC_WIRE_SPANS if not name.endswith(".wire"))
CPU_SPANS: tuple[tuple[str, str], ...] = (
    ("request", "encode"),
    ("request", "decode"),
    ("output", "encode"),
    ("output", "decode"),
)


def host_clock_id() -> str:
    """Identifies this host's CLOCK_MONOTONIC: the kernel's boot id (hostname when unreadable)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return f"host:{socket.gethostname()}"


@dataclass
class FrontPoints:
    """The frontend's timestamps of one request (ns, CLOCK_MONOTONIC; 0 = not reached)."""

    http_received: int = 0
    prepared: int = 0
    encode_start: int = 0
    encode_end: int = 0
    encode_cpu: int = 0
    sent: int = 0
    first_output_received: int = 0
    first_output_decoded: int = 0
    first_output_decode_cpu: int = 0
    first_output_seq: int = -1
    first_sse_written: int = 0
    # Durations (ns) of the codec's adapter (vllm: our message to vLLM's, vLLM's to ours), outside encode/decode.
    adapt_ns: int = 0
    first_output_adapt_ns: int = 0


@dataclass
class EnginePoints:
    """The engine's timestamps of one request, as its SPANS message carries them."""

    received: int = 0
    decode_end: int = 0
    decode_cpu: int = 0
    added: int = 0
    first_scheduled: int = 0
    first_sampled: int = 0
    first_output_seq: int = -1
    adapt_ns: int = 0  # the codec's adapter after decode (inside decode_end → added)


@dataclass
class BatchPoints:
    """One output batch: engine encode and send, frontend receive and decode."""

    seq: int
    step_index: int = 0
    outputs: int = 0
    encode_start: int = 0
    encode_end: int = 0
    encode_cpu: int = 0
    sent: int = 0
    bytes: int = 0
    received: int = 0
    decoded: int = 0
    decode_cpu: int = 0
    adapt: int = 0  # engine: the codec's adapter before encode (ns)
    front_adapt: int = 0  # frontend: the codec's adapter after decode (ns)
    # The device thread as the batch left: busy and idle-between-steps ns so far (0 for torch in series).
    device_busy: int = 0
    device_idle: int = 0

    def spans_us(self) -> dict[str, float]:
        return {
            "adapt": _us(self.adapt + self.front_adapt),
            "encode": _us(self.encode_end - self.encode_start),
            "encode_cpu": _us(self.encode_cpu),
            "wire": _us(self.received - self.encode_end),
            "decode": _us(self.decoded - self.received),
            "decode_cpu": _us(self.decode_cpu),
        }


@dataclass
class RequestTimeline:
    """Both processes' points of one request, joined by request id, and the output batch of its first token."""

    request_id: str
    front: FrontPoints
    engine: EnginePoints
    first_batch: BatchPoints | None = None

    def spans_us(self) -> dict[str, float]:
        """The first-token path's spans in µs (NaN where a point is missing)."""
        f, e, b = self.front, self.engine, self.first_batch
        out = {
            "request.encode": _span(f.encode_start, f.encode_end),
            "request.encode_cpu": _us(f.encode_cpu),
            "request.wire": _span(f.encode_end, e.received),
            "request.decode": _span(e.received, e.decode_end),
            "request.decode_cpu": _us(e.decode_cpu),
            "request.queue": _span(e.decode_end, e.added) - _us(e.adapt_ns),
            "engine.schedule_wait": _span(e.added, e.first_scheduled),
            "engine.first_step": _span(e.first_scheduled, e.first_sampled),
            "output.queue": _span(e.first_sampled, b.encode_start if b else 0) - _us(b.adapt if b else 0),
            "output.encode": _span(b.encode_start, b.encode_end) if b else math.nan,
            "output.encode_cpu": _us(b.encode_cpu) if b else math.nan,
            "output.wire": _span(b.encode_end if b else 0, f.first_output_received),
            "output.decode": _span(f.first_output_received, f.first_output_decoded),
            "output.decode_cpu": _us(f.first_output_decode_cpu),
            "frontend.prepare": _span(f.http_received, f.prepared),
            "frontend.relay": _span(f.first_output_decoded, f.first_sse_written) - _us(f.first_output_adapt_ns),
            # The codec's adapter (vllm's message conversion): not IPC a server on those messages pays.
            "request.adapt": _us(f.adapt_ns + e.adapt_ns),
            "output.adapt": _us((b.adapt if b else 0) + f.first_output_adapt_ns),
            "server.ttft": _span(f.http_received, f.first_sse_written),
        }
        out["ipc"] = sum(out[f"{d}.{w}"] for d, w in REQUEST_SPANS)
        return out

    def ordered(self) -> bool:
        """Every point after the one before it along the path (what a sound clock gives)."""
        f, e = self.front, self.engine
        points = [
            f.http_received,
            f.prepared,
            f.encode_start,
            f.encode_end,
            e.received,
            e.decode_end,
            e.added,
            e.first_scheduled,
            e.first_sampled,
        ]
        if self.first_batch is not None:
            points += [self.first_batch.encode_start, self.first_batch.encode_end]
        points += [f.first_output_received, f.first_output_decoded, f.first_sse_written]
        return all(p > 0 for p in points) and all(a <= b for a, b in zip(points, points[1:]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "front": vars(self.front),
            "engine": vars(self.engine),
            "first_batch": vars(self.first_batch) if self.first_batch else None,
            "spans_us": self.spans_us(),
        }


def _us(ns: int | float) -> float:
    return ns / 1000.0


def _span(start: int, end: int) -> float:
    return (end - start) / 1000.0 if start > 0 and end > 0 else math.nan


# --- the IPC budget -------------------------------------------------------------------------


@dataclass(frozen=True)
class SpanStats:
    count: int
    p50_us: float
    p99_us: float
    mean_us: float


def span_stats(values: Iterable[float]) -> SpanStats:
    v = np.array([x for x in values if math.isfinite(x)], dtype=float)
    if v.size == 0:
        return SpanStats(0, math.nan, math.nan, math.nan)
    return SpanStats(int(v.size), float(np.percentile(v, 50)), float(np.percentile(v, 99)), float(v.mean()))


@dataclass
class IpcBudget:
    """Per span, p50/p99/mean over a run's requests (µs), and the IPC share of mean TTFT."""

    spans: dict[str, SpanStats] = field(default_factory=dict)
    requests: int = 0
    unavailable: str = ""  # why there is no budget (spans across hosts, server without spans)
    loop_lag: dict[str, float] = field(default_factory=dict)
    # The device thread over the run (sim, or torch overlapped): busy_ms, idle_ms between steps; else empty.
    device: dict[str, float] = field(default_factory=dict)
    # Per request id, its codec µs (CODEC_SPANS) and codec + wire µs (CODEC_WIRE_SPANS) on the first-token
    # path; the run's records carry them, so blocks of requests can be compared (harness.analysis.blocks).
    codec_us: dict[str, float] = field(default_factory=dict)
    codec_wire_us: dict[str, float] = field(default_factory=dict)
    # A run in blocks: per figure, each block's value in the order the blocks were sent (the output steps
    # placed by time, harness.loadgen.ipc.step_block_means); empty otherwise.
    blocks: dict[str, list[float]] = field(default_factory=dict)

    def share_of_ttft(self, mean_ttft_ms: float) -> float:
        """Mean IPC on the first-token path over mean TTFT (NaN when unknown)."""
        ipc = self.spans.get("ipc")
        if ipc is None or not mean_ttft_ms or not math.isfinite(mean_ttft_ms):
            return math.nan
        return ipc.mean_us / (mean_ttft_ms * 1000.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "unavailable": self.unavailable or None,
            "spans_us": {name: vars(s) for name, s in self.spans.items()},
            "loop_lag_ms": self.loop_lag,
            **({"device": self.device} if self.device else {}),
            **({"blocks": self.blocks} if self.blocks else {}),
        }


def device_time(batches: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The device thread's busy and idle ms between the first and last of a run's output batches.

    Each batch carries the device's cumulative counters as it left, so their difference is the
    run's share whatever steps sent no batch; empty when the engine has no modelled device.
    """
    marks = sorted(
        (int(b.get("seq", 0)), int(b.get("device_busy") or 0), int(b.get("device_idle") or 0)) for b in batches
    )
    marks = [m for m in marks if m[1] > 0]
    if len(marks) < 2 or marks[-1][1] <= marks[0][1]:
        return {}
    busy_ms = (marks[-1][1] - marks[0][1]) / 1e6
    idle_ms = (marks[-1][2] - marks[0][2]) / 1e6
    return {"busy_ms": round(busy_ms, 3), "idle_ms": round(idle_ms, 3)}


def budget(timelines: Sequence[dict[str, Any]], loop_lag: dict[str, float] | None = None) -> IpcBudget:
    """The IPC budget of request timelines as the spans endpoint serves them (``to_dict``)."""
    names: dict[str, list[float]] = {}
    codec: dict[str, float] = {}
    codec_wire: dict[str, float] = {}
    for t in timelines:
        spans = {
            name: float(value) if value is not None else math.nan for name, value in (t.get("spans_us") or {}).items()
        }
        for name, value in spans.items():
            names.setdefault(name, []).append(value)
        if t.get("request_id"):
            rid = str(t["request_id"])
            codec[rid] = math.fsum(spans.get(name, math.nan) for name in CODEC_SPANS)
            codec_wire[rid] = math.fsum(spans.get(name, math.nan) for name in CODEC_WIRE_SPANS)
    stats = {n: span_stats(v) for n, v in names.items()}
    return IpcBudget(stats, len(timelines), "", dict(loop_lag or {}), codec_us=codec, codec_wire_us=codec_wire)


# --- Chrome trace events (Perfetto, chrome://tracing) -----------------------------------------------

FRONTEND_TID, ENGINE_INPUT_TID, ENGINE_LOOP_TID, ENGINE_OUTPUT_TID, ENGINE_DEVICE_TID = 1, 1, 2, 3, 4
# Slices that readers of a trace look up by name (scripts/studies/vllm_client_check/).
PREPARE_SLICE, FIRST_CHUNK_SLICE, STEP_SLICE = "prepare", "relay first chunk", "step"


def trace_events(
    timelines: Sequence[RequestTimeline],
    batches: Sequence[BatchPoints],
    steps: Sequence[dict[str, Any]],
    frontend_pid: int,
    engine_pid: int,
) -> dict[str, Any]:
    """Spans as Chrome trace-event JSON: one track per process/thread, one complete ("X") slice per span.

    Timestamps are µs of CLOCK_MONOTONIC (the viewer shows them relative to the first event).
    """
    events: list[dict[str, Any]] = []

    def meta(pid: int, tid: int, process: str, thread: str) -> None:
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": tid, "args": {"name": process}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}})

    meta(frontend_pid, FRONTEND_TID, "frontend", "event loop")
    meta(engine_pid, ENGINE_INPUT_TID, "engine", "input thread")
    meta(engine_pid, ENGINE_LOOP_TID, "engine", "busy loop")
    meta(engine_pid, ENGINE_OUTPUT_TID, "engine", "output thread")
    if any("device_start" in s for s in steps):
        meta(engine_pid, ENGINE_DEVICE_TID, "engine", "device thread")  # sim's modelled GPU, or torch's steps

    def slice_(name: str, cat: str, pid: int, tid: int, start: int, end: int, args: dict[str, Any]) -> None:
        if start > 0 and end >= start:
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": cat,
                    "pid": pid,
                    "tid": tid,
                    "ts": start / 1000.0,
                    "dur": (end - start) / 1000.0,
                    "args": args,
                }
            )

    for t in timelines:
        f, e, rid = t.front, t.engine, {"request_id": t.request_id}
        slice_(PREPARE_SLICE, "frontend", frontend_pid, FRONTEND_TID, f.http_received, f.prepared, rid)
        slice_("request encode", "codec", frontend_pid, FRONTEND_TID, f.encode_start, f.encode_end, rid)
        slice_("request wire", "wire", frontend_pid, FRONTEND_TID, f.encode_end, e.received, rid)
        slice_("request decode", "codec", engine_pid, ENGINE_INPUT_TID, e.received, e.decode_end, rid)
        slice_("input queue", "queue", engine_pid, ENGINE_INPUT_TID, e.decode_end, e.added, rid)
        slice_(
            FIRST_CHUNK_SLICE,
            "frontend",
            frontend_pid,
            FRONTEND_TID,
            f.first_output_decoded,
            f.first_sse_written,
            rid,
        )
    for b in batches:
        args = {"seq": b.seq, "step": b.step_index, "outputs": b.outputs, "bytes": b.bytes}
        slice_("output encode", "codec", engine_pid, ENGINE_OUTPUT_TID, b.encode_start, b.encode_end, args)
        slice_("output wire", "wire", engine_pid, ENGINE_OUTPUT_TID, b.encode_end, b.received, args)
        slice_("output decode", "codec", frontend_pid, FRONTEND_TID, b.received, b.decoded, args)
    for s in steps:
        slice_(
            STEP_SLICE,
            "engine",
            engine_pid,
            ENGINE_LOOP_TID,
            int(s["start"]),
            int(s["end"]),
            {k: v for k, v in s.items() if k not in ("start", "end")},
        )
        if "device_start" in s:  # the step whose tokens this call returned, on the modelled GPU's timeline
            slice_(
                "gpu step", "device", engine_pid, ENGINE_DEVICE_TID, int(s["device_start"]), int(s["device_end"]), {}
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"clock": "CLOCK_MONOTONIC", "pid": os.getpid()},
    }
