"""The server's /metrics in Prometheus text format: names, rendering, parsing.

One module so the frontend (which renders) and the load generator (which
reads the codec figures back for its report) agree on every name.

Codec figures are per direction and operation:
  direction="request": frontend encodes EngineCoreRequest, engine decodes it
  direction="output":  engine encodes EngineCoreOutputs, frontend decodes it
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from harness.messages import CodecStats

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
}


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
    """The four codec counters for both directions from the two sides' stats."""
    cells = [
        ("request", "encode", frontend.encode_count, frontend.encode_ns, frontend.encode_bytes, frontend.encode_frames),
        ("request", "decode", engine.decode_count, engine.decode_ns, engine.decode_bytes, engine.decode_frames),
        ("output", "encode", engine.encode_count, engine.encode_ns, engine.encode_bytes, engine.encode_frames),
        ("output", "decode", frontend.decode_count, frontend.decode_ns, frontend.decode_bytes, frontend.decode_frames),
    ]
    out: dict[str, list[tuple[dict[str, str], float]]] = {
        CODEC_MESSAGES: [],
        CODEC_SECONDS: [],
        CODEC_BYTES: [],
        CODEC_FRAMES: [],
    }
    for direction, op, count, ns, nbytes, frames in cells:
        labels = {"direction": direction, "op": op}
        out[CODEC_MESSAGES].append((labels, count))
        out[CODEC_SECONDS].append((labels, ns / 1e9))
        out[CODEC_BYTES].append((labels, nbytes))
        out[CODEC_FRAMES].append((labels, frames))
    return out


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

    def minus(self, before: CodecCell) -> CodecCell:
        return CodecCell(
            self.messages - before.messages,
            self.seconds - before.seconds,
            self.bytes - before.bytes,
            self.frames - before.frames,
        )

    @property
    def us_per_message(self) -> float:
        return self.seconds * 1e6 / self.messages if self.messages else math.nan

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
            )
    return cells
