"""Arms: what differs between the sides of a comparison (a codec on a transport), and their order.

An arm is a label, a codec (with calibration options if any) and a transport.
The same codec twice is an A/A arm labelled ``NAME#2``. Rounds run the arms in
``round_order``: as given on even rounds, reversed on odd ones, so slow drift
of a shared machine lands on every pair of arms alike.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from harness.wire.transport import TRANSPORTS, transport_refusal
from wirecodecs import UnknownCodecError, available_codecs, check_codec_spec

T = TypeVar("T")


@dataclass(frozen=True)
class ArmSpec:
    """One arm of a run: the label in tables and file names, the codec and the transport its server uses."""

    label: str
    codec: str
    transport: str = "zmq"

    def unsupported(self) -> str | None:
        """Why this arm cannot run at all (said in the table instead of starting a server), or None."""
        return transport_refusal(self.codec, self.transport)


def parse_arms(codec_spec: str, transport_spec: str = "zmq") -> list[ArmSpec]:
    """Every codec × transport (codec-major); labels carry the transport when several are compared."""
    transports = [t.strip() for t in transport_spec.split(",") if t.strip()]
    bad = [t for t in transports if t not in TRANSPORTS]
    if bad or not transports:
        raise ValueError(
            f"unknown transport(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(TRANSPORTS)}"
        )
    transports = list(dict.fromkeys(transports))
    arms = []
    for codec_arm in parse_codecs(codec_spec):
        for t in transports:
            label = codec_arm.label if len(transports) == 1 else f"{codec_arm.label}/{t}"
            arms.append(ArmSpec(label, codec_arm.codec, t))
    return arms


def parse_codecs(spec: str) -> list[ArmSpec]:
    """``--codec``: names (with calibration options), comma-separated, or 'all'. A repeated codec gets NAME#2."""
    known = available_codecs()
    names = known if spec.strip() == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError(f"no codec given; available: {', '.join(known)}, or all")
    bad = []
    for name in dict.fromkeys(names):
        try:
            check_codec_spec(name)
        except UnknownCodecError:
            bad.append(name)
    if bad:
        raise ValueError(f"unknown codec(s) {', '.join(bad)}; available: {', '.join(known)}, or all")
    arms: list[ArmSpec] = []
    for name in names:
        seen = sum(1 for a in arms if a.codec == name)
        arms.append(ArmSpec(name if not seen else f"{name}#{seen + 1}", name))
    return arms


def parse_arm_flags(specs: Sequence[str], arms: Sequence[ArmSpec]) -> dict[str, tuple[str, ...]]:
    """``--arm-flags LABEL='--flag value'`` (repeatable): extra bench serve flags for one arm."""
    labels = {a.label for a in arms}
    out: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        label, sep, flags = spec.partition("=")
        if not sep or label not in labels:
            raise ValueError(
                f"--arm-flags {spec!r}: expected LABEL=FLAGS with LABEL one of {', '.join(sorted(labels))}"
            )
        out[label] = (*out.get(label, ()), *shlex.split(flags))
    return out


def round_order(arms: list[T], rnd: int) -> list[T]:
    """The arms in round ``rnd`` (or block): as given on even ones, reversed on odd ones (drift cancels in pairs)."""
    return arms if rnd % 2 == 0 else arms[::-1]
