"""A calibration codec: any codec plus a known, busy-waited cost per message.

    pickle+request-delay=500us     each EngineCoreRequest encode and decode spends 500 µs more
    msgspec+output-delay=20us      each EngineCoreOutputs encode and decode spends 20 µs more
    pickle+delay=1ms               every request and output encode and decode (not aborts)

The cost is a spin on ``time.perf_counter_ns`` that holds the GIL, as codec
work does, so it competes for the CPU like a slower codec would. A
request-delay of D adds 2·D of work to each request's path (frontend encode +
engine decode); an output-delay adds 2·D to every engine step's outputs, which
all requests of the batch wait for. With it, ``bench run`` can show it finds an
injected cost of known size, and what the smallest detectable one is
(``bench calibrate``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from .base import Codec, Frame, Frames

T = TypeVar("T")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|µs|ms|s)$")
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
# Which message types each option delays (by type name: base codecs may not import the messages).
OPTIONS: dict[str, tuple[str, ...]] = {
    "delay": ("EngineCoreRequest", "EngineCoreOutputs"),
    "request-delay": ("EngineCoreRequest",),
    "output-delay": ("EngineCoreOutputs",),
}


def parse_duration_ns(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"bad duration {text!r}: a number with a unit ns, us, ms or s (e.g. 500us)")
    return round(float(match.group(1)) * _UNIT_NS[match.group(2)])


def parse_options(spec: Sequence[str]) -> dict[str, int]:
    """``["request-delay=500us", ...]`` → ns per message type name."""
    delays: dict[str, int] = {}
    for option in spec:
        key, sep, value = option.partition("=")
        if not sep or key not in OPTIONS:
            raise ValueError(f"unknown codec option {option!r}; options: {', '.join(f'{k}=DURATION' for k in OPTIONS)}")
        ns = parse_duration_ns(value)
        for type_name in OPTIONS[key]:
            delays[type_name] = delays.get(type_name, 0) + ns
    return delays


def spin_ns(ns: int) -> None:
    """Busy-wait ``ns`` nanoseconds, holding the CPU (and the GIL) like real codec work."""
    deadline = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < deadline:
        pass


class DelayedCodec(Codec):
    """``inner`` plus a fixed busy-waited cost per encode and decode of the chosen message types.

    Never registered: ``get_codec`` wraps the codec named before the ``+``, and the registry
    reads a spec's facts from that codec's class. An instance repeats them for whoever holds it.
    """

    name: ClassVar[str] = "delayed"  # per instance: the full spec, e.g. "pickle+request-delay=500us"

    def __init__(self, inner: Codec, spec: str, delays_ns: dict[str, int]) -> None:
        self.inner = inner
        self.delays_ns = dict(delays_ns)
        # The class's facts are declared ClassVars; a wrapper's are its inner codec's, per instance.
        self.name = spec  # type: ignore[misc]
        self.carries_multimodal = inner.carries_multimodal  # type: ignore[misc]
        self.multimodal_kinds = inner.multimodal_kinds  # type: ignore[misc]
        self.out_of_band = inner.out_of_band  # type: ignore[misc]
        self.packed_token_ids = inner.packed_token_ids  # type: ignore[misc]
        self.unpickles_peer_data = inner.unpickles_peer_data  # type: ignore[misc]
        self.alternatives = inner.alternatives

    def encode(self, msg: Any) -> Frames:
        frames = self.inner.encode(msg)
        spin_ns(self.delays_ns.get(type(msg).__name__, 0))
        return frames

    def decode(self, frames: Sequence[Frame], msg_type: type[T]) -> T:
        msg = self.inner.decode(frames, msg_type)
        spin_ns(self.delays_ns.get(msg_type.__name__, 0))
        return msg
