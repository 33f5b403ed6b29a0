"""The experiment's pure parts: codec lists and arms, round order, forwarded flags, the report."""

import argparse
import itertools
from collections import Counter
from typing import Any, cast

import pytest

from harness.analysis.runs import RunEntry
from harness.analysis.verdict_text import format_comparison as format_report
from harness.analysis.verdicts import Arm, compare
from harness.commands.run import add_arguments
from harness.experiment.arms import ArmSpec, parse_build_arms, parse_codecs, round_order, williams_rows
from harness.experiment.flags import experiment_from_args
from wirecodecs import available_codecs


def test_parse_codecs_labels_a_repeated_codec_and_accepts_calibration_options():
    assert [a.codec for a in parse_codecs("all")] == available_codecs()
    arms = parse_codecs("msgspec, pickle,msgspec,pickle+request-delay=500us")
    assert arms == [
        ArmSpec("msgspec", "msgspec"),
        ArmSpec("pickle", "pickle"),
        ArmSpec("msgspec#2", "msgspec"),
        ArmSpec("pickle+request-delay=500us", "pickle+request-delay=500us"),
    ]
    with pytest.raises(ValueError, match="unknown codec"):
        parse_codecs("pickle,nope")
    with pytest.raises(ValueError, match="unknown codec"):
        parse_codecs("pickle+warp=9")


def test_two_arms_alternate_order_every_round():
    arms = parse_codecs("pickle,msgspec")
    assert [a.label for a in round_order(arms, 0)] == ["pickle", "msgspec"]
    assert [a.label for a in round_order(arms, 1)] == ["msgspec", "pickle"]
    assert round_order(arms, 2) == arms


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_round_order_is_a_carry_over_balanced_williams_design(k):
    rows = williams_rows(k)
    assert len(rows) == (k if k % 2 == 0 else 2 * k)
    assert all(sorted(row) == list(range(k)) for row in rows)
    positions = Counter((arm, pos) for row in rows for pos, arm in enumerate(row))
    assert len(set(positions.values())) == 1 and len(positions) == k * k  # every arm in every position alike
    follows = Counter(pair for row in rows for pair in itertools.pairwise(row))
    assert len(follows) == k * (k - 1) and len(set(follows.values())) == 1  # every ordered pair alike
    arms = list(range(k))
    assert [round_order(arms, r) for r in range(len(rows))] == rows


def test_build_arms_parse_python_codec_and_serve_flags():
    arms, flags = parse_build_arms(
        ["base=--python ../base/.venv/bin/python", "head=--codec msgspec --max-num-seqs 8"], "pickle"
    )
    assert arms[0] == ArmSpec("base", "pickle", "zmq", "../base/.venv/bin/python")
    assert arms[1] == ArmSpec("head", "msgspec")
    assert flags == {"head": ("--max-num-seqs", "8")}
    arms, _ = parse_build_arms(["vllm=--command 'my-server --port {port}'"], "pickle")
    assert arms[0].command == "my-server --port {port}"
    for bad, why in [
        (["noequals"], "NAME=SPEC"),
        (["a=", "a="], "twice"),
        (["a=--codec nope"], "unknown codec"),
        (["a=--codec pickle,msgspec"], "one codec per arm"),
        (["a=--command x --max-num-seqs 2"], "--command runs a server of its own"),
        (["a=--python"], "needs a value"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_build_arms(bad, "pickle")


def test_server_flags_forward_only_changed_model_settings():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--codec", "all", "--max-num-seqs", "8", "--mm-payload", "tensor", "--seed", "3"])
    flags = list(experiment_from_args(args).server.flags)
    assert flags[:2] == ["--seed", "3"]
    assert "--max-num-seqs" in flags and flags[flags.index("--max-num-seqs") + 1] == "8"
    assert "--mm-payload" in flags and "--model-preset" not in flags  # left at its default
    assert "--codec" not in flags and "--request-rate" not in flags  # not server flags


def _arm(label: str, ttfts: list[float]) -> Arm:
    runs = [
        RunEntry(label, i, "ok", "", None, None, {"mean_ttft_ms": v, "request_rate": 20.0}) for i, v in enumerate(ttfts)
    ]
    return Arm(label, runs)


def test_report_says_too_few_rounds_with_two_and_gives_verdicts_with_more():
    two = [_arm("pickle", [100.0, 101.0]), _arm("msgspec", [50.0, 51.0])]
    text = format_report(two, compare(two))
    assert "too few rounds for a verdict (2 < 3)" in text and "slower" not in text and "faster" not in text
    five = [_arm("pickle", [100, 101, 99, 100, 102]), _arm("msgspec", [90, 91, 89, 90.5, 91.5])]
    text = format_report(five, compare(five))
    assert "faster by -10.0%" in text


def test_report_with_only_unsupported_codecs():
    arm = Arm("msgspec", [RunEntry("msgspec", 0, "unsupported", "cannot carry images", None, None, None)])
    text = format_report([arm], None)
    assert "msgspec: unsupported: cannot carry images" in text


def test_arms_take_turns_block_by_block_in_reversed_order_every_other_block():
    import asyncio

    from harness.experiment.rounds import take_turns as _take_turns

    class FakeLoad:
        def __init__(self, name: str, calls: list, stop_at: tuple | None = None) -> None:
            self.name, self.calls, self.stop_at = name, calls, stop_at

        async def send_block(self, start: int, stop: int) -> bool:
            self.calls.append((self.name, start, stop))
            return (self.name, start) == self.stop_at  # Ctrl-C during this block

    calls: list = []
    stopped = asyncio.run(_take_turns([FakeLoad("a", calls), FakeLoad("b", calls)], 7, 3, rnd=1))
    assert not stopped
    assert calls == [("b", 0, 3), ("a", 0, 3), ("a", 3, 6), ("b", 3, 6), ("b", 6, 7), ("a", 6, 7)]
    calls.clear()
    loads = [FakeLoad("a", calls, stop_at=("a", 3)), FakeLoad("b", calls)]
    assert asyncio.run(_take_turns(loads, 7, 3, rnd=0))
    assert calls == [("a", 0, 3), ("b", 0, 3), ("b", 3, 6), ("a", 3, 6)]  # nothing after the interrupted block


def test_a_block_gap_waits_only_where_the_next_block_goes_to_another_arm():
    import asyncio
    import time

    from harness.experiment.rounds import block_gap, take_turns

    class TimedLoad:
        def __init__(self, name: str, calls: list) -> None:
            self.name, self.calls = name, calls

        async def send_block(self, start: int, stop: int) -> bool:
            self.calls.append((self.name, start, time.monotonic()))
            return False

    calls: list = []
    began = time.monotonic()
    asyncio.run(take_turns([TimedLoad("a", calls), TimedLoad("b", calls)], 6, 3, rnd=0, gap=0.2))
    assert calls[0][2] - began >= 0.2  # the warmups went to every arm just before the first block
    order = [(name, start) for name, start, _ in calls]
    assert order == [("a", 0), ("b", 0), ("b", 3), ("a", 3)]  # b's two blocks follow each other
    waits = [round(later[2] - earlier[2], 1) for earlier, later in zip(calls, calls[1:])]
    assert waits[0] >= 0.2 and waits[2] >= 0.2 and waits[1] < 0.2  # no gap between b and b

    class Plan:
        def __init__(self, gap: float | None) -> None:
            self.block_gap = gap

    class Exp:
        def __init__(self, servers: list[str], gap: float | None = None) -> None:
            self.plan = Plan(gap)
            self.arms = [type("Arm", (), {"server": s})() for s in servers]

    def gap_of(servers: list[str], gap: float | None = None) -> float:
        return block_gap(cast(Any, Exp(servers, gap)))  # only the plan's gap and the arms' servers are read

    assert gap_of(["wirebench", "wirebench"]) == 0.0
    assert gap_of(["vllm", "vllm"]) == 1.5  # vLLM's worker polls busily 1 s after its last step
    assert gap_of(["vllm", "vllm"], gap=0.0) == 0.0


def test_a_duet_sends_every_arms_block_at_once_and_stops_after_an_interrupted_one():
    import asyncio

    from harness.experiment.rounds import side_by_side

    class FakeLoad:
        def __init__(self, name: str, log: list, stop_at: int | None = None) -> None:
            self.name, self.log, self.stop_at = name, log, stop_at

        async def send_block(self, start: int, stop: int) -> bool:
            self.log.append(("start", self.name, start))
            await asyncio.sleep(0)  # the other arm's block begins before this one ends
            self.log.append(("end", self.name, start))
            return start == self.stop_at

    log: list = []
    assert not asyncio.run(side_by_side([FakeLoad("a", log), FakeLoad("b", log)], 5, 3, rnd=0))
    assert log[:4] == [("start", "a", 0), ("start", "b", 0), ("end", "a", 0), ("end", "b", 0)]
    # The next block leads with the other arm (the Williams design's next row).
    assert [entry for entry in log if entry[0] == "start"][2:] == [("start", "b", 3), ("start", "a", 3)]
    log.clear()
    assert asyncio.run(side_by_side([FakeLoad("a", log, stop_at=0), FakeLoad("b", log)], 5, 3, rnd=0))
    assert len(log) == 4  # the first pair of blocks only
