"""``bench micro``: time each codec on fixed payloads against one memcpy.

For every codec x payload cell this measures, in one process with torch pinned
to one thread:

- encode time: ``codec.encode(msg)`` on the same message object every
  iteration (nothing cached between iterations; an image is re-read each time);
- decode time: ``codec.decode(frames, MsgType)`` where ``frames`` are the
  encoded frames copied once, outside the clock, into fresh ``bytes`` objects,
  as a receive buffer would hold them;
- wire bytes (sum over frames) and frame count of one encode;
- the physical reference: one memcpy of the payload's bytes (below), timed as
  ``numpy.copyto`` between two preallocated uint8 arrays. It includes numpy's
  call overhead (a few hundred ns), which dominates for kilobyte payloads;
- ratio = (encode median + decode median) / memcpy median.

Payload bytes, precisely: 8 bytes per token id (``prompt_token_ids`` of a
request, ``new_token_ids`` of every output, as int64), plus the UTF-8 bytes of
the prompt string and of every request id, plus the raw pixel bytes of each
image (width x height x 3 for RGB) and the raw bytes of each tensor
(numel x element size). Sampling parameters, timestamps, hashes, placeholders
and counters are small metadata and are not counted.

Timing: each cell first warms up, then times single calls with
``time.perf_counter_ns`` until it has at least ``--min-iterations`` samples and
``--min-time`` seconds; the garbage collector is paused while the clock runs
(as ``timeit`` does) and collected between measurements. Reported figures are
the median (p50) and the 99th percentile (p99, linear interpolation).

``--json PATH`` writes a JSON list with one object per cell (see
``cell_record``); every object carries the run's metadata so it stands alone.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
from PIL import Image

import wirecodecs
from harness import delivery
from harness.loadgen.sysinfo import collect_sysinfo
from harness.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    PlaceholderRange,
    SamplingParams,
    pack_token_ids,
)
from harness.table import format_line

# 2: metadata is loadgen.sysinfo's (library versions under "libraries").
SCHEMA_VERSION = 2
DEFAULT_MIN_ITERATIONS = 200
DEFAULT_MIN_TIME_S = 0.5

# --- statistics (pure) -------------------------------------------------------


def median(samples: Sequence[float]) -> float:
    return float(np.median(samples))


def p99(samples: Sequence[float]) -> float:
    """99th percentile, linear interpolation (numpy's default, as the load generator uses)."""
    return float(np.percentile(samples, 99.0))


@dataclass(frozen=True)
class Timing:
    """Summary of one timed loop, in microseconds."""

    p50_us: float
    p99_us: float
    min_us: float
    iterations: int

    @classmethod
    def from_ns(cls, samples_ns: Sequence[int]) -> Timing:
        return cls(
            p50_us=median(samples_ns) / 1e3,
            p99_us=p99(samples_ns) / 1e3,
            min_us=min(samples_ns) / 1e3,
            iterations=len(samples_ns),
        )


# --- adaptive timing loop ----------------------------------------------------


def time_calls(fn: Callable[[], Any], min_iterations: int, min_time_s: float) -> Timing:
    """Warm up, then time single calls of ``fn`` until both minimums are met."""
    clock = time.perf_counter_ns
    min_time_ns = int(min_time_s * 1e9)
    # Warm-up: fills caches, lazily built decoders and allocator pools.
    warm_until = clock() + min_time_ns // 10
    for _ in range(max(2, min_iterations // 10)):
        fn()
    while clock() < warm_until:
        fn()
    samples: list[int] = []
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = clock()
        while len(samples) < min_iterations or clock() - start < min_time_ns:
            t0 = clock()
            fn()
            samples.append(clock() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Timing.from_ns(samples)


def time_memcpy(nbytes: int, min_iterations: int, min_time_s: float) -> Timing:
    """One copy of ``nbytes`` between preallocated arrays (both touched first)."""
    src = np.full(max(nbytes, 1), 0x5A, dtype=np.uint8)[:nbytes]
    dst = np.zeros_like(src)
    return time_calls(lambda: np.copyto(dst, src), min_iterations, min_time_s)


# --- payloads ----------------------------------------------------------------

SEED = 1234
VOCAB = 32000
PROMPT_TOKENS = 550
OUTPUT_BATCH = 64
# LLaVA-1.5 resizes every image to 336x336 and gives it 24x24 = 576 tokens,
# so both image sizes occupy the same placeholder.
IMAGE_TOKENS = 576
IMAGE_TOKEN_ID = 31999

_WORDS = [
    "shall",
    "compare",
    "thee",
    "summer",
    "day",
    "thou",
    "art",
    "more",
    "lovely",
    "temperate",
    "rough",
    "winds",
    "do",
    "shake",
    "darling",
    "buds",
    "may",
    "lease",
    "hath",
    "all",
    "too",
    "short",
    "date",
    "sometime",
    "hot",
    "eye",
    "heaven",
    "shines",
    "often",
    "his",
    "gold",
    "complexion",
    "dimmed",
    "every",
    "fair",
    "from",
    "declines",
    "chance",
    "nature",
    "changing",
    "course",
    "untrimmed",
    "eternal",
    "shall",
    "not",
    "fade",
    "nor",
    "lose",
    "possession",
    "ow'st",
    "death",
    "brag",
    "wander'st",
    "shade",
    "when",
    "lines",
    "time",
    "grow'st",
]


def _request_id(rng: random.Random) -> str:
    return f"cmpl-{rng.getrandbits(128):032x}-0"


def _prompt_text(rng: random.Random, nbytes: int = 2048) -> str:
    lines: list[str] = []
    size = 0
    while size < nbytes:
        line = " ".join(rng.choice(_WORDS) for _ in range(8)).capitalize() + ","
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:nbytes]


def _sampling_params() -> SamplingParams:
    # Many non-default fields, as an OpenAI-compatible client would send them.
    return SamplingParams(
        temperature=0.7,
        top_p=0.95,
        top_k=50,
        min_p=0.05,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        repetition_penalty=1.05,
        seed=42,
        stop=["\n\n", "###", "</s>"],
        stop_token_ids=[2, 13, 29871],
        include_stop_str_in_output=True,
        max_tokens=150,
        min_tokens=1,
        logprobs=1,
        skip_special_tokens=False,
        logit_bias={50256: -100.0, 198: 2.5},
    )


def text_request(extra_tokens: int = 0) -> EngineCoreRequest:
    """The sonnet-size text request; ``extra_tokens`` placeholder ids follow the first token."""
    rng = random.Random(SEED)
    ids = [rng.randrange(VOCAB - 1) for _ in range(PROMPT_TOKENS)]
    ids[1:1] = [IMAGE_TOKEN_ID] * extra_tokens
    return EngineCoreRequest(
        request_id=_request_id(rng),
        prompt=_prompt_text(rng),
        prompt_token_ids=ids,
        sampling_params=_sampling_params(),
        eos_token_id=2,
        arrival_time=1_700_000_000.123456,
    )


def _with_mm(item: Any, raw: bytes) -> EngineCoreRequest:
    req = text_request(extra_tokens=IMAGE_TOKENS)
    req.mm_inputs = [item]
    req.mm_hashes = [hashlib.sha256(raw).hexdigest()]
    req.mm_placeholders = [PlaceholderRange(offset=1, length=IMAGE_TOKENS)]
    return req


def image_request(side: int) -> EngineCoreRequest:
    pixels = np.random.default_rng(SEED).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return _with_mm(Image.fromarray(pixels, "RGB"), pixels.tobytes())


def tensor_request(dtype: torch.dtype, side: int) -> EngineCoreRequest:
    gen = torch.Generator().manual_seed(SEED)
    pixel_values = torch.rand((1, 3, side, side), generator=gen).to(dtype)
    raw = pixel_values.view(torch.uint8).numpy().tobytes()
    return _with_mm({"pixel_values": pixel_values}, raw)


def packed(req: EngineCoreRequest) -> EngineCoreRequest:
    req.prompt_token_ids = pack_token_ids(req.prompt_token_ids)
    return req


def outputs_batch() -> EngineCoreOutputs:
    """One decode step: 64 requests with one new token each."""
    rng = random.Random(SEED)
    outputs = [
        EngineCoreOutput(request_id=_request_id(rng), new_token_ids=[rng.randrange(VOCAB)]) for _ in range(OUTPUT_BATCH)
    ]
    return EngineCoreOutputs(
        outputs=outputs,
        step_index=5400,
        step_start_time=1_700_000_100.25,
        timestamp=1_700_000_100.2731,
    )


# name -> builder; built lazily so a filtered run pays only for what it uses.
PAYLOADS: dict[str, Callable[[], Any]] = {
    "text-550": text_request,
    # The same request with its ids already packed as int32 (what msgspec-packed is given).
    "text-550-packed": lambda: packed(text_request()),
    "outputs-64": outputs_batch,
    "image-336": lambda: image_request(336),
    "image-1024": lambda: image_request(1024),
    "tensor-fp16-336": lambda: tensor_request(torch.float16, 336),
    "tensor-fp32-1024": lambda: tensor_request(torch.float32, 1024),
}


def _mm_nbytes(item: Any) -> int:
    if isinstance(item, Image.Image):
        return len(item.tobytes())
    if isinstance(item, torch.Tensor):
        return item.numel() * item.element_size()
    if isinstance(item, np.ndarray):
        return item.nbytes
    if isinstance(item, dict):
        return sum(_mm_nbytes(v) for v in item.values())
    raise TypeError(f"unexpected multimodal input {type(item).__name__}")


def payload_nbytes(msg: Any) -> int:
    """The payload's bytes as defined in the module docstring."""
    if isinstance(msg, EngineCoreRequest):
        n = 8 * len(msg.prompt_token_ids) + len(msg.request_id.encode())
        n += len(msg.prompt.encode()) if msg.prompt else 0
        return n + sum(_mm_nbytes(item) for item in msg.mm_inputs or ())
    if isinstance(msg, EngineCoreOutputs):
        return sum(8 * len(o.new_token_ids) + len(o.request_id.encode()) for o in msg.outputs)
    raise TypeError(f"no payload size defined for {type(msg).__name__}")


# --- one cell ----------------------------------------------------------------


@dataclass
class Cell:
    codec: str
    payload: str
    status: str  # "ok" | "unsupported" | "error"
    reason: str | None = None
    encode: Timing | None = None
    decode: Timing | None = None
    wire_bytes: int | None = None
    frames: int | None = None


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _same_mm(a: Any, b: Any) -> bool:
    if isinstance(a, Image.Image):
        return isinstance(b, Image.Image) and a.size == b.size and a.tobytes() == b.tobytes()
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_mm(a[k], b[k]) for k in a)
    return a == b


def check_round_trip(sent: Any, got: Any) -> None:
    """Raise if a decoded message differs from the one encoded (a wrong codec is not fast)."""
    if type(got) is not type(sent):
        raise AssertionError(f"decoded a {type(got).__name__}, sent a {type(sent).__name__}")
    if isinstance(sent, EngineCoreRequest):
        mm_sent, mm_got = sent.mm_inputs or [], got.mm_inputs or []
        rest: dict[str, Any] = {"mm_inputs": None, "prompt_token_ids": []}  # compared on their own
        same = (
            msgspec.structs.replace(sent, **rest) == msgspec.structs.replace(got, **rest)
            and np.array_equal(np.asarray(sent.prompt_token_ids), np.asarray(got.prompt_token_ids))
            and len(mm_sent) == len(mm_got)
            and all(_same_mm(a, b) for a, b in zip(mm_sent, mm_got))
        )
    else:
        same = sent == got
    if not same:
        raise AssertionError("round trip changed the message")


def measure_cell(codec_name: str, payload: str, msg: Any, min_iterations: int, min_time_s: float) -> Cell:
    """Time one codec on one message; never raises for a codec's failure."""
    try:
        codec = wirecodecs.get_codec(codec_name)
        try:
            frames = codec.encode(msg)
        except wirecodecs.UnsupportedPayloadError as exc:
            return Cell(codec_name, payload, "unsupported", f"cannot carry {exc.type_name}")
        except wirecodecs.EncodeError as exc:
            return Cell(codec_name, payload, "unsupported", _short(str(exc)))
        # Fresh bytes, as frames arrive in a receive buffer; copied once, untimed.
        wire = [bytes(f) for f in frames]
        msg_type = type(msg)
        check_round_trip(msg, codec.decode(wire, msg_type))
        encode = time_calls(lambda: codec.encode(msg), min_iterations, min_time_s)
        decode = time_calls(lambda: codec.decode(wire, msg_type), min_iterations, min_time_s)
        return Cell(
            codec_name,
            payload,
            "ok",
            None,
            encode,
            decode,
            wire_bytes=sum(len(f) for f in wire),
            frames=len(wire),
        )
    except Exception as exc:  # one broken cell must not stop the run
        return Cell(codec_name, payload, "error", _short(f"{type(exc).__name__}: {exc}"))


# --- metadata and output -----------------------------------------------------


def run_metadata() -> dict[str, Any]:
    """Versions and machine facts (without the hostname), plus torch's thread count."""
    return {**collect_sysinfo(hostname=False), "torch_threads": torch.get_num_threads()}


def machine_line(meta: dict[str, Any]) -> str:
    libs = meta["libraries"]
    return (
        f"CPU: {meta['cpu_model']} ({meta['cpu_count']} cores) | "
        f"Python {meta['python']} | torch {libs['torch']} (threads pinned to "
        f"{meta['torch_threads']}) | msgspec {libs['msgspec']} | pyzmq {libs['pyzmq']}"
    )


def cell_record(
    cell: Cell,
    payload_bytes: int | None,
    memcpy: Timing | None,
    settings: dict[str, Any],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """One JSON object per cell; times in µs, None where the cell did not run."""
    rec: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "codec": cell.codec,
        "payload": cell.payload,
        "status": cell.status,
        "reason": cell.reason,
    }
    for name, t in (("encode", cell.encode), ("decode", cell.decode)):
        rec[f"{name}_p50_us"] = t.p50_us if t else None
        rec[f"{name}_p99_us"] = t.p99_us if t else None
        rec[f"{name}_min_us"] = t.min_us if t else None
        rec[f"{name}_iterations"] = t.iterations if t else None
    rec["wire_bytes"] = cell.wire_bytes
    rec["frames"] = cell.frames
    rec["payload_bytes"] = payload_bytes
    rec["memcpy_p50_us"] = memcpy.p50_us if memcpy else None
    rec["memcpy_iterations"] = memcpy.iterations if memcpy else None
    rec["ratio"] = _ratio(cell, memcpy)
    rec["settings"] = settings
    rec["metadata"] = meta
    return rec


def _ratio(cell: Cell, memcpy: Timing | None) -> float | None:
    if cell.encode is None or cell.decode is None or memcpy is None or memcpy.p50_us <= 0:
        return None
    return (cell.encode.p50_us + cell.decode.p50_us) / memcpy.p50_us


def _us(x: float) -> str:
    return f"{x:,.2f}" if x < 100 else f"{x:,.1f}" if x < 10_000 else f"{x:,.0f}"


def _ratio_text(r: float) -> str:
    return f"{r:,.0f}" if r >= 100 else f"{r:.1f}" if r >= 10 else f"{r:.2f}" if r >= 1 else f"{r:.3f}"


# Fixed widths (title, width), so rows can print as they are measured;
# the codec and payload columns are left-aligned.
COLUMNS = [
    ("codec", 14),
    ("payload", 17),
    ("enc p50 µs", 11),
    ("enc p99 µs", 11),
    ("dec p50 µs", 11),
    ("dec p99 µs", 11),
    ("bytes", 12),
    ("frames", 6),
    ("memcpy µs", 10),
    ("ratio", 8),
]
_WIDTHS = [w for _, w in COLUMNS]


def _row(values: Sequence[str]) -> str:
    return format_line(values, _WIDTHS, left=2)


def header_lines() -> list[str]:
    titles = _row([t for t, _ in COLUMNS])
    return [titles, "-" * len(titles)]


def format_row(cell: Cell, memcpy: Timing | None) -> str:
    memcpy_text = _us(memcpy.p50_us) if memcpy else "-"
    if cell.status != "ok" or cell.encode is None or cell.decode is None:
        return _row([cell.codec, cell.payload, f"{cell.status}: {cell.reason}"])
    ratio = _ratio(cell, memcpy)
    return _row(
        [
            cell.codec,
            cell.payload,
            _us(cell.encode.p50_us),
            _us(cell.encode.p99_us),
            _us(cell.decode.p50_us),
            _us(cell.decode.p99_us),
            f"{cell.wire_bytes:,}",
            str(cell.frames),
            memcpy_text,
            _ratio_text(ratio) if ratio is not None else "-",
        ]
    )


# --- command -----------------------------------------------------------------


def parse_names(value: str | None, known: Sequence[str], kind: str) -> list[str]:
    """A comma-separated selection, validated against ``known``; None selects all."""
    if value is None:
        return list(known)
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--{kind} needs at least one name; available: {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {kind} {', '.join(map(repr, unknown))}; available: {', '.join(known)}")
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--codec", metavar="A,B", help="codecs to time (default: all registered)")
    parser.add_argument("--payload", metavar="X,Y", help=f"payloads to time (default: all of {', '.join(PAYLOADS)})")
    parser.add_argument(
        "--min-iterations",
        type=int,
        default=DEFAULT_MIN_ITERATIONS,
        help="timed calls per measurement, at least (default: %(default)s)",
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=DEFAULT_MIN_TIME_S,
        metavar="SECONDS",
        help="seconds per measurement, at least (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write a JSON list, one object per cell")
    parser.add_argument(
        "--transport",
        metavar="X,Y",
        default=None,
        help=f"also time delivery to another process over these transports ({', '.join(delivery.TRANSPORTS)})",
    )
    parser.add_argument("--delivery-iterations", type=int, default=50, help="sends per delivery cell (default 50)")


def main(args: argparse.Namespace) -> int:
    try:
        codecs = parse_names(args.codec, wirecodecs.available_codecs(), "codec")
        payloads = parse_names(args.payload, list(PAYLOADS), "payload")
        transports = parse_names(args.transport, list(delivery.TRANSPORTS), "transport") if args.transport else []
        if args.min_iterations < 1:
            raise ValueError(f"--min-iterations must be at least 1, got {args.min_iterations}")
        if not args.min_time >= 0:
            raise ValueError(f"--min-time must be >= 0, got {args.min_time}")
    except ValueError as exc:
        print(f"bench micro: error: {exc}", file=sys.stderr)
        return 2

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # intra-op threads add noise and nothing here
    try:
        records = _run(codecs, payloads, args.min_iterations, args.min_time)
    finally:
        torch.set_num_threads(threads)

    if transports:
        records += _run_delivery(codecs, payloads, transports, args.delivery_iterations)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


DELIVERY_HEADERS = ["codec", "payload", "transport", "p50 µs", "p99 µs", "memcpy µs", "ratio"]


def _run_delivery(codecs: list[str], payloads: list[str], transports: list[str], iterations: int) -> list[dict]:
    """The delivery table (harness.delivery): each codec × transport × payload against one memcpy."""
    print(
        f"\ndelivery: encode → send → receive in another process → decode, {iterations} one-at-a-time sends; "
        "ratio = p50 / memcpy p50"
    )
    widths = [14, 17, 11, 11, 11, 10, 8]
    head = format_line(DELIVERY_HEADERS, widths, left=3)
    print(head)
    print("-" * len(head))
    records = []
    for payload in payloads:
        msg_builder = PAYLOADS[payload]
        memcpy = time_memcpy(payload_nbytes(msg_builder()), 50, 0.1)
        for codec in codecs:
            for transport_name in transports:
                d = delivery.measure(codec, transport_name, payload, msg_builder(), iterations=iterations)
                if d.status != "ok":
                    row = [codec, payload, transport_name, f"{d.status}: {d.reason}"]
                else:
                    ratio = d.p50_us / memcpy.p50_us if memcpy.p50_us > 0 else float("nan")
                    row = [
                        codec,
                        payload,
                        transport_name,
                        _us(d.p50_us),
                        _us(d.p99_us),
                        _us(memcpy.p50_us),
                        _ratio_text(ratio),
                    ]
                print(format_line(row, widths, left=3), flush=True)
                records.append(
                    {"kind": "delivery", **vars(d), "memcpy_p50_us": memcpy.p50_us, "schema_version": SCHEMA_VERSION}
                )
    return records


def _run(codecs: list[str], payloads: list[str], min_iterations: int, min_time_s: float) -> list[dict]:
    meta = run_metadata()
    settings = {"min_iterations": min_iterations, "min_time_s": min_time_s}
    print(machine_line(meta))
    print(
        f"min {min_iterations} iterations and {min_time_s:g} s per measurement; "
        "ratio = (enc p50 + dec p50) / memcpy p50"
    )
    for line in header_lines():
        print(line)
    records: list[dict] = []
    for payload in payloads:
        try:
            msg = PAYLOADS[payload]()
            nbytes = payload_nbytes(msg)
            memcpy: Timing | None = time_memcpy(nbytes, min_iterations, min_time_s)
        except Exception as exc:
            reason = _short(f"building payload: {type(exc).__name__}: {exc}")
            msg, nbytes, memcpy = None, None, None
        for codec in codecs:
            if msg is None:
                cell = Cell(codec, payload, "error", reason)
            else:
                cell = measure_cell(codec, payload, msg, min_iterations, min_time_s)
            print(format_row(cell, memcpy), flush=True)
            records.append(cell_record(cell, nbytes, memcpy, settings, meta))
    return records
