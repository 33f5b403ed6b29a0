"""Settings declared once (harness.settings.declare): flags, values read back, flags for a server, comparability."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from harness.engine.config import EngineConfig
from harness.experiment.server_flags import add_model_arguments, engine_of, model_defaults, server_flags
from harness.frontend.served import ServedSettings
from harness.settings.declare import add_arguments, comparable, flag_defaults, from_args, setting, to_flags


@dataclass(frozen=True)
class Knobs:
    limit: int = setting(8, flag="--limit", help="at most this many", comparable=True)
    ratio: float = setting(0.5, flag="--knob-ratio")
    spans: bool = setting(True, flag="--no-spans", help="record nothing")
    fast: bool = setting(False, flag="--fast")
    name: str | None = setting(None, flag="--knob-name", choices=lambda: ("a", "b"))
    filled_in: int = 3  # no flag: the program sets it


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, Knobs)
    return parser.parse_args(list(argv))


def test_a_dataclass_becomes_flags_and_back() -> None:
    args = parsed()
    assert vars(args) == {"limit": 8, "knob_ratio": 0.5, "no_spans": False, "fast": False, "knob_name": None}
    assert from_args(Knobs, args) == Knobs()
    knobs = from_args(Knobs, parsed("--limit", "3", "--no-spans", "--fast", "--knob-name", "b"), filled_in=9)
    assert knobs == Knobs(limit=3, spans=False, fast=True, name="b", filled_in=9)
    # Only what differs from a default becomes a flag; a switch is its bare flag, inverted or not.
    assert to_flags(knobs) == ["--limit", "3", "--no-spans", "--fast", "--knob-name", "b"]
    assert from_args(Knobs, parsed(*to_flags(knobs)), filled_in=9) == knobs
    assert to_flags(Knobs()) == []
    assert comparable(Knobs) == ("limit",)
    assert flag_defaults(Knobs)["no_spans"] is False
    with pytest.raises(SystemExit):
        parsed("--knob-name", "c")  # choices asked when the flags are added


def test_the_served_flags_keep_their_names_and_destinations() -> None:
    """Run files record these destinations under metadata.flags: they must not change."""
    assert list(model_defaults()) == [
        *("served_model_name", "verify", "frontend_cpu_us_per_token", "tokenizer"),
        *("mm_payload", "mm_tensor_size", "mm_tensor_dtype", "output_codec", "model_preset", "device", "dtype"),
        *("engine_threads", "executor", "sim_step_model", "sim_step_fixed_ms", "sim_step_per_token_ms"),
        *("no_async_scheduling", "overlap_on_cpu"),
        *("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_tokens", "kv_block_size"),
        *("prefix_caching", "image_tokens"),
        *("no_spans", "compile", "cuda_graphs", "output_stats", "no_gc_freeze"),
    ]
    assert comparable(ServedSettings, EngineConfig) == (
        *("mm_payload", "mm_tensor_size", "mm_tensor_dtype", "output_codec", "model_preset", "device", "dtype"),
        *("executor", "sim_step_model", "sim_step_fixed_ms", "sim_step_per_token_ms", "no_async_scheduling"),
        *("overlap_on_cpu", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_block_size"),
        *("prefix_caching", "cuda_graphs", "output_stats"),
    )


def test_server_flags_carry_what_differs_and_read_back_into_the_engine_config() -> None:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    argv = ["--executor", "sim", "--engine-threads", "2", "--no-gc-freeze", "--no-spans", "--mm-payload", "tensor"]
    flags = server_flags(vars(parser.parse_args(argv)), seed=7)
    assert flags[:2] == ["--seed", "7"] and sorted(flags[2:]) == sorted(argv)
    engine = engine_of(flags)
    assert (engine.executor, engine.num_threads, engine.gc_freeze, engine.spans) == ("sim", 2, False, False)
    assert server_flags(vars(parser.parse_args([])), seed=0) == ["--seed", "0"]
