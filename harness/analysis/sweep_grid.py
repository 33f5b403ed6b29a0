"""The grid of a sweep: its axes (payload: image side or prompt length; rate), their points and names.

Plain values that the sweep document stores (``Axis.to_dict``) and that plots
and crossings read back (``axes_of``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

IMAGE_SIDE, PROMPT_LEN, REQUEST_RATE = "image_side", "prompt_len", "request_rate"
AXIS_TEXT = {
    IMAGE_SIDE: ("image side", "px"),
    PROMPT_LEN: ("prompt length", "tokens"),
    REQUEST_RATE: ("request rate", "req/s"),
}
PAYLOAD_AXES = (IMAGE_SIDE, PROMPT_LEN)


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[float, ...]

    @property
    def label(self) -> str:
        return AXIS_TEXT[self.name][0]

    @property
    def unit(self) -> str:
        return AXIS_TEXT[self.name][1]

    def text(self, value: float) -> str:
        """One point in words: "image 64 px", "prompt 550 tokens", "20 req/s"."""
        v = f"{value:g}"
        if self.name == IMAGE_SIDE:
            return f"image {v} px"
        if self.name == PROMPT_LEN:
            return f"prompt {v} tokens"
        return f"{v} req/s"

    def slug(self, value: float) -> str:
        return {IMAGE_SIDE: "image", PROMPT_LEN: "prompt", REQUEST_RATE: "rate"}[self.name] + f"-{value:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "unit": self.unit, "values": list(self.values)}


def parse_values(text: str, what: str, integer: bool) -> tuple[float, ...]:
    """``64,128,256`` → ascending positive numbers (ValueError naming the flag otherwise)."""
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = float(int(part)) if integer else float(part)
        except ValueError:
            raise ValueError(f"{what}: {part!r} is not a {'whole ' if integer else ''}number") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{what}: values must be positive and finite, got {part}")
        out.append(value)
    if not out:
        raise ValueError(f"{what}: no value given")
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: a value is repeated")
    return tuple(sorted(out))


def payload_axis(axes: Sequence[Axis]) -> Axis | None:
    return next((a for a in axes if a.name in PAYLOAD_AXES), None)


def rate_axis(axes: Sequence[Axis]) -> Axis | None:
    return next((a for a in axes if a.name == REQUEST_RATE), None)


def x_axis(axes: Sequence[Axis]) -> Axis:
    """The axis the e2e curves run along: the rate when there is one (the saturation knee), else the payload."""
    return rate_axis(axes) or axes[0]


def grid(axes: Sequence[Axis]) -> list[dict[str, float]]:
    points: list[dict[str, float]] = [{}]
    for axis in axes:
        points = [{**p, axis.name: v} for p in points for v in axis.values]
    return points


def point_label(axes: Sequence[Axis], at: dict[str, float]) -> str:
    return ", ".join(a.text(at[a.name]) for a in axes if a.name in at)


def point_slug(axes: Sequence[Axis], at: dict[str, float]) -> str:
    return "-".join(a.slug(at[a.name]) for a in axes if a.name in at)


def axes_of(doc: dict[str, Any]) -> list[Axis]:
    """The axes a sweep document was run over."""
    return [Axis(a["name"], tuple(a["values"])) for a in doc["axes"]]
