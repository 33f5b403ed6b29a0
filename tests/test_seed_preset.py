"""The seed preset (bench run --preset seed-10245) and the step-time model behind it."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.compare import Arm
from harness.analysis.runs import RunEntry
from harness.analysis.seed_table import SEED_TABLE, format_seed_table, seed_rows
from harness.cli import build_parser, flag_value
from harness.engine.step_time import LLAMA8B_H100, LLAMA8B_H100_FIXED_MS, step_time_model
from harness.experiment.server_flags import server_flags
from harness.wire.spans import EnginePoints, FrontPoints, RequestTimeline, trace_events
from harness.wire.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent


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
    from harness.analysis.comparable import run_settings

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


# -- scripts/vllm_client_check.py: what makes vLLM 0.6.4's client comparable ---------------


@functools.cache
def _client_check() -> Any:
    spec = importlib.util.spec_from_file_location("vllm_client_check", ROOT / "scripts" / "vllm_client_check.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_hf_copy_of_our_tokenizer_renders_and_counts_prompts_as_the_server(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(_client_check().hf_tokenizer_dir(tmp_path)))
    ours = load_tokenizer()
    roles = ["system", "developer", "user", "assistant", "tool"]
    for messages in (
        [{"role": "user", "content": "Pick as many lines as you can from these poem lines:\nA line\n"}],
        [{"role": role, "content": role[0]} for role in roles],
    ):
        text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text == ours.apply_chat_template(messages)
        assert hf(text).input_ids == ours.encode(text)  # benchmark_serving's prompt_len is the server's count


def _front(arrived_ns: int, first_chunk_ns: int = 0) -> FrontPoints:
    """A request's frontend points: arrived, prepared 5 µs later, its first chunk written (0: never)."""
    decoded = first_chunk_ns - 10_000 if first_chunk_ns else 0
    return FrontPoints(
        http_received=arrived_ns,
        prepared=arrived_ns + 5000,
        first_output_decoded=decoded,
        first_sse_written=first_chunk_ns,
    )


def _trace(tmp_path: Path, fronts: list[FrontPoints]) -> Path:
    """A server trace as `bench serve --trace-file` writes it, with steps 20 ms apart (the first at 1 ms)."""
    ms = 1_000_000
    timelines = [RequestTimeline(f"r{i}", front, EnginePoints()) for i, front in enumerate(fronts)]
    steps = [{"index": i, "start": t * ms, "end": (t + 18) * ms} for i, t in enumerate((1, 10, 30, 50, 70))]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(trace_events(timelines, [], steps, frontend_pid=1, engine_pid=2)))
    return trace


def test_the_server_view_takes_arrivals_first_chunks_and_steps_from_the_trace(tmp_path: Path) -> None:
    ms = 1_000_000
    # A test request, then three requests 20 ms apart whose first chunks leave 40 ms after they arrive.
    fronts = [_front(ms, 2 * ms)] + [_front(t * ms, (t + 40) * ms) for t in (10, 30, 50)]
    trace = _trace(tmp_path, fronts)
    view = _client_check().server_view(trace, drop_first=True)  # the vLLM client's test request goes
    assert view["requests_arrived"] == 3 and view["arrival_span_s"] == pytest.approx(0.04)
    assert view["server_ttft_mean_ms"] == pytest.approx(40.0) == view["server_ttft_median_ms"]
    assert view["server_step_interval_p50_ms"] == pytest.approx(20.0)  # the test request's step left out
    assert _client_check().server_view(trace, drop_first=False)["requests_arrived"] == 4
    unanswered = _trace(tmp_path, [*fronts, _front(60 * ms)])
    with pytest.raises(RuntimeError, match="1 requests arrived and wrote no first chunk"):
        _client_check().server_view(unanswered, drop_first=True)


def test_the_vllm_clients_figures_count_the_150_tokens_sent_and_its_chunks_with_text() -> None:
    n = 150
    full, short = [0.02] * (n - 1), [0.03] * (n - 11)  # one request saw text on every token, one on 139
    result: dict[str, Any] = {"mean_ttft_ms": 50.0, "mean_tpot_ms": 17.0, "total_output_tokens": 345, "completed": 2}
    result["itls"] = [full, short]
    figures = _client_check().client_figures("vllm", result)
    assert figures["tpot"] == pytest.approx((20.0 + 30.0 * 139 / 149) / 2)  # its gaps over the 149 sent
    assert figures["tpot_retokenized"] == 17.0 and figures["output_tokens_counted"] == 345
    assert figures["empty_chunk_share"] == pytest.approx(10 / 300)
    ours = _client_check().client_figures("ours", {"mean_ttft_ms": 50.0, "mean_tpot_ms": 21.0, "completed": 2})
    assert ours["tpot"] == 21.0 and "empty_chunk_share" not in ours


def test_the_planned_span_is_the_clients_own_schedule() -> None:
    check = _client_check()
    records = [{"planned_send": t} for t in (3.0, 0.5, 1.25)]
    assert check.planned_span_s("ours", 1, {"records": records}) == pytest.approx(2.5)
    span = check.planned_span_s("vllm", 21, {})  # 999 gaps of a 40 req/s Poisson process: about 25 s
    assert span == check.planned_span_s("vllm", 21, {}) != check.planned_span_s("vllm", 22, {})
    assert 22.0 < span < 28.0


def test_the_comparison_sets_each_run_beside_what_the_server_saw() -> None:
    def row(client: str, ttft: float, server_ttft: float, span: float, planned: float) -> dict[str, Any]:
        return {
            "client": client,
            "mean_ttft_ms": ttft,
            "server_ttft_mean_ms": server_ttft,
            "median_ttft_ms": ttft - 1,
            "server_ttft_median_ms": server_ttft - 2,
            "median_itl_ms": 23.0,
            "server_step_interval_p50_ms": 20.0,
            "requests_arrived": 1001,
            "arrival_span_s": span,
            "planned_span_s": planned,
        }

    out = _client_check().compare([row("ours", 62.0, 60.0, 25.0, 25.0), row("vllm", 65.0, 60.0, 26.0, 25.0)])
    assert out["ours"]["ttft_mean_minus_server_ms"] == [2.0] and out["vllm"]["ttft_mean_minus_server_ms"] == [5.0]
    assert out["vllm"]["ttft_median_minus_server_ms"] == [6.0]
    assert out["ours"]["itl_median_minus_step_interval_ms"] == [3.0]
    assert out["ours"]["arrival_span_over_planned_pct"] == [0.0] and out["vllm"]["arrival_span_over_planned_pct"] == [
        4.0
    ]
    assert out["ours"]["arrival_rate_delivered_per_s"] == [40.0]
