"""The server's /metrics in Prometheus text format: names, rendering, parsing.

One module so the frontend (which renders) and the load generator (which
reads the codec figures back for its report) agree on every name.

Codec figures are per direction and operation:
  direction="request": frontend encodes EngineCoreRequest, engine decodes it
  direction="output":  engine encodes EngineCoreOutputs, frontend decodes it
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass

from harness.wire.messages import CodecStats

PREFIX = "wirebench_"

# Counters rendered by the frontend (name -> help).
CODEC_MESSAGES = PREFIX + "codec_messages_total"
CODEC_SECONDS = PREFIX + "codec_seconds_total"
CODEC_BYTES = PREFIX + "codec_bytes_total"
CODEC_FRAMES = PREFIX + "codec_frames_total"
REQUESTS = PREFIX + "requests_total"  # label outcome=completed|failed|aborted|rejected
PROMPT_TOKENS = PREFIX + "prompt_tokens_total"
GENERATION_TOKENS = PREFIX + "generation_tokens_total"
REQUESTS_RUNNING = PREFIX + "requests_running"  # gauge
ENGINE_HEALTHY = PREFIX + "engine_healthy"  # gauge 1/0
CODEC_INFO = PREFIX + "codec_info"  # gauge 1 with label codec=NAME
ENGINE_INFO = (
    PREFIX + "engine_info"
)  # gauge 1 with labels device, dtype, preset, params, ... (harness.server_metrics.engine_info)
ENGINE_REQUESTS = PREFIX + "engine_requests"  # gauge, label state=running|waiting
ENGINE_STEPS = PREFIX + "engine_steps_total"  # counter: engine steps run
# counter, label blocked_by=kv_cache|max_num_seqs|token_budget: steps after which requests still waited
ENGINE_WAITING_STEPS = PREFIX + "engine_steps_with_waiting_total"
ENGINE_PREEMPTIONS = PREFIX + "engine_preemptions_total"  # counter: running requests preempted for KV blocks
# counters: prompt tokens admitted, and those served from the prefix cache (hit rate = hits / queries)
ENGINE_PREFIX_HITS = PREFIX + "engine_prefix_cache_hit_tokens_total"
ENGINE_PREFIX_QUERIES = PREFIX + "engine_prefix_cache_query_tokens_total"
# counters (--cuda-graphs): decode steps a captured CUDA graph replayed, and steps that ran eagerly
ENGINE_GRAPH_REPLAYS = PREFIX + "engine_cuda_graph_replays_total"
ENGINE_GRAPH_EAGER = PREFIX + "engine_cuda_graph_eager_steps_total"
OUTPUTS_RELAYED = PREFIX + "frontend_outputs_relayed_total"  # counter: engine outputs relayed to requests
OUTPUTS_BEHIND = PREFIX + "frontend_outputs_behind_total"  # counter: of those, taken with the next one waiting
MM_STORE = PREFIX + "frontend_mm_store_total"  # counter, label event=hit|miss|eviction|fallback (shm-store)

# Histograms (seconds), each with labels (see harness.wire.spans for what a span is).
IPC_SECONDS = PREFIX + "ipc_seconds"  # direction=request|output, span=encode|wire|decode|queue
CODEC_CPU_SECONDS = PREFIX + "codec_cpu_seconds"  # direction, op: thread CPU time of a codec call
FIRST_TOKEN_IPC_SECONDS = PREFIX + "first_token_ipc_seconds"  # IPC on a request's first-token path
LOOP_LAG_SECONDS = PREFIX + "frontend_loop_lag_seconds"  # how late the frontend's event loop runs callbacks
CODEC_CPU_SECONDS_TOTAL = PREFIX + "codec_cpu_seconds_total"
CODEC_ADAPT_SECONDS = PREFIX + "codec_adapter_seconds_total"

HELP = {
    CODEC_MESSAGES: ("counter", "Messages encoded or decoded by the codec."),
    CODEC_SECONDS: ("counter", "Seconds spent in the codec's encode or decode."),
    CODEC_BYTES: ("counter", "Bytes of all frames encoded or decoded."),
    CODEC_FRAMES: ("counter", "ZeroMQ frames encoded or decoded (body plus out-of-band)."),
    REQUESTS: ("counter", "Requests by outcome."),
    PROMPT_TOKENS: ("counter", "Prompt tokens of accepted requests."),
    GENERATION_TOKENS: ("counter", "Tokens generated and streamed."),
    REQUESTS_RUNNING: ("gauge", "Requests in flight in the frontend."),
    ENGINE_HEALTHY: ("gauge", "1 while the engine process is alive and answering."),
    CODEC_INFO: ("gauge", "The codec this server uses (value 1)."),
    ENGINE_INFO: ("gauge", "What the engine runs on: device, dtype, model, KV capacity, SDPA kernels (value 1)."),
    ENGINE_REQUESTS: ("gauge", "Requests the engine holds, by state, as of its latest heartbeat."),
    ENGINE_STEPS: ("counter", "Engine steps run, as of the engine's latest heartbeat."),
    ENGINE_WAITING_STEPS: (
        "counter",
        "Steps that left requests waiting, by what stopped admitting them (kv_cache and max_num_seqs: "
        "admission; token_budget: the step was full).",
    ),
    ENGINE_PREEMPTIONS: (
        "counter",
        "Running requests the engine preempted when no KV block was free (they recompute later).",
    ),
    ENGINE_PREFIX_HITS: ("counter", "Prompt tokens whose KV the engine took from its prefix cache."),
    ENGINE_PREFIX_QUERIES: ("counter", "Prompt tokens the engine admitted (recomputed ones included)."),
    OUTPUTS_RELAYED: ("counter", "Engine outputs the frontend relayed to their requests."),
    OUTPUTS_BEHIND: (
        "counter",
        "Outputs a request took while its next output already waited: the frontend was behind that "
        "request and, streaming, wrote the two chunks back to back.",
    ),
    MM_STORE: (
        "counter",
        "--transport shm-store: frames found in the store (hit) or copied in (miss), entries evicted, and "
        "frames sent in the message because every entry was pinned (fallback).",
    ),
    CODEC_CPU_SECONDS_TOTAL: ("counter", "Thread CPU seconds in the codec's encode or decode."),
    CODEC_ADAPT_SECONDS: (
        "counter",
        "Seconds in the codec's adapter (our message to its native one before encode, back after decode), "
        "outside codec time; 0 for codecs whose messages are ours.",
    ),
    IPC_SECONDS: ("histogram", "IPC spans of requests and output batches: encode, wire (send to receive), decode."),
    CODEC_CPU_SECONDS: ("histogram", "Thread CPU time of codec calls on the traced requests and batches."),
    FIRST_TOKEN_IPC_SECONDS: ("histogram", "All IPC spans on a request's path to its first token, summed."),
    LOOP_LAG_SECONDS: ("histogram", "How late the frontend's event loop ran a 10 ms timer."),
}

# Log-spaced bucket bounds from 1 µs to 10 s, three per decade.
BUCKETS_S: tuple[float, ...] = tuple(m * 10.0**e for e in range(-6, 1) for m in (1.0, 2.5, 5.0)) + (10.0,)


class Histogram:
    """A Prometheus histogram per label set: cumulative buckets, sum and count (seconds)."""

    def __init__(self, name: str, buckets: tuple[float, ...] = BUCKETS_S) -> None:
        self.name = name
        self.buckets = buckets
        self._series: dict[tuple[tuple[str, str], ...], list[float]] = {}  # counts per bucket, +Inf, sum

    def observe(self, seconds: float, **labels: str) -> None:
        if not math.isfinite(seconds):
            return
        key = tuple(sorted(labels.items()))
        counts = self._series.get(key)
        if counts is None:
            counts = self._series[key] = [0.0] * (len(self.buckets) + 2)
        i = bisect.bisect_left(self.buckets, seconds)
        counts[i] += 1  # index len(buckets) is +Inf
        counts[-1] += seconds

    def render(self) -> list[str]:
        kind, help_text = HELP.get(self.name, ("histogram", self.name))
        lines = [f"# HELP {self.name} {help_text}", f"# TYPE {self.name} histogram"]
        for key, counts in self._series.items():
            labels = dict(key)
            running = 0.0
            for bound, n in zip((*self.buckets, math.inf), counts[:-1]):
                running += n
                le = "+Inf" if math.isinf(bound) else f"{bound:.6g}"
                lines.append(f"{self.name}_bucket{_labels({**labels, 'le': le})} {running:.9g}")
            lines.append(f"{self.name}_sum{_labels(labels)} {counts[-1]:.9g}")
            lines.append(f"{self.name}_count{_labels(labels)} {running:.9g}")
        return lines


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def render(samples: dict[str, list[tuple[dict[str, str], float]]]) -> str:
    """Text exposition of ``{metric name: [(labels, value), ...]}``."""
    lines: list[str] = []
    for name, rows in samples.items():
        kind, help_text = HELP.get(name, ("untyped", name))
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in rows:
            lines.append(f"{name}{_labels(labels)} {value:.9g}")
    return "\n".join(lines) + "\n"


def codec_samples(frontend: CodecStats, engine: CodecStats) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The codec counters for both directions from the two sides' stats."""
    # Who does each (direction, op): the frontend encodes requests and decodes outputs, the engine the rest.
    sides = {("request", "encode"): frontend, ("request", "decode"): engine}
    sides |= {("output", "encode"): engine, ("output", "decode"): frontend}
    fields = {
        CODEC_MESSAGES: ("count", 1),
        CODEC_SECONDS: ("ns", 1e9),
        CODEC_BYTES: ("bytes", 1),
        CODEC_FRAMES: ("frames", 1),
        CODEC_CPU_SECONDS_TOTAL: ("cpu_ns", 1e9),
        CODEC_ADAPT_SECONDS: ("adapt_ns", 1e9),
    }
    return {
        name: [
            ({"direction": d, "op": op}, getattr(stats, f"{op}_{field}") / scale) for (d, op), stats in sides.items()
        ]
        for name, (field, scale) in fields.items()
    }


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Parse exposition text into ``{(name, frozenset(labels)): value}``."""
    values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        name, raw_labels, raw_value = match.groups()
        labels = frozenset(_LABEL.findall(raw_labels or ""))
        try:
            values[(name, labels)] = float(raw_value)
        except ValueError:
            values[(name, labels)] = math.nan
    return values


@dataclass(frozen=True)
class CodecCell:
    """One direction × operation of the codec counters."""

    messages: float
    seconds: float
    bytes: float
    frames: float
    cpu_seconds: float = 0.0  # thread CPU time in the same calls (NaN from a server that does not report it)

    def minus(self, before: CodecCell) -> CodecCell:
        return CodecCell(
            self.messages - before.messages,
            self.seconds - before.seconds,
            self.bytes - before.bytes,
            self.frames - before.frames,
            self.cpu_seconds - before.cpu_seconds,
        )

    @property
    def us_per_message(self) -> float:
        return self.seconds * 1e6 / self.messages if self.messages else math.nan

    @property
    def cpu_us_per_message(self) -> float:
        return self.cpu_seconds * 1e6 / self.messages if self.messages else math.nan

    @property
    def bytes_per_message(self) -> float:
        return self.bytes / self.messages if self.messages else math.nan

    @property
    def frames_per_message(self) -> float:
        return self.frames / self.messages if self.messages else math.nan


def codec_cells(values: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[tuple[str, str], CodecCell]:
    """``{(direction, op): CodecCell}`` from parsed /metrics values."""
    cells = {}
    for direction in ("request", "output"):
        for op in ("encode", "decode"):
            key = frozenset({("direction", direction), ("op", op)})
            cells[(direction, op)] = CodecCell(
                values.get((CODEC_MESSAGES, key), 0.0),
                values.get((CODEC_SECONDS, key), 0.0),
                values.get((CODEC_BYTES, key), 0.0),
                values.get((CODEC_FRAMES, key), 0.0),
                values.get((CODEC_CPU_SECONDS_TOTAL, key), math.nan),
            )
    return cells
