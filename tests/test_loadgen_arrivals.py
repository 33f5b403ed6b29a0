"""The arrival schedule: rate inf, Poisson and gamma intervals, seeding."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from harness.loadgen.arrivals import plan_arrivals, positive_float, positive_rate


def test_rate_inf_sends_everything_at_offset_zero() -> None:
    assert plan_arrivals(5, math.inf) == [0.0] * 5


def test_empty_and_single() -> None:
    assert plan_arrivals(0, 3.0) == []
    assert plan_arrivals(1, 3.0) == [0.0]


def test_poisson_mean_interval_is_one_over_rate() -> None:
    offsets = plan_arrivals(20_001, request_rate=50.0, burstiness=1.0, seed=1)
    intervals = np.diff(offsets)
    assert offsets[0] == 0.0
    assert np.all(intervals >= 0)
    assert intervals.mean() == pytest.approx(1 / 50.0, rel=0.03)
    # Exponential intervals: std equals the mean.
    assert intervals.std() == pytest.approx(1 / 50.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_keeps_the_rate_and_changes_the_spread(burstiness: float) -> None:
    rate = 10.0
    intervals = np.diff(plan_arrivals(20_001, rate, burstiness, seed=2))
    assert intervals.mean() == pytest.approx(1 / rate, rel=0.05)
    # gamma(shape=b, scale=1/(rate*b)): coefficient of variation 1/sqrt(b).
    assert intervals.std() / intervals.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.07)


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a = plan_arrivals(50, 5.0, 0.5, seed=7)
    assert a == plan_arrivals(50, 5.0, 0.5, seed=7)
    assert a != plan_arrivals(50, 5.0, 0.5, seed=8)


@pytest.mark.parametrize("rate, burstiness", [(0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (1.0, 0.0), (1.0, math.inf)])
def test_bad_parameters_are_rejected(rate: float, burstiness: float) -> None:
    with pytest.raises(ValueError):
        plan_arrivals(3, rate, burstiness)


def test_argparse_types() -> None:
    assert positive_rate("inf") == math.inf
    assert positive_rate("2.5") == 2.5
    for bad in ("0", "-1", "fast"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_rate(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        positive_float("0")
