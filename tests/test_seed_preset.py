"""The seed preset (bench run --preset seed-10245) and the step-time model behind it."""

from __future__ import annotations

import math
import time

import pytest

from harness.analysis.runs import RunEntry
from harness.analysis.seed_table import SEED_TABLE, format_seed_table, seed_rows
from harness.analysis.verdicts import Arm
from harness.cli import build_parser, flag_value
from harness.engine.step_time import LLAMA8B_H100, LLAMA8B_H100_FIXED_MS, step_time_model
from harness.experiment.server_flags import server_flags


def test_the_linear_model_is_the_old_fixed_plus_per_token_step() -> None:
    m = step_time_model("linear", 20.0, 0.03)
    assert m.step_ms(100, 123_456) == pytest.approx(20.0 + 0.03 * 100)  # no context term
    assert step_time_model("linear").step_ms(10, 0) == pytest.approx(2.0 + 0.01 * 10)


def test_the_llama8b_model_follows_its_measured_points_and_reads_the_cache() -> None:
    m = step_time_model(LLAMA8B_H100, fixed_ms=0.0)
    assert m.step_ms(1, 0) == pytest.approx(6.04)  # the weights' read: a one-row step
    assert m.step_ms(512, 0) == pytest.approx(12.91)
    assert m.step_ms(384, 0) == pytest.approx((9.86 + 12.91) / 2)  # linear between points
    assert m.step_ms(8192, 0) > m.step_ms(4096, 0) > m.step_ms(2048, 0)  # extrapolated past the last
    # 128 KiB of K and V a cached token at 2.7 TB/s: 48.5 ns, so 100k cached tokens add 4.85 ms.
    assert m.step_ms(1, 100_000) - m.step_ms(1, 0) == pytest.approx(4.854, abs=0.01)
    steps = [m.step_ms(n, 0) for n in range(1, 5000, 37)]
    assert steps == sorted(steps)
    assert step_time_model(LLAMA8B_H100).fixed_ms > 0  # its own fixed part when none is given


def test_an_unknown_step_model_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown sim step model 'h100'"):
        step_time_model("h100")


def test_the_preset_sets_the_seeds_workload_and_flags_given_still_win() -> None:
    parser, _ = build_parser(["run", "--preset", "seed-10245"])
    args = parser.parse_args(["run", "--preset", "seed-10245"])
    assert (args.num_prompts, args.request_rate, args.sonnet_output_len, args.sonnet_prefix_len) == (
        1000,
        40.0,
        150,
        200,
    )
    assert (args.executor, args.sim_step_model, args.max_num_seqs, args.max_num_batched_tokens) == (
        "sim",
        LLAMA8B_H100,
        1024,
        2048,
    )
    argv = ["run", "--preset=seed-10245", "--num-prompts", "20", "--codec", "msgspec,pickle"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert (args.num_prompts, args.codec, args.executor) == (20, "msgspec,pickle", "sim")
    parser, _ = build_parser(["run"])
    assert parser.parse_args(["run"]).executor == "torch"  # no preset, no preset's defaults


def test_the_preset_keeps_outputs_msgspec_in_every_arm_as_the_pr_did() -> None:
    from harness.experiment.server_flags import server_flags
    from harness.loadgen.report import codec_label

    argv = ["run", "--preset", "seed-10245", "--codec", "msgspec,pickle"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert args.output_codec == "msgspec"
    flags = server_flags(vars(args), 0)
    assert flags[flags.index("--output-codec") + 1] == "msgspec"  # every arm's server gets it
    parser, _ = build_parser(["run"])
    assert "--output-codec" not in server_flags(vars(parser.parse_args(["run"])), 0)  # default: each arm's codec
    assert codec_label("pickle", {"output_codec": "msgspec"}) == "pickle (outputs: msgspec)"
    assert codec_label("pickle", {"output_codec": "pickle"}) == codec_label("pickle", None) == "pickle"
    with pytest.raises(SystemExit):
        build_parser(["run", "--output-codec", "nope"])[0].parse_args(["run", "--output-codec", "nope"])


def test_flag_value_reads_both_spellings_and_the_last_wins() -> None:
    assert flag_value(["run", "--preset", "a", "--preset=b"], "--preset") == "b"
    assert flag_value(["run", "--presets", "a"], "--preset") is None
    assert flag_value(["run", "--preset"], "--preset") is None


def _arm(label: str, figures: dict[str, float]) -> Arm:
    return Arm(label, [RunEntry(label, 0, "ok", "", None, None, figures)])


def test_the_seed_table_puts_ours_beside_the_seeds_figures() -> None:
    ours = {k: (v or 1.0) * 1.1 for k, v in SEED_TABLE["msgspec"].items()}
    ours["p99_itl_ms"] = 30.0
    rows = {label: (ref, value, diff) for label, ref, value, diff in seed_rows(_arm("msgspec", ours))}
    assert rows["TTFT mean (ms)"][2] == pytest.approx(10.0)
    assert rows["ITL p99 (ms)"][2] == pytest.approx((30.0 / 317.37 - 1) * 100)
    text = format_seed_table([_arm("msgspec", ours), _arm("pickle", ours), _arm("msgspec-packed", ours)])
    assert "vLLM PR #10245" in text and "modelled" in text
    assert "requests and outputs in each arm's codec" in text
    assert "outputs in msgspec in every arm" in format_seed_table([_arm("pickle", ours)], "msgspec")
    assert "msgspec-packed" not in text  # a codec the seed did not measure has no row
    assert "fitted to the seed" in text
    changed = format_seed_table([_arm("msgspec", ours)], "msgspec", ["--max-num-seqs 256"])
    assert "not the preset's fit: this run set --max-num-seqs 256" in changed and "fitted to the seed" not in changed
    pickle_rows = seed_rows(_arm("pickle", ours))
    assert [r[3] for r in pickle_rows if r[1] is None] == [None] * 4  # unpublished: no difference claimed
    assert all(not math.isnan(r[2]) for r in pickle_rows)


def test_a_flag_value_that_spells_a_preset_name_applies_nothing() -> None:
    argv = ["run", "--server-log", "seed-10245"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert args.executor == "torch" and args.preset is None


def test_an_abbreviated_preset_flag_is_refused_not_half_applied() -> None:
    from harness.commands import run

    argv = ["run", "--pres=seed-10245"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert args.preset == "seed-10245" and args.executor == "torch"  # argparse took it; the preset pass did not
    assert run.main(args) == 2


def test_runs_from_before_the_step_models_compare_equal_to_runs_after() -> None:
    from harness.analysis.like_for_like import run_settings

    def entry(flags: dict) -> RunEntry:
        return RunEntry("pickle", 0, "ok", "", None, {"metadata": {"flags": {"executor": "sim", **flags}}}, None)

    before = run_settings(entry({"sim_step_fixed_ms": 2.0, "sim_step_per_token_ms": 0.01}))
    after = run_settings(entry({"sim_step_model": "linear", "sim_step_fixed_ms": None, "sim_step_per_token_ms": None}))
    assert before["sim_step_fixed_ms"] == after["sim_step_fixed_ms"] == 2.0
    assert before["sim_step_per_token_ms"] == after["sim_step_per_token_ms"] == 0.01
    seed = run_settings(
        entry({"sim_step_model": LLAMA8B_H100, "sim_step_fixed_ms": None, "sim_step_per_token_ms": None})
    )
    assert seed["sim_step_model"] == LLAMA8B_H100 and seed["sim_step_fixed_ms"] == LLAMA8B_H100_FIXED_MS
    assert seed["sim_step_per_token_ms"] == 0.0
    # An old seed run left the fixed part to the model (then 2.0 ms): its engine's report says what ran.
    old = RunEntry(
        "pickle",
        0,
        "ok",
        "",
        None,
        {
            "metadata": {
                "flags": {"executor": "sim", "sim_step_model": LLAMA8B_H100, "sim_step_fixed_ms": None},
                "engine": {"sim_step": "llama8b-h100: 2 ms + the dense layers (Vidur's H100 profile, 8 points)"},
            }
        },
        None,
    )
    assert run_settings(old)["sim_step_fixed_ms"] == 2.0


def test_the_preset_names_the_fitted_settings_a_run_changed() -> None:
    from harness.experiment.presets import SEED_10245, departures_from_fit

    argv = ["run", "--preset", "seed-10245"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert args.sim_step_fixed_ms == LLAMA8B_H100_FIXED_MS  # given by the preset: run files record it
    assert departures_from_fit(SEED_10245, vars(args)) == []
    argv += ["--max-num-seqs", "256", "--sim-step-fixed-ms", "2", "--codec", "msgspec,pickle"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert departures_from_fit(SEED_10245, vars(args)) == ["--sim-step-fixed-ms 2.0", "--max-num-seqs 256"]
    # Work added to the API server is no longer the fit either: only the GPU was fitted.
    argv = ["run", "--preset", "seed-10245", "--frontend-cpu-us-per-token", "90"]
    parser, _ = build_parser(argv)
    args = parser.parse_args(argv)
    assert departures_from_fit(SEED_10245, vars(args)) == ["--frontend-cpu-us-per-token 90.0"]
    assert "--frontend-cpu-us-per-token" in server_flags(vars(args), seed=0)  # and it reaches bench serve


def test_an_arm_whose_own_flags_leave_the_fit_says_so_in_its_block() -> None:
    from harness.experiment.presets import SEED_10245, arm_departures

    argv = ["run", "--preset", "seed-10245", "--codec", "msgspec,msgspec"]
    parser, _ = build_parser(argv)
    values = vars(parser.parse_args(argv))
    flags = {"msgspec#2": ("--frontend-cpu-us-per-token", "90", "--request-timeout", "5")}
    assert arm_departures(SEED_10245, values, flags) == {"msgspec#2": ["--frontend-cpu-us-per-token 90.0"]}
    assert arm_departures(SEED_10245, values, {"msgspec#2": ("--no-spans",)}) == {"msgspec#2": []}
    unread = arm_departures(SEED_10245, values, {"msgspec#2": ("--max-num-seqs", "many")})  # the report goes on
    assert unread == {"msgspec#2": ["flags not read here (--max-num-seqs many)"]}
    ours = {k: v or 1.0 for k, v in SEED_TABLE["msgspec"].items()}
    text = format_seed_table(
        [_arm("msgspec", ours), _arm("msgspec#2", ours)], "msgspec", [], {"msgspec#2": ["--max-num-seqs 256"]}
    )
    assert "arms marked below left the fit" in text
    first, second = text.split("msgspec#2")
    assert "not the preset's fit" not in first  # the first arm ran the fit
    assert second.splitlines()[1] == "  not the preset's fit: this arm set --max-num-seqs 256"


def test_the_modelled_api_server_work_is_cpu_time_spent() -> None:
    from harness.frontend.extra_cpu import spend_cpu

    before = time.thread_time_ns()
    spend_cpu(3_000)
    assert time.thread_time_ns() - before >= 3_000_000  # a lower bound on CPU used, not a speed
    # Only a finite amount >= 0 is taken: nan would stop the frontend's output reader.
    for bad in ("nan", "inf", "-1"):
        argv = ["run", "--preset", "seed-10245", "--frontend-cpu-us-per-token", bad]
        parser, _ = build_parser(argv)
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
