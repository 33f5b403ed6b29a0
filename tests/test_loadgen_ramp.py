"""Load ramps (--ramp-up-strategy, as vLLM bench serve's): the rates, the arrivals, the refusals, each
record's offered rate, the report's table per offered-rate bucket and the plot against the offered rate."""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from harness.analysis.documents import load_run, save_run
from harness.analysis.report_plots import ramp_points, send_times, timeline_figure
from harness.analysis.runs import RunEntry
from harness.loadgen import runner
from harness.loadgen.arrivals import describe_arrivals, offered_rates, plan_arrivals, planned_offsets
from harness.loadgen.ramp import EXPONENTIAL, LINEAR, Ramp, bucket_lines, by_offered_rate, ramp_from
from harness.loadgen.report import format_report
from harness.loadgen.runner import BenchmarkError, LoadSettings, run_benchmark
from harness.workloads.sample import SampleRequest

from fake_openai_server import FakeConfig, FakeOpenAIServer

# --- the rates ---------------------------------------------------------------------------------------


def test_a_linear_ramp_goes_from_start_to_end_in_equal_steps() -> None:
    ramp = Ramp(LINEAR, 2.0, 20.0)
    assert ramp.rates(5) == [2.0, 6.5, 11.0, 15.5, 20.0]
    assert ramp.rates(1) == [2.0]  # one request: the start rate, as vLLM's progress 0 / max(n - 1, 1)


def test_an_exponential_ramp_goes_from_start_to_end_in_equal_ratios() -> None:
    rates = Ramp(EXPONENTIAL, 1.0, 16.0).rates(5)
    assert rates == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0])
    assert rates[0] == 1.0 and rates[-1] == 16.0


@pytest.mark.parametrize("strategy", [LINEAR, EXPONENTIAL])
def test_a_ramps_offsets_are_monotone_start_at_zero_and_follow_the_seed(strategy: str) -> None:
    ramp = Ramp(strategy, 1.0, 50.0)
    offsets = plan_arrivals(400, burstiness=0.5, seed=3, ramp=ramp)
    assert offsets[0] == 0.0 and len(offsets) == 400
    assert np.all(np.diff(offsets) >= 0)
    assert offsets == plan_arrivals(400, burstiness=0.5, seed=3, ramp=ramp)
    assert offsets != plan_arrivals(400, burstiness=0.5, seed=4, ramp=ramp)
    # The ramp replaces the rate: a rate given with it plays no part.
    assert offsets == plan_arrivals(400, request_rate=7.0, burstiness=0.5, seed=3, ramp=ramp)


def test_the_gaps_come_faster_at_the_end_of_the_ramp() -> None:
    ramp = Ramp(LINEAR, 2.0, 40.0)
    gaps = np.diff(plan_arrivals(4001, seed=5, ramp=ramp))
    expected = 1 / np.array(ramp.rates(4001)[1:])  # each gap's mean: one over its request's rate
    assert gaps[:400].mean() == pytest.approx(expected[:400].mean(), rel=0.1)  # rates 2 .. 5.8
    assert gaps[-400:].mean() == pytest.approx(expected[-400:].mean(), rel=0.1)  # rates 36.2 .. 40
    assert gaps[:400].mean() > 5 * gaps[-400:].mean()


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_each_gap_is_gamma_at_its_requests_rate_with_the_burstiness_as_shape(burstiness: float) -> None:
    """As vLLM: gap_i ~ gamma(shape=b, scale=1 / (rate_i * b)), so gap_i * rate_i has mean 1 and a
    coefficient of variation 1 / sqrt(b), whatever the rate."""
    ramp = Ramp(EXPONENTIAL, 0.5, 500.0)
    n = 20_001
    scaled = np.diff(plan_arrivals(n, burstiness=burstiness, seed=11, ramp=ramp)) * np.array(ramp.rates(n)[1:])
    assert scaled.mean() == pytest.approx(1.0, rel=0.05)
    assert scaled.std() == pytest.approx(1 / math.sqrt(burstiness), rel=0.07)


@dataclass(frozen=True)
class Timed:
    arrival_s: float | None


def test_offered_rates_per_request() -> None:
    untimed = [Timed(None)] * 3
    assert offered_rates(untimed, 4.0) == [4.0] * 3
    assert offered_rates(untimed, math.inf) == [math.inf] * 3
    assert offered_rates(untimed, ramp=Ramp(LINEAR, 1.0, 3.0)) == [1.0, 2.0, 3.0]
    traced = [Timed(0.0), Timed(0.5), Timed(2.0)]  # a trace's own send times: no rate was offered, no ramp
    assert all(math.isnan(r) for r in offered_rates(traced, ramp=Ramp(LINEAR, 1.0, 3.0)))
    assert planned_offsets(traced, ramp=Ramp(LINEAR, 1.0, 3.0)) == [0.0, 0.5, 2.0]


def test_the_console_names_the_ramp() -> None:
    line = describe_arrivals(math.inf, 1.0, Ramp(EXPONENTIAL, 2.0, 32.0))
    assert line == "exponential ramp from 2 to 32 req/s, Poisson process"


# --- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy, start, end, message",
    [
        (LINEAR, None, 5.0, "--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps"),
        (EXPONENTIAL, 2.0, None, "--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps"),
        (None, 2.0, None, "--ramp-up-start-rps and --ramp-up-end-rps need --ramp-up-strategy linear|exponential"),
        (EXPONENTIAL, 0.0, 5.0, "an exponential ramp needs rates > 0, got --ramp-up-start-rps 0 --ramp-up-end-rps 5"),
        (EXPONENTIAL, -1.0, 5.0, "an exponential ramp needs rates > 0"),
        (LINEAR, -1.0, 5.0, "a linear ramp needs a start >= 0 and an end > 0"),
        (LINEAR, 0.0, 0.0, "a linear ramp needs a start >= 0 and an end > 0"),
        (LINEAR, 9.0, 5.0, "a ramp goes up: --ramp-up-start-rps (9) must not exceed --ramp-up-end-rps (5)"),
        (LINEAR, 1.0, math.inf, "--ramp-up-end-rps must be a finite number"),
    ],
)
def test_a_ramp_that_cannot_run_is_refused_naming_its_flags(
    strategy: str | None, start: float | None, end: float | None, message: str
) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        ramp_from(strategy, start, end)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    with pytest.raises(BenchmarkError):  # the settings refuse it too, however they are made
        LoadSettings(ramp_up_strategy=strategy, ramp_up_start_rps=start, ramp_up_end_rps=end)


def test_a_linear_ramp_may_start_at_zero_as_vllms_does() -> None:
    """The first request goes at offset 0, so no gap is ever drawn at rate 0."""
    offsets = plan_arrivals(10, seed=1, ramp=ramp_from(LINEAR, 0.0, 10.0))
    assert offsets[0] == 0.0 and all(math.isfinite(x) for x in offsets)


def _bench(argv: list[str]) -> argparse.Namespace:
    from harness.cli import build_parser

    parser, _ = build_parser(argv)
    return parser.parse_args(argv)


RAMP = ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "2", "--ramp-up-end-rps", "8"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--request-rate", "5"], "--ramp-up-strategy sets the rate over the run: drop --request-rate 5"),
        (["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "0"], "an exponential ramp needs rates > 0"),
    ],
)
@pytest.mark.parametrize("command", ["load", "run"])
def test_the_commands_refuse_a_bad_ramp_in_one_line_with_exit_2(
    command: str, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    where = {"load": ["--base-url", "http://127.0.0.1:9"], "run": ["--codec", "pickle"]}[command]  # never reached
    args = _bench([command, *RAMP, *extra, *where])
    assert importlib.import_module(f"harness.commands.{command}").main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bench {command}: error: ") and message in err[0]


def test_a_ramped_bench_run_has_no_capacity_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.experiment import probe
    from harness.experiment.flags import experiment_from_args

    def no_probe(*_: object) -> float:
        raise AssertionError("a ramp replaces the capacity probe")

    monkeypatch.setattr(probe, "probe_capacity", no_probe)
    exp = experiment_from_args(_bench(["run", *RAMP]))  # --request-rate left at auto
    resolved = probe.resolve_rate(exp, [SampleRequest("p", 4, 4)], "tok")
    assert resolved is not None
    fixed, note = resolved
    assert fixed.load.request_rate == math.inf and fixed.request_rate == math.inf
    assert note == {"rate": math.inf, "auto": False, "ramp": {"strategy": "linear", "start_rps": 2.0, "end_rps": 8.0}}
    assert fixed.load.ramp == Ramp(LINEAR, 2.0, 8.0)


# --- the buckets and the report's table --------------------------------------------------------------


@dataclass
class Req:
    offered_rps: float
    ttft: float
    codec_us: float = math.nan
    codec_wire_us: float = math.nan
    success: bool = True


def test_buckets_split_the_ramps_range_and_summarise_ttft_and_codec() -> None:
    ramp = Ramp(LINEAR, 0.0, 10.0)
    requests = [Req(rate, ttft=rate / 100, codec_us=rate, codec_wire_us=2 * rate) for rate in range(11)]
    requests.append(Req(5.0, ttft=9.0, success=False))  # a failed request is in no bucket
    buckets = by_offered_rate(requests, ramp)
    assert [(b.low_rps, b.high_rps) for b in buckets] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert [b.requests for b in buckets] == [3, 2, 2, 2, 2]  # 0, 1, 2 | 3, 4 | 5, 6 | 7, 8 | 9, 10
    first, last = buckets[0], buckets[-1]
    assert first.ttft_p50_ms == pytest.approx(10.0) and first.ttft_mean_ms == pytest.approx(10.0)
    assert last.ttft_p50_ms == pytest.approx(95.0) and last.codec_us == 9.5 and last.codec_wire_us == 19.0
    exp_edges = Ramp(EXPONENTIAL, 1.0, 32.0).bucket_edges()
    assert exp_edges == pytest.approx([1, 2, 4, 8, 16, 32])


def test_the_table_stays_narrow_and_drops_codec_columns_without_timelines() -> None:
    ramp = Ramp(EXPONENTIAL, 0.5, 1000.0)
    with_codec = bucket_lines(by_offered_rate([Req(0.5, 0.01, 12.5, 30.0), Req(1000.0, 2.0, 14.0, 33.0)], ramp))
    assert len(with_codec) == 6 and "codec µs" in with_codec[0] and all(len(line) <= 100 for line in with_codec)
    assert with_codec[1].split()[-2:] == ["12.5", "30.0"] and with_codec[3].split()[1:] == ["0"] + ["n/a"] * 4
    without = bucket_lines(by_offered_rate([Req(0.5, 0.01), Req(1000.0, 2.0)], ramp))
    assert "codec" not in without[0] and without[1].split()[-1] == "10.00"


# --- a ramped load against the fake server: records, report, run file, plot ---------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(FakeConfig(ttft_s=0.02, token_gap_s=0.005)) as srv:
        yield srv


def test_a_ramped_load_records_each_requests_offered_rate_and_reports_by_bucket(
    server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "SCRAPE_SETTLE_S", 0.0)
    workload = [SampleRequest(f"prompt {i}", 4, 2) for i in range(20)]
    settings = LoadSettings(ramp_up_strategy=LINEAR, ramp_up_start_rps=20.0, ramp_up_end_rps=200.0, seed=2)
    result = asyncio.run(run_benchmark(server.base_url, "fake-model", workload, settings))
    rates = [r.offered_rps for r in result.records]
    assert rates == pytest.approx(Ramp(LINEAR, 20.0, 200.0).rates(20)) and result.failed == 0
    planned = [r.planned_send for r in result.records]
    assert planned == pytest.approx(plan_arrivals(20, seed=2, ramp=Ramp(LINEAR, 20.0, 200.0)))
    text = format_report(result)
    lines = text.splitlines()
    assert "Request rate (req/s):                    linear ramp 20 -> 200" in lines
    table = lines[lines.index(next(line for line in lines if "TTFT and codec by offered rate" in line)) + 1 :][:6]
    assert table[0].split()[:3] == ["offered", "req/s", "requests"]
    assert [int(line.split()[1]) for line in table[1:]] == [4, 4, 4, 4, 4]
    assert all(len(line) <= 100 for line in table)

    result.flags = {"ramp_up_strategy": LINEAR, "ramp_up_start_rps": 20.0, "ramp_up_end_rps": 200.0}
    doc = load_run(save_run(result, result_dir=tmp_path))
    assert [r["offered_rps"] for r in doc["records"]] == pytest.approx(rates)
    entries = [RunEntry("fake", k, "ok", "", None, doc) for k in range(2)]  # two rounds of one arm
    rows = send_times(entries)
    ramped = ramp_points(rows, ["fake"])
    assert ramped is not None
    ramp, points = ramped
    assert ramp == Ramp(LINEAR, 20.0, 200.0) and len(points) == 5
    assert all(p["codecs"]["fake"]["figures"]["ttft_p50_ms"]["n"] == 2 for p in points)
    fig = timeline_figure(rows, ["fake"])
    titles = [ax.get_title() for sub in fig.subfigs for ax in sub.axes]
    assert titles[-2:] == ["TTFT p50, by offered rate", "TTFT mean, by offered rate"]  # no codec: the fake server
    assert [p["at"]["offered_rps"] for p in points] == pytest.approx([38, 74, 110, 146, 182])  # has no timelines


def test_a_run_without_a_ramp_keeps_its_plain_timeline(server: FakeOpenAIServer) -> None:
    rows = [{"codec": "a", "round": 0, "run": 0, "t_s": t / 10, "ttft_ms": 5.0} for t in range(10)]
    assert ramp_points(rows, ["a"]) is None
    fig = timeline_figure(rows, ["a"])
    assert not fig.subfigs and len(fig.axes) == 1


def test_sweeping_the_rate_of_a_ramped_experiment_is_refused() -> None:
    settings = LoadSettings(ramp_up_strategy=LINEAR, ramp_up_start_rps=1.0, ramp_up_end_rps=2.0)
    with pytest.raises(BenchmarkError, match="drop --request-rate 3"):
        replace(settings, request_rate=3.0)
