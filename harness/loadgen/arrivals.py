"""The arrival schedule: when each request is planned to be sent.

The whole schedule is computed before the clock starts, so drawing random
numbers never delays a send, and a seed reproduces it exactly. The runner
then sleeps until each planned offset; how late it actually sent (the
schedule lag) is recorded per request, so a slow client cannot hide.

Intervals between consecutive requests follow a gamma distribution with
shape ``burstiness`` and scale ``1 / (rate * burstiness)``: the mean
interval is ``1 / rate`` whatever the burstiness. ``burstiness == 1`` is the
exponential distribution, i.e. a Poisson process; below 1 arrivals are
burstier, above 1 more regular. ``rate == inf`` sends everything at once.
The first request is planned at offset 0 (as benchmark_serving does).
A ramp (``harness.loadgen.ramp``, ``--ramp-up-strategy``) replaces the one rate: the gap before
request i is drawn as above at the rate the ramp offers request i.
A dataset may carry its own send times (the trace dataset's timestamps): ``planned_offsets``
then uses them instead, and neither a rate nor a ramp plays a part.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from harness.loadgen.ramp import Ramp


def plan_arrivals(
    num_requests: int,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    seed: int | None = 0,
    ramp: Ramp | None = None,
) -> list[float]:
    """Planned send offsets in seconds from the start, one per request, non-decreasing. With a
    ``ramp``, ``request_rate`` plays no part."""
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if not request_rate > 0:  # also rejects NaN
        raise ValueError(f"request rate must be > 0 (or inf), got {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a positive finite number, got {burstiness}")
    if num_requests == 0:
        return []
    if ramp is not None:
        return _ramped(num_requests, ramp, burstiness, seed)
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    scale = 1.0 / (request_rate * burstiness)
    intervals = rng.gamma(shape=burstiness, scale=scale, size=num_requests - 1)
    offsets = np.concatenate(([0.0], np.cumsum(intervals)))
    return [float(x) for x in offsets]


def _ramped(num_requests: int, ramp: Ramp, burstiness: float, seed: int | None) -> list[float]:
    """A ramp's offsets: the gap before request i is gamma(burstiness, 1 / (rate_i * burstiness))."""
    rates = np.array(ramp.rates(num_requests)[1:])  # the first request goes at 0: no gap drawn for it
    rng = np.random.default_rng(seed)
    intervals = rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
    offsets = np.concatenate(([0.0], np.cumsum(intervals)))
    return [float(x) for x in offsets]


def offered_rates(workload: Sequence[Timed], request_rate: float = math.inf, ramp: Ramp | None = None) -> list[float]:
    """The rate offered to each request when it was planned (a record's ``offered_rps``): the ramp's
    at its place, else ``request_rate`` (inf: all at once); NaN where the workload's own send times
    were kept, as no rate was offered."""
    if own_times(workload):
        return [math.nan] * len(workload)
    if ramp is not None:
        return ramp.rates(len(workload))
    return [float(request_rate)] * len(workload)


class Timed(Protocol):
    """A request that may carry its own send time (SampleRequest.arrival_s, seconds from the first)."""

    @property
    def arrival_s(self) -> float | None: ...


def own_times(workload: Sequence[Timed]) -> bool:
    """Whether every request carries its own send time, as a trace's timestamps give them."""
    return bool(workload) and all(request.arrival_s is not None for request in workload)


def describe_own_times(workload: Sequence[Timed]) -> str:
    """The console's line for a workload that carries its send times: how long the replay will take."""
    times = [float(r.arrival_s) for r in workload if r.arrival_s is not None]
    span = max(times) - min(times)
    took = f"{span / 3600:.1f} h" if span >= 3600 else f"{span / 60:.1f} min" if span >= 60 else f"{span:.1f} s"
    return f"at the dataset's timestamps, the last {took} after the first (--request-rate and --burstiness ignored)"


def planned_offsets(
    workload: Sequence[Timed],
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    seed: int | None = 0,
    ramp: Ramp | None = None,
) -> list[float]:
    """The workload's own send times (seconds, the first at 0) when every request carries one, as a
    trace's timestamps do; --request-rate, a ramp and --burstiness then play no part. Otherwise plan_arrivals."""
    if own_times(workload):
        times = [float(r.arrival_s) for r in workload if r.arrival_s is not None]
        first = min(times)
        return [t - first for t in times]
    return plan_arrivals(len(workload), request_rate, burstiness, seed, ramp)


def describe_arrivals(request_rate: float, burstiness: float, ramp: Ramp | None = None) -> str:
    """One line naming the process, for the console."""
    kind = "Poisson process" if burstiness == 1.0 else f"gamma intervals, burstiness {burstiness:g}"
    if ramp is not None:
        return f"{ramp.describe()}, {kind}"
    if math.isinf(request_rate):
        return "all requests at once (rate inf)"
    return f"{request_rate:g} req/s, {kind}"


def positive_rate(text: str) -> float:
    """argparse type for --request-rate: a positive float or 'inf'."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (use a positive float or 'inf')") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"request rate must be > 0 or 'inf', got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type for --burstiness."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value
