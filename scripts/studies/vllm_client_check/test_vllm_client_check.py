"""vllm_client_check.py's parts that make vLLM 0.6.4's client comparable with ours, on synthetic data.

Not part of the product's test run (pytest's testpaths is tests/); run it with
``.venv/bin/python -m pytest scripts/studies/vllm_client_check``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from harness.tokenizers.tokenizer import load_tokenizer
from harness.wire.spans import EnginePoints, FrontPoints, RequestTimeline, trace_events

SCRIPT = Path(__file__).resolve().parent / "vllm_client_check.py"


@functools.cache
def _client_check() -> Any:
    spec = importlib.util.spec_from_file_location("vllm_client_check", SCRIPT)
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
