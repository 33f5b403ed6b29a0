"""Timing each codec on a message, against one memcpy of the message's bytes.

For every codec x payload cell, in one process (``one_torch_thread`` pins torch
to one thread: intra-op threads add noise and nothing here):

- encode time: ``codec.encode(msg)`` on the same message object every
  iteration (nothing cached between iterations; an image is re-read each time);
- decode time: ``codec.decode(frames, MsgType)`` where ``frames`` are the
  encoded frames copied once, outside the clock, into fresh ``bytes`` objects,
  as a receive buffer would hold them;
- wire bytes (sum over frames) and frame count of one encode;
- the physical reference: one memcpy of the payload's bytes
  (``harness.micro.payloads.payload_nbytes``), timed as ``numpy.copyto``
  between two preallocated uint8 arrays. It includes numpy's call overhead (a
  few hundred ns), which dominates for kilobyte payloads;
- ratio = (encode median + decode median) / memcpy median.

Each measurement first warms up, then times single calls with
``time.perf_counter_ns`` until it has at least ``min_iterations`` samples and
``min_time_s`` seconds; the garbage collector is paused while the clock runs
(as ``timeit`` does) and collected between measurements. Reported figures are
the median (p50) and the 99th percentile (p99, linear interpolation).

A cell is checked before it is timed: the decoded message must equal the one
encoded (a wrong codec is not fast), and a codec's failure becomes the cell's
status, never an exception out of the run.

A path payload (``harness.micro.token_path``, ``text-550-path``) times more than a codec:
encode is the frontend's ids from the tokenizer's output plus the encode, decode is the decode
plus the engine's model-input tensor of the prompt; it is checked the same way (the tensor must
hold the prompt's ids) and has no adapter figure.

A codec with an adapter (``vllm``: our message to vLLM's own and back,
``wirecodecs.CodecCalls``) is timed on its native message: encode is
``encode_native(native)``, decode ``decode_native(frames)``, as a server built
on those messages runs them. The adapter (``to_native`` then ``from_native``)
is timed on its own (``adapt``), outside encode, decode and the ratio; the
round-trip check compares the decoded message with the adapter's own round
trip (what the adapter does to a message is checked by the conformance suite).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch
from PIL import Image

import wirecodecs
from harness.loadgen.sysinfo import collect_sysinfo
from harness.micro import delivery
from harness.micro.payloads import PAYLOADS, payload_nbytes
from harness.micro.token_path import PATH_PAYLOADS, PathCalls, TokenPath
from harness.wire.messages import EngineCoreRequest

DEFAULT_MIN_ITERATIONS = 200
DEFAULT_MIN_TIME_S = 0.5
# The delivery table's memcpy reference: short, the delivery figures are far noisier.
DELIVERY_MEMCPY_ITERATIONS = 50
DELIVERY_MEMCPY_TIME_S = 0.1

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


def copy_arrays(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """A source and a destination of ``nbytes``, both touched (no page faults inside the clock)."""
    src = np.full(max(nbytes, 1), 0x5A, dtype=np.uint8)[:nbytes]
    return src, np.zeros_like(src)


def time_memcpy(nbytes: int, min_iterations: int, min_time_s: float) -> Timing:
    """One copy of ``nbytes`` between preallocated arrays (both touched first)."""
    src, dst = copy_arrays(nbytes)
    return time_calls(lambda: np.copyto(dst, src), min_iterations, min_time_s)


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size, from sysfs (32 MiB where it cannot be read)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        with suppress(ValueError):
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 << 20)


def time_memcpy_cold(nbytes: int, iterations: int) -> Timing:
    """``time_memcpy`` with neither array in cache: before each timed copy, a buffer of twice the
    last-level cache is written. A delivery's copy meets that state: on the development VM a 12.6 MB
    copy slows as if its arrays were evicted within 1-2 ms even while the process only spins (other
    tenants, we infer; scripts/studies/copy_after_idle/), and a send's copy comes ~0.5 ms or more after the
    last one ended. Repeated back to back, the copy keeps its arrays in the 32 MiB L3 and is up to ~2x faster."""
    src, dst = copy_arrays(nbytes)
    evict = np.zeros(2 * last_level_cache_bytes(), dtype=np.uint8)

    def write_through_the_cache() -> None:
        evict[::64] += 1  # one write per cache line

    return time_copies_after(src, dst, write_through_the_cache, iterations)


def time_copies_after(src: np.ndarray, dst: np.ndarray, before: Callable[[], Any] | None, iterations: int) -> Timing:
    """``iterations`` copies of ``src`` into ``dst``, each after ``before()`` (outside the clock); one more
    first warms the call path up and is not a sample."""
    samples = []
    for _ in range(iterations + 1):
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        np.copyto(dst, src)
        samples.append(time.perf_counter_ns() - t0)
    return Timing.from_ns(samples[1:])


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Pin torch to one intra-op thread for the block, then restore the caller's count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_metadata() -> dict[str, Any]:
    """Versions and machine facts (without the hostname), plus torch's thread count."""
    return {**collect_sysinfo(hostname=False), "torch_threads": torch.get_num_threads()}


# --- one cell ----------------------------------------------------------------


@dataclass
class MicroCell:
    codec: str
    payload: str
    status: str  # "ok" | "unsupported" | "error"
    reason: str | None = None
    encode: Timing | None = None
    decode: Timing | None = None
    wire_bytes: int | None = None
    frames: int | None = None
    adapt: Timing | None = None  # the codec's adapter, both ways (None: it has none)


def _clip(text: str, limit: int = 80) -> str:
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


def measure_cell(codec_name: str, payload: str, msg: Any, min_iterations: int, min_time_s: float) -> MicroCell:
    """Time one codec on one message; never raises for a codec's failure."""
    try:
        codec = wirecodecs.get_codec(codec_name)
        calls = wirecodecs.CodecCalls(codec)
        try:
            native = calls.to_native(msg)
            frames = calls.encode(native)
        except wirecodecs.UnsupportedPayloadError as exc:
            return MicroCell(codec_name, payload, "unsupported", f"cannot carry {exc.type_name}")
        except wirecodecs.EncodeError as exc:
            return MicroCell(codec_name, payload, "unsupported", _clip(str(exc)))
        # Fresh bytes, as frames arrive in a receive buffer; copied once, untimed.
        wire = [bytes(f) for f in frames]
        msg_type = type(msg)
        expected = calls.from_native(native, msg_type) if calls.adapts else msg
        check_round_trip(expected, calls.from_native(calls.decode(wire, msg_type), msg_type))
        encode = time_calls(lambda: calls.encode(native), min_iterations, min_time_s)
        decode = time_calls(lambda: calls.decode(wire, msg_type), min_iterations, min_time_s)
        adapt = None
        if calls.adapts:
            adapt = time_calls(lambda: calls.from_native(calls.to_native(msg), msg_type), min_iterations, min_time_s)
        return MicroCell(
            codec_name,
            payload,
            "ok",
            None,
            encode,
            decode,
            wire_bytes=sum(len(f) for f in wire),
            frames=len(wire),
            adapt=adapt,
        )
    except Exception as exc:  # one broken cell must not stop the run
        return MicroCell(codec_name, payload, "error", _clip(f"{type(exc).__name__}: {exc}"))


def measure_path_cell(
    codec_name: str, payload: str, path: TokenPath, min_iterations: int, min_time_s: float
) -> MicroCell:
    """Time one codec's path for a prompt's ids (``harness.micro.token_path``): encode = the frontend's
    ids from the tokenizer's output and the encode, decode = the decode and the engine's model input."""
    try:
        calls = PathCalls(codec_name, path)
        try:
            frames = calls.send()
        except wirecodecs.UnsupportedPayloadError as exc:
            return MicroCell(codec_name, payload, "unsupported", f"cannot carry {exc.type_name}")
        except wirecodecs.EncodeError as exc:
            return MicroCell(codec_name, payload, "unsupported", _clip(str(exc)))
        wire = [bytes(f) for f in frames]  # fresh bytes, as a receive buffer holds them; untimed
        calls.check(wire)
        encode = time_calls(calls.send, min_iterations, min_time_s)
        decode = time_calls(lambda: calls.receive(wire), min_iterations, min_time_s)
        size = sum(len(f) for f in wire)
        return MicroCell(codec_name, payload, "ok", None, encode, decode, wire_bytes=size, frames=len(wire))
    except Exception as exc:  # one broken cell must not stop the run
        return MicroCell(codec_name, payload, "error", _clip(f"{type(exc).__name__}: {exc}"))


# --- whole runs --------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One cell with its payload's bytes and memcpy reference (None: the payload could not be built)."""

    cell: MicroCell
    payload_bytes: int | None
    memcpy: Timing | None

    @property
    def ratio(self) -> float | None:
        """(encode p50 + decode p50) / memcpy p50; None where the cell or the reference did not run."""
        enc, dec, ref = self.cell.encode, self.cell.decode, self.memcpy
        if enc is None or dec is None or ref is None or ref.p50_us <= 0:
            return None
        return (enc.p50_us + dec.p50_us) / ref.p50_us


def payload_reference(
    payload: str, min_iterations: int, min_time_s: float
) -> tuple[Any, int | None, Timing | None, str]:
    """A named payload's message, its bytes and their memcpy; where it cannot be built, Nones and why."""
    try:
        msg = PATH_PAYLOADS[payload]() if payload in PATH_PAYLOADS else PAYLOADS[payload]()
        n = payload_nbytes(msg.request if isinstance(msg, TokenPath) else msg)
        return msg, n, time_memcpy(n, min_iterations, min_time_s), ""
    except Exception as exc:
        return None, None, None, _clip(f"building payload: {type(exc).__name__}: {exc}")


def measure(
    codecs: Sequence[str], payloads: Sequence[str], min_iterations: int, min_time_s: float
) -> Iterator[Measurement]:
    """Every codec on every named payload (``PAYLOADS`` or ``PATH_PAYLOADS``), payload by payload; each
    cell is yielded as it is measured, so a caller can print it at once. Pin threads around it
    (``one_torch_thread``). A path's bytes and memcpy reference are its request's."""
    for payload in payloads:
        msg, nbytes, memcpy, reason = payload_reference(payload, min_iterations, min_time_s)
        for codec in codecs:
            if msg is None:
                cell = MicroCell(codec, payload, "error", reason)
            elif isinstance(msg, TokenPath):
                cell = measure_path_cell(codec, payload, msg, min_iterations, min_time_s)
            else:
                cell = measure_cell(codec, payload, msg, min_iterations, min_time_s)
            yield Measurement(cell, nbytes, memcpy)


@dataclass(frozen=True)
class DeliveryMeasurement:
    """One delivery (``harness.micro.delivery``) with the memcpy reference of its payload."""

    delivery: delivery.Delivery
    memcpy: Timing
    # The same copy with both arrays out of cache (``time_memcpy_cold``): what the copy part can reach.
    memcpy_cold: Timing | None = None

    @property
    def ratio(self) -> float:
        return self.delivery.p50_us / self.memcpy.p50_us if self.memcpy.p50_us > 0 else float("nan")


def measure_delivery(
    codecs: Sequence[str], payloads: Sequence[str], transports: Sequence[tuple[str, str]], iterations: int
) -> Iterator[DeliveryMeasurement]:
    """Each codec x (transport, variant) x named payload, ``iterations`` one-at-a-time sends; yielded as
    measured. A variant of "" is the transport as bench serve serves it."""
    for payload in payloads:
        build = PAYLOADS[payload]
        nbytes = payload_nbytes(build())
        memcpy = time_memcpy(nbytes, DELIVERY_MEMCPY_ITERATIONS, DELIVERY_MEMCPY_TIME_S)
        memcpy_cold = time_memcpy_cold(nbytes, DELIVERY_MEMCPY_ITERATIONS)
        for codec in codecs:
            for transport, variant in transports:
                d = delivery.measure(codec, transport, payload, build(), iterations=iterations, variant=variant)
                yield DeliveryMeasurement(d, memcpy, memcpy_cold)
