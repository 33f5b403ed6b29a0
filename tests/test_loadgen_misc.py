"""Progress line, run metadata and the full `bench load` flag set."""

from __future__ import annotations

import argparse
import io
import json
import tempfile
from datetime import datetime
from types import SimpleNamespace

import pytest

from harness.commands import load as cli
from harness.loadgen.progress import Progress
from harness.loadgen.runner import BenchmarkError, LoadSettings, check_endpoint, exposes_codec_counters
from harness.loadgen.sysinfo import collect_sysinfo
from harness.server_metrics import prometheus
from harness.settings import declare
from harness.wire.messages import CodecStats


def test_progress_draws_only_when_enabled() -> None:
    quiet = io.StringIO()
    p = Progress(3, stream=quiet)  # StringIO is not a TTY
    p.update(True)
    p.close()
    assert quiet.getvalue() == ""

    loud = io.StringIO()
    p = Progress(3, enabled=True, stream=loud, interval_s=0.0, label="[2/6] msgspec r1")
    p.update(True, lag_ms=0.5)
    p.update(False, lag_ms=1.5)
    p.update(True)
    p.close()
    last = loud.getvalue().rstrip("\n").split("\r")[-1]
    assert last.startswith("[2/6] msgspec r1") and "3/3" in last
    assert "1 failed, lag 1.0 ms" in last  # the mean of the lags given
    assert p.completed == 2 and p.failed == 1


def test_sysinfo_has_the_fields_a_result_needs() -> None:
    info = collect_sysinfo()
    assert set(info["libraries"]) == {"torch", "msgspec", "pyzmq", "aiohttp", "numpy"}
    assert info["libraries"]["aiohttp"]
    assert info["python"] and info["cpu_model"] and info["cpu_count"] >= 1
    assert "gpu" in info and "git" in info and info["platform"]
    assert info["hostname"] and "hostname" not in collect_sysinfo(hostname=False)


def test_endpoint_checked_in_one_place() -> None:
    with pytest.raises(BenchmarkError, match="--endpoint must be one of"):
        check_endpoint([], "/v1/embeddings")
    check_endpoint([], "/v1/chat/completions")


def test_exposes_codec_counters() -> None:
    wirebench = prometheus.render(prometheus.codec_samples(CodecStats(), CodecStats()))
    assert exposes_codec_counters(wirebench)
    assert not exposes_codec_counters(None) and not exposes_codec_counters("")
    assert not exposes_codec_counters("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")


def test_load_settings_from_flags() -> None:
    parser = argparse.ArgumentParser()
    cli.add_server_arguments(parser)
    cli.add_load_arguments(parser)
    args = parser.parse_args(
        [
            "--goodput",
            "ttft:100",
            "e2el:900",
            "--metric-percentiles",
            "50,90",
            "--percentile-metrics",
            "ttft,e2el",
            "--request-timeout",
            "0",
            "--max-concurrency",
            "4",
            "--no-progress",
        ]
    )
    s = LoadSettings.from_args(args)
    assert s.goodput_slos_ms == {"ttft": 100.0, "e2el": 900.0}
    assert s.percentiles == (50.0, 90.0) and s.selected_metrics == ("ttft", "e2el")
    assert s.request_timeout_s is None and s.max_concurrency == 4 and s.progress is False
    for bad in (["--goodput", "itl:5"], ["--percentile-metrics", "foo"], ["--max-concurrency", "0"]):
        with pytest.raises(BenchmarkError):
            LoadSettings.from_args(parser.parse_args(bad))


def test_declared_load_settings_are_flags_read_back_once() -> None:
    parser = argparse.ArgumentParser()
    cli.add_load_arguments(parser)
    defaults = vars(parser.parse_args([]))
    assert declare.flag_defaults(LoadSettings).items() <= defaults.items()  # every declared setting has its flag
    argv = ["--endpoint", "/v1/chat/completions", "--burstiness", "0.5", "--max-concurrency", "3"]
    argv += ["--warmup-requests", "2", "--logprobs", "5", "--no-continuous-usage"]
    s = LoadSettings.from_args(parser.parse_args(argv))
    assert (s.endpoint, s.burstiness, s.max_concurrency) == ("/v1/chat/completions", 0.5, 3)
    assert (s.warmup_requests, s.logprobs, s.continuous_usage) == (2, 5, False)
    assert declare.flag_values(s).items() <= vars(parser.parse_args(argv)).items()
    assert LoadSettings.from_args(argparse.Namespace(endpoint=None, burstiness=None)) == LoadSettings()
    ramp = ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")
    assert declare.comparable(LoadSettings) == ("endpoint", "burstiness", *ramp, "max_concurrency", "logprobs")
    for bad, message in (
        (["--logprobs", "21"], "--logprobs must be in [0, 20] (OpenAI's limit), got 21"),
        (["--warmup-requests", "-1"], "--warmup-requests must be >= 0, got -1"),
        (["--max-concurrency", "0"], "--max-concurrency must be >= 1, got 0"),
    ):
        with pytest.raises(BenchmarkError) as err:
            LoadSettings.from_args(parser.parse_args(bad))
        assert str(err.value) == message


def test_vllm_bench_serve_names_work_and_notes_are_kept() -> None:
    """--num-warmups and --disable-tqdm are vLLM's names of ours; --metadata lands in the run file's
    metadata.user and --label names the result file."""
    from harness.analysis.documents import default_result_path, user_metadata

    parser = argparse.ArgumentParser()
    cli.add_load_arguments(parser)
    args = parser.parse_args(["--num-warmups", "3", "--disable-tqdm", "--metadata", "commit=abc", "host=ci=7"])
    assert LoadSettings.from_args(args).warmup_requests == 3 and args.no_progress
    flags = cli.flags_dict(args)
    assert user_metadata(flags) == {"user": {"commit": "abc", "host": "ci=7"}}
    assert user_metadata(json.loads(json.dumps(flags))) == user_metadata(flags)  # as a saved file holds it
    assert user_metadata(cli.flags_dict(parser.parse_args([]))) == {}
    with pytest.raises(SystemExit):
        parser.parse_args(["--metadata", "no-equals-sign"])
    run = SimpleNamespace(flags={}, codec="pickle", backend="openai", started_at=datetime(2026, 1, 2, 3, 4, 5))
    assert default_result_path(run, tempfile.gettempdir()).name == "pickle-20260102-030405.json"  # type: ignore[arg-type]
    run.flags = cli.flags_dict(parser.parse_args(["--label", "base"]))
    assert default_result_path(run, tempfile.gettempdir()).name == "base-20260102-030405.json"  # type: ignore[arg-type]


def test_bench_load_parser_with_dataset_flags() -> None:
    pytest.importorskip("harness.workloads.datasets")
    from harness.cli import build_parser

    parser, _ = build_parser(["load"])
    args = parser.parse_args(["load", "--base-url", "http://x:1", "--request-rate", "5"])
    assert args.request_rate == 5.0 and args.base_url == "http://x:1"
    assert hasattr(args, "seed") and hasattr(args, "tokenizer")


def test_the_servers_back_to_back_share_is_the_difference_of_two_scrapes() -> None:
    from harness.loadgen.serverstats import outputs_behind_share
    from harness.server_metrics import prometheus

    def scrape(relayed: int, behind: int) -> str:
        return prometheus.render(
            {prometheus.OUTPUTS_RELAYED: [({}, relayed)], prometheus.OUTPUTS_BEHIND: [({}, behind)]}
        )

    assert outputs_behind_share(scrape(100, 10), scrape(300, 60)) == 0.25  # 50 of the run's 200
    assert outputs_behind_share(scrape(100, 10), scrape(100, 10)) is None  # relayed nothing
    assert outputs_behind_share(prometheus.render({}), scrape(300, 60)) is None  # a server that does not count them
    assert outputs_behind_share(None, scrape(300, 60)) is None
