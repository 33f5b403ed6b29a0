"""The experiment's pure parts: codec lists and arms, round order, forwarded flags, the report."""

import argparse

import pytest

from harness.analysis.compare import Arm, compare
from harness.analysis.comparison_text import format_comparison as format_report
from harness.analysis.runs import RunEntry
from harness.commands.run import add_arguments
from harness.experiment.arms import ArmSpec, parse_codecs, round_order
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


def test_rounds_reverse_the_order_every_other_round():
    arms = parse_codecs("pickle,msgspec,msgspec-oob")
    assert [a.label for a in round_order(arms, 0)] == ["pickle", "msgspec", "msgspec-oob"]
    assert [a.label for a in round_order(arms, 1)] == ["msgspec-oob", "msgspec", "pickle"]
    assert round_order(arms, 2) == arms


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
