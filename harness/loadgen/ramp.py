"""Load ramps (vLLM bench serve's ``--ramp-up-strategy``): the offered rate climbs over the run.

Request ``i`` of ``n`` is offered the rate ``r(p)`` at progress ``p = i / max(n - 1, 1)``: a linear
ramp gives ``start + (end - start) * p``, an exponential one ``start * (end / start) ** p``, so the
first request is offered the start rate and the last the end rate, as vLLM's ramp does. The gap
before each request is drawn at that request's rate (``arrivals.plan_arrivals``), so
``--burstiness`` shapes the gaps as it does at a fixed rate. A ramp replaces ``--request-rate``.

What a ramp shows is read per offered-rate bucket (``by_offered_rate``): equal-width buckets of
rate for a linear ramp, equal-ratio buckets for an exponential one, which both hold about as many
requests each.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

LINEAR = "linear"
EXPONENTIAL = "exponential"
STRATEGIES = (LINEAR, EXPONENTIAL)
BUCKETS = 5  # offered-rate buckets a ramped run's report shows


@dataclass(frozen=True)
class Ramp:
    """A ramp of the offered rate from ``start_rps`` to ``end_rps`` over the run's requests."""

    strategy: str
    start_rps: float
    end_rps: float

    def rate_at(self, index: int, total: int) -> float:
        """The rate offered to request ``index`` of ``total``."""
        progress = index / max(total - 1, 1)
        if self.strategy == EXPONENTIAL:
            return self.start_rps * (self.end_rps / self.start_rps) ** progress
        return self.start_rps + (self.end_rps - self.start_rps) * progress

    def rates(self, total: int) -> list[float]:
        """The rate offered to each of ``total`` requests, in order."""
        return [self.rate_at(i, total) for i in range(total)]

    def describe(self) -> str:
        return f"{self.strategy} ramp from {self.start_rps:g} to {self.end_rps:g} req/s"

    def bucket_edges(self, count: int = BUCKETS) -> list[float]:
        """``count + 1`` rate edges from start to end: equal steps, or equal ratios when exponential."""
        if self.start_rps == self.end_rps:
            return [float(self.start_rps), float(self.end_rps)]
        if self.strategy == EXPONENTIAL:
            ratio = self.end_rps / self.start_rps
            return [self.start_rps * ratio ** (k / count) for k in range(count)] + [float(self.end_rps)]
        step = (self.end_rps - self.start_rps) / count
        return [self.start_rps + k * step for k in range(count)] + [float(self.end_rps)]

    def centre(self, low_rps: float, high_rps: float) -> float:
        """A bucket's centre on the ramp's own scale: geometric for an exponential ramp."""
        if self.strategy == EXPONENTIAL:
            return math.sqrt(low_rps * high_rps)
        return (low_rps + high_rps) / 2

    def as_dict(self) -> dict[str, float | str]:
        return {"strategy": self.strategy, "start_rps": self.start_rps, "end_rps": self.end_rps}


def ramp_from(strategy: str | None, start_rps: float | None, end_rps: float | None) -> Ramp | None:
    """The ramp the three flags describe, None without one; ValueError (one line, naming the flags)
    for a ramp that cannot run, with vLLM's rules: both rates with a strategy, a ramp up (start at
    most end), positive rates for an exponential ramp. A linear ramp may start at 0: the first
    request goes at the start, so no gap is drawn at rate 0."""
    if strategy is None:
        if start_rps is not None or end_rps is not None:
            raise ValueError("--ramp-up-start-rps and --ramp-up-end-rps need --ramp-up-strategy linear|exponential")
        return None
    if strategy not in STRATEGIES:
        raise ValueError(f"--ramp-up-strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if start_rps is None or end_rps is None:
        raise ValueError("--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps")
    for flag, value in (("--ramp-up-start-rps", start_rps), ("--ramp-up-end-rps", end_rps)):
        if not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number of requests per second, got {value}")
    if strategy == EXPONENTIAL and (start_rps <= 0 or end_rps <= 0):
        raise ValueError(f"an exponential ramp needs rates > 0, got {_given(start_rps, end_rps)}")
    if start_rps < 0 or end_rps <= 0:
        raise ValueError(f"a linear ramp needs a start >= 0 and an end > 0, got {_given(start_rps, end_rps)}")
    if start_rps > end_rps:
        raise ValueError(
            f"a ramp goes up: --ramp-up-start-rps ({start_rps:g}) must not exceed --ramp-up-end-rps ({end_rps:g})"
        )
    return Ramp(strategy, float(start_rps), float(end_rps))


def _given(start_rps: float, end_rps: float) -> str:
    return f"--ramp-up-start-rps {start_rps:g} --ramp-up-end-rps {end_rps:g}"


class Offered(Protocol):
    """What a bucket reads of one request (``client.RequestRecord`` has it; times in seconds)."""

    @property
    def offered_rps(self) -> float: ...
    @property
    def success(self) -> bool: ...
    @property
    def ttft(self) -> float: ...
    @property
    def codec_us(self) -> float: ...
    @property
    def codec_wire_us(self) -> float: ...


@dataclass(frozen=True)
class RateBucket:
    """The successful requests offered a rate in [low_rps, high_rps]: their TTFT and codec figures."""

    low_rps: float
    high_rps: float
    requests: int
    ttft_p50_ms: float
    ttft_mean_ms: float
    codec_us: float  # mean codec µs on the first-token path (NaN without the server's timelines)
    codec_wire_us: float  # the same with the wire between the codec calls


def by_offered_rate(records: Iterable[Offered], ramp: Ramp, count: int = BUCKETS) -> list[RateBucket]:
    """The successful requests in ``count`` offered-rate buckets (``Ramp.bucket_edges``), low to high."""
    edges = ramp.bucket_edges(count)
    members: list[list[Offered]] = [[] for _ in range(len(edges) - 1)]
    for record in records:
        rate = record.offered_rps
        if record.success and math.isfinite(rate):
            members[_bucket_of(rate, edges)].append(record)
    return [_bucket(edges[k], edges[k + 1], group) for k, group in enumerate(members)]


def _bucket_of(rate: float, edges: Sequence[float]) -> int:
    """The bucket holding ``rate``; each bucket holds its upper edge, the first also its lower one."""
    return min(max(bisect.bisect_left(edges, rate) - 1, 0), len(edges) - 2)


def _bucket(low: float, high: float, group: Sequence[Offered]) -> RateBucket:
    ttfts = [r.ttft * 1000.0 for r in group if math.isfinite(r.ttft)]
    return RateBucket(
        low_rps=low,
        high_rps=high,
        requests=len(group),
        ttft_p50_ms=statistics.median(ttfts) if ttfts else math.nan,
        ttft_mean_ms=statistics.fmean(ttfts) if ttfts else math.nan,
        codec_us=_mean(r.codec_us for r in group),
        codec_wire_us=_mean(r.codec_wire_us for r in group),
    )


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def bucket_lines(buckets: Sequence[RateBucket]) -> list[str]:
    """The report's table of a ramped run (at most 75 columns): a row per bucket; the codec columns
    only when the server's timelines gave them."""
    codec = any(math.isfinite(b.codec_us) for b in buckets)
    header = f"{'offered req/s':<17}{'requests':>9}{'TTFT p50 ms':>13}{'TTFT mean ms':>14}"
    if codec:
        header += f"{'codec µs':>11}{'+wire µs':>11}"
    lines = [header]
    for b in buckets:
        row = f"{_rate_range(b):<17}{b.requests:>9}{_num(b.ttft_p50_ms, 13)}{_num(b.ttft_mean_ms, 14)}"
        if codec:
            row += f"{_num(b.codec_us, 11, '.1f')}{_num(b.codec_wire_us, 11, '.1f')}"
        lines.append(row)
    return lines


def _rate_range(b: RateBucket) -> str:
    return f"{b.low_rps:.3g}–{b.high_rps:.3g}"


def _num(value: float, width: int, fmt: str = ".2f") -> str:
    return f"{'n/a' if math.isnan(value) else format(value, fmt):>{width}}"
