"""Did the server keep up with the offered load?  A fact of the run, not of the codec.

A server that keeps up admits requests as fast as they are sent: each request's TTFT has no trend over
the run. One that cannot keep up queues them, and each request waits behind the ones before it: with
requests admitted at rate mu while they arrive at lambda, the i-th waits about i/mu - i/lambda, so TTFT
grows with the send time by ``lambda/mu - 1`` seconds a second. ``kept_up`` is mu/lambda, the rate the
server took requests at over the rate offered. TTFT from a run that did not keep up measures the queue,
not the serving path, and no codec's share of it can be read. (TTFT, not E2EL: a batching server
finishes a batch's requests together, so their E2EL falls with the send time whatever the queue does.)

``kept_up`` is estimated from the run's own records: the least-squares slope of TTFT on the planned send
time, within each block of ``--block-size`` (the whole run when there are none: a block starts after the
previous one's requests finished, on an empty queue), over the successful requests. That slope is the
queue's growth; ``kept_up = 1 / (1 + growth)``, capped at 1 (a falling TTFT, e.g. a warming cache, is not
a server ahead of its load). A run at an infinite rate (every request sent at once) offers no rate to
keep up with, and has no such figure.

A server can also keep up on the whole and stall now and then: a few requests wait seconds while the
rest are served in milliseconds. Their waits then set the mean TTFT, which no longer reads the serving
path (the median still does). ``stalled`` says so when the mean is more than ``STALL_RATIO`` times the
median: a ratio a right-skewed but healthy TTFT distribution stays well under (1.0-1.9 on every
real-vLLM and wirebench run in docs/results.md that had no stall).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.loadgen.client import RequestRecord

KEPT_UP_MIN = 0.9  # below this share of the offered rate the run is marked saturated
MIN_REQUESTS = 8  # fewer timed requests than this: no slope worth reading
STALL_RATIO = 3.0  # a mean TTFT above this multiple of the median: a few requests' waits set it


@dataclass(frozen=True)
class KeptUp:
    """How the server kept up with the offered rate over one run."""

    kept_up: float  # achieved rate ÷ offered, at most 1
    growth_ms_per_s: float  # ms of TTFT each request gained per second of the run's sending

    @property
    def saturated(self) -> bool:
        return self.kept_up < KEPT_UP_MIN

    def as_dict(self) -> dict[str, float | bool]:
        return {
            "kept_up": round(self.kept_up, 4),
            "growth_ms_per_s": round(self.growth_ms_per_s, 3),
            "saturated": self.saturated,
            "threshold": KEPT_UP_MIN,
        }

    @property
    def note(self) -> str:
        """What a run line says of a saturated run."""
        return (
            f"SATURATED: the server kept up with {self.kept_up:.0%} of the offered rate (TTFT grew "
            f"{self.growth_ms_per_s:,.0f} ms a second): TTFT here is its queue"
        )


def kept_up(records: Sequence[RequestRecord], block_size: int = 0) -> KeptUp | None:
    """The run's ``KeptUp`` (module docstring), or None when it offered no rate or timed too few requests."""
    timed = [r for r in records if r.success and math.isfinite(r.planned_send) and math.isfinite(r.ttft) and r.ttft > 0]
    if len(timed) < MIN_REQUESTS:
        return None
    groups: dict[int, list[RequestRecord]] = {}
    for r in timed:
        groups.setdefault(r.index // block_size if block_size > 0 else 0, []).append(r)
    sxy = sxx = 0.0
    for members in groups.values():  # the slope within blocks: each block's own means taken out
        mean_x = math.fsum(r.planned_send for r in members) / len(members)
        mean_y = math.fsum(r.ttft for r in members) / len(members)
        sxy += math.fsum((r.planned_send - mean_x) * (r.ttft - mean_y) for r in members)
        sxx += math.fsum((r.planned_send - mean_x) ** 2 for r in members)
    if sxx <= 0.0:  # every request planned at once (rate inf): no rate was offered
        return None
    growth = sxy / sxx
    return KeptUp(min(1.0, 1.0 / (1.0 + growth)) if growth > -1.0 else 1.0, 1000.0 * growth)


def stalled(mean_ttft: float, median_ttft: float) -> bool:
    """Whether a run's mean TTFT is set by a few stalled requests (module docstring); False when either is
    missing."""
    return math.isfinite(mean_ttft) and median_ttft > 0 and mean_ttft > STALL_RATIO * median_ttft


def stall_note(mean_ttft: float, median_ttft: float) -> str:
    """What a run line says of a run whose mean TTFT a few stalls set."""
    return (
        f"STALLS: TTFT mean {mean_ttft / median_ttft:.1f}x its median: a few requests' waits set the mean, "
        "not the serving path"
    )
