"""The experiment flow that run, calibrate and sweep share, driven directly with typed settings."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from harness.analysis.documents import load_compare
from harness.analysis.sweep_grid import IMAGE_SIDE, REQUEST_RATE, Axis
from harness.commands.run import add_arguments
from harness.experiment.arms import ArmSpec
from harness.experiment.flags import experiment_from_args
from harness.experiment.flow import prepare, run_experiment
from harness.experiment.settings import AUTO, DEFAULT_BLOCK_SIZE, Experiment, RunPlan, ServerSettings
from harness.experiment.sweep import at_point
from harness.loadgen.client import CHAT_COMPLETIONS
from harness.loadgen.runner import LoadSettings
from harness.workloads.sonnet import SonnetOptions
from harness.workloads.spec import WorkloadSpec


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_become_one_frozen_experiment_and_the_namespace_is_left_alone() -> None:
    args = parsed("--codec", "pickle,msgspec", "--num-prompts", "9", "--executor", "sim", "--block-size", "3")
    before = dict(vars(args))
    exp = experiment_from_args(args)
    assert vars(args) == before  # read once, never written back
    assert [a.label for a in exp.arms] == ["pickle", "msgspec"]
    assert exp.workload.num_prompts == 9 and exp.plan.block_size == 3 and exp.request_rate == AUTO
    assert exp.load.request_rate == math.inf  # checked at rate inf until the probe fixes it
    assert "--executor" in exp.server.flags and exp.server.served_model == "wirebench-tiny"
    assert exp.server.engine.executor == "sim" and exp.server.engine.max_num_seqs == 64  # read from the flags
    with pytest.raises(AttributeError):
        exp.plan.repeat = 3  # type: ignore[misc]
    fixed = exp.at_rate(12.5)
    assert fixed.load.request_rate == fixed.request_rate == 12.5 and exp.request_rate == AUTO
    assert fixed.record()["request_rate"] == 12.5 and fixed.record()["num_prompts"] == 9


def test_a_sweep_point_is_a_replaced_experiment() -> None:
    exp = experiment_from_args(parsed("--codec", "pickle", "--request-rate", "5"))
    point = at_point(exp, {IMAGE_SIDE: 64, REQUEST_RATE: 20}, Path("out/p1"))
    assert point.workload.images_per_request == 1 and point.workload.image_width == 64
    assert point.request_rate == point.load.request_rate == 20 and point.plan.result_dir == "out/p1"
    moved, changed = point.with_images_on_chat()
    assert changed and moved.load.endpoint == CHAT_COMPLETIONS
    assert exp.workload.images_per_request == 0 and exp.request_rate == 5  # the original is untouched
    assert Axis(IMAGE_SIDE, (64.0,)).text(64) == "image 64 px"


def test_bad_settings_are_refused_before_any_server_starts() -> None:
    exp = experiment_from_args(parsed("--block-size", "4", "--workers", "2"))
    with pytest.raises(ValueError, match="--block-size"):
        prepare(exp)
    with pytest.raises(ValueError, match="--repeat"):
        prepare(replace(exp, plan=replace(exp.plan, repeat=0)))
    with pytest.raises(ValueError, match="two or more"):
        prepare(experiment_from_args(parsed("--until-resolved", "5")))  # one arm: nothing to resolve
    with pytest.raises(ValueError, match="--block-size N > 0"):
        prepare(experiment_from_args(parsed("--codec", "pickle,msgspec", "--until-resolved", "5", "--block-size", "0")))


def test_runs_of_several_arms_go_in_blocks_unless_told_otherwise() -> None:
    def block_size(*argv: str) -> int | None:
        return experiment_from_args(parsed(*argv)).plan.block_size

    assert block_size("--codec", "pickle,msgspec") == DEFAULT_BLOCK_SIZE
    assert block_size("--codec", "pickle") == 0  # one arm: nothing to take turns with
    assert block_size("--codec", "pickle,msgspec", "--workers", "2") == 0  # blocks need one sender
    assert block_size("--codec", "pickle,msgspec", "--block-size", "0") == 0
    assert block_size("--codec", "pickle,msgspec", "--block-size", "7") == 7


@pytest.mark.slow
def test_the_flow_runs_two_arms_in_blocks_from_typed_settings(tmp_path: Path) -> None:
    exp = Experiment(
        arms=(ArmSpec("pickle", "pickle"), ArmSpec("msgspec", "msgspec")),
        workload=WorkloadSpec(num_prompts=6, options=SonnetOptions(sonnet_output_len=8)),
        load=LoadSettings(request_rate=20.0, warmup_requests=1, progress=False),
        server=ServerSettings(flags=("--seed", "0", "--executor", "sim")),
        plan=RunPlan(repeat=3, block_size=3, auto_rate=False, result_dir=str(tmp_path)),
    )
    result = run_experiment(prepare(exp))
    assert result is not None and not result.interrupted and not result.any_failed
    assert [a.label for a in result.arms] == ["pickle", "msgspec"]
    assert [len(a.measured) for a in result.arms] == [3, 3]
    for outcome in result.outcomes:  # every request a round sent is accounted for
        assert outcome.result is not None and outcome.result.metrics.completed == 6
    assert result.comparison is not None and result.comparison.cells
    path, doc = result.save()
    loaded = load_compare(path)
    assert loaded["codecs"] == ["pickle", "msgspec"] and len(loaded["runs"]) == 6
    assert doc["metadata"]["request_rate"] == {"rate": 20.0, "auto": False}
    assert doc["metadata"]["machine"]["cpu_usable"] >= 1  # what the gate compares across files


def test_the_load_and_plan_settings_that_shape_a_run_are_compared() -> None:
    from harness.analysis.like_for_like import PLAN_SETTINGS, run_settings
    from harness.analysis.runs import RunEntry
    from harness.settings.declare import comparable

    assert comparable(RunPlan) == PLAN_SETTINGS  # named again below the experiment layer: kept equal here

    def settings(*argv: str) -> dict[str, object]:
        flags = {k: v for k, v in vars(parsed(*argv)).items() if not callable(v)}
        return run_settings(RunEntry("pickle", 0, "ok", "", None, {"metadata": {"flags": flags}}, None))

    base = settings()
    assert {k: base[k] for k in ("endpoint", "burstiness", "max_concurrency", "logprobs", "block_size")} == {
        "endpoint": "/v1/completions",
        "burstiness": 1.0,
        "max_concurrency": None,
        "logprobs": None,
        "block_size": None,  # as parsed: the experiment resolves it by its arms, and run files record that
    }
    assert "warmup_requests" not in base  # untimed: it changes no figure
    assert settings("--block-size", "5")["block_size"] == 5 and settings("--logprobs", "2")["logprobs"] == 2
    old = RunEntry("pickle", 0, "ok", "", None, {"metadata": {"flags": {"endpoint": "/v1/completions"}}}, None)
    # Blocks and image reuse came later: absent is 0.
    assert run_settings(old) == {
        "endpoint": "/v1/completions",
        "block_size": 0,
        "duet": False,
        "pin_servers": "",
        "image_reuse": 0.0,
    }
    # A trace sent at its own times: the recorded rate and burstiness played no part, so they
    # do not make two such runs incomparable.
    timed = [
        RunEntry("pickle", 0, "ok", "", None, {"metadata": {"flags": flags, "own_send_times": True}}, None)
        for flags in ({"request_rate": 5.0, "burstiness": 1.0}, {"request_rate": 50.0, "burstiness": 0.5})
    ]
    assert run_settings(timed[0]) == run_settings(timed[1])
    assert "request_rate" not in run_settings(timed[0]) and "burstiness" not in run_settings(timed[0])


def test_pinned_servers_run_on_their_cpus_and_a_pin_that_leaves_the_client_none_is_refused() -> None:
    from harness.experiment.server import ServerProcess
    from harness.experiment.settings import parse_cpus

    assert parse_cpus("2-3,6") == (2, 3, 6) and parse_cpus("1") == (1,)
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpus("one")
    usable = sorted(os.sched_getaffinity(0))
    everything = ",".join(map(str, usable))
    with pytest.raises(ValueError, match="leaves the client none"):
        RunPlan(pin_servers=everything).check()
    with pytest.raises(ValueError, match="not usable"):
        RunPlan(pin_servers="4095").check()
    server = ServerProcess("pickle", [], command="sleep 30", cpus=(usable[0],))
    try:
        assert os.sched_getaffinity(server.proc.pid) == {usable[0]}
    finally:
        server.stop()
