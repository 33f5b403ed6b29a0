"""The engine's account of itself travels: info dict -> /metrics gauge -> run metadata and report."""

from __future__ import annotations

from types import SimpleNamespace

from harness.engine.config import EngineConfig
from harness.engine.executor import TorchExecutor
from harness.frontend.metrics import FrontendMetrics
from harness.server_metrics import engine_info, prometheus
from harness.wire.messages import CodecStats

GPU_INFO = {
    "pid": 123,
    "codec": "pickle",
    "executor": "torch",
    "device": "cuda:0",
    "device_name": "NVIDIA H200",
    "dtype": "bfloat16",
    "model_preset": "llama-8b",
    "model": {"n_layers": 32},
    "num_params": 8030261248,
    "kv_cache_tokens": 524288,
    "max_num_seqs": 256,
    "max_model_len": 2048,
    "max_num_batched_tokens": 2048,
    "sdpa": {"prefill": "flash_attention", "prefill_cached": "efficient_attention", "decode": "efficient_attention"},
    "compile": False,
}


def test_gauge_round_trips_through_the_text_format():
    text = prometheus.render(engine_info.metric_samples(GPU_INFO))
    assert 'device="cuda:0"' in text and 'preset="llama-8b"' in text and 'params="8030261248"' in text
    back = engine_info.from_metrics(text)
    assert back is not None
    assert back["device"] == "cuda:0" and back["dtype"] == "bfloat16" and back["preset"] == "llama-8b"
    assert back["params"] == 8030261248 and back["kv_cache_tokens"] == 524288 and back["max_num_seqs"] == 256
    assert back["sdpa"] == GPU_INFO["sdpa"] and back["compile"] is False
    assert "pid" not in back and "model" not in back
    assert engine_info.from_metrics(None) is None and engine_info.from_metrics("other_metric 1\n") is None
    assert engine_info.metric_samples({}) == {}


def test_a_warning_with_awkward_characters_survives():
    info = dict(GPU_INFO, device="cpu", device_warning='fell back {to} the "CPU"\nsee\\here')
    back = engine_info.from_metrics(prometheus.render(engine_info.metric_samples(info)))
    assert back is not None and back["device"] == "cpu"
    assert back["device_warning"] == "fell back (to) the 'CPU' see/here"
    rows = dict(engine_info.report_rows(back, 700.0))
    assert "fell back" in rows["WARNING:"]


def test_report_rows_say_what_ran_and_what_admission_allows():
    back = engine_info.from_metrics(prometheus.render(engine_info.metric_samples(GPU_INFO)))
    rows = dict(engine_info.report_rows(back, 692.0))
    assert rows["Engine:"] == "llama-8b on cuda:0 (bfloat16, 8.03B params)"
    assert rows["Engine device:"] == "NVIDIA H200"
    assert "prefill flash_attention" in rows["Engine SDPA kernels:"]
    # 524,288 KV tokens / 692 a request = 757, so max_num_seqs (256) is what limits.
    assert rows["Engine admits at once:"].startswith("256 requests of ~692 tokens")
    small = dict(GPU_INFO, kv_cache_tokens=65536)
    rows = dict(
        engine_info.report_rows(engine_info.from_metrics(prometheus.render(engine_info.metric_samples(small))), 692.0)
    )
    assert rows["Engine admits at once:"].startswith("94 requests")  # the old default's ceiling
    assert engine_info.report_rows(None) == []


def _fake_engine(info: dict | None = None, **extra: object) -> SimpleNamespace:
    """What FrontendMetrics reads of an engine client, with the GPU engine's info (or ``info``)."""
    return SimpleNamespace(
        is_healthy=True,
        codec_name="pickle",
        output_codec_name="pickle",
        frontend_codec_stats=CodecStats,
        engine_codec_stats=CodecStats,
        engine_info=GPU_INFO if info is None else info,
        **extra,
    )


def test_frontend_metrics_render_the_engine_info_gauge():
    engine = _fake_engine()
    text = prometheus.render(FrontendMetrics().samples(engine))
    assert engine_info.from_metrics(text)["preset"] == "llama-8b"
    engine.engine_info = {}  # before READY: no gauge
    assert prometheus.ENGINE_INFO not in FrontendMetrics().samples(engine)


def test_a_real_executors_info_makes_a_gauge():
    info = TorchExecutor(EngineConfig(device="cpu", vocab_size=64, max_num_seqs=2, max_model_len=16)).info()
    back = engine_info.from_metrics(prometheus.render(engine_info.metric_samples(info)))
    assert back is not None
    assert back["device"] == "cpu" and back["preset"] == "tiny" and back["kv_cache_tokens"] == 32
    assert set(back["sdpa"]) == {"prefill", "prefill_cached", "decode", "attention", "attention_calls_per_layer"}
    assert back["sdpa"]["attention"] == "torch-reference"


def _scrape(steps: dict[str, int], info: dict | None = None) -> str:
    return prometheus.render(FrontendMetrics().samples(_fake_engine(info, engine_steps=steps)))


def test_step_counters_become_the_runs_admission_account():
    before = _scrape({"steps": 100, "blocked_kv_cache": 5, "blocked_max_num_seqs": 0, "blocked_token_budget": 1})
    after = _scrape({"steps": 300, "blocked_kv_cache": 65, "blocked_max_num_seqs": 10, "blocked_token_budget": 3})
    engine = engine_info.with_step_counts(engine_info.from_metrics(after), before, after)
    assert engine is not None
    assert engine["steps"] == 200
    assert engine["steps_waiting"] == {"kv_cache": 60, "max_num_seqs": 10, "token_budget": 2}
    rows = dict(engine_info.report_rows(engine, 692.0))
    want = "200; waiting after kv_cache 60, max_num_seqs 10, token_budget 2"
    assert rows["Engine steps, with requests waiting:"] == want
    assert rows["Admission-limited:"].startswith("in 35% of steps")
    # A full token budget is the step's compute, not admission: no such line.
    busy = _scrape({"steps": 300, "blocked_kv_cache": 5, "blocked_max_num_seqs": 0, "blocked_token_budget": 150})
    rows = dict(
        engine_info.report_rows(engine_info.with_step_counts(engine_info.from_metrics(busy), before, busy), 692.0)
    )
    assert "Admission-limited:" not in rows
    assert "Engine KV cache:" not in rows  # no KV counters in these scrapes
    # A server without the counters (an older build, vLLM) leaves the account as it was.
    plain = prometheus.render(engine_info.metric_samples(GPU_INFO))
    assert engine_info.with_step_counts(engine_info.from_metrics(plain), plain, plain) == engine_info.from_metrics(
        plain
    )


def test_kv_counters_become_the_runs_hit_rate_and_preemptions():
    kv0 = {"preemptions": 2, "prefix_cache_hit_tokens": 1_000, "prefix_cache_query_tokens": 5_000}
    kv1 = {"preemptions": 9, "prefix_cache_hit_tokens": 41_000, "prefix_cache_query_tokens": 105_000}
    before, after = _scrape({"steps": 10, **kv0}), _scrape({"steps": 900, **kv1})
    assert "wirebench_engine_prefix_cache_hit_tokens_total 41000" in after
    engine = engine_info.with_step_counts(engine_info.from_metrics(after), before, after)
    assert engine is not None
    assert engine["preemptions"] == 7 and engine["prefix_cache_hit_pct"] == 40.0
    rows = dict(engine_info.report_rows(engine, 692.0))
    assert rows["Engine KV cache:"] == "prefix-cache hit rate 40.0% of prompt tokens, 7 preemptions"


def test_the_loop_and_cuda_graphs_reach_the_report():
    graphs = {"enabled": True, "captured": [1, 2, 4, 8, 16], "replays": 0, "eager_steps": 0}
    info = dict(GPU_INFO, overlapped=True, cuda_graphs=graphs)
    before = _scrape({"steps": 10, "cuda_graph_replays": 3, "cuda_graph_eager_steps": 1}, info)
    after = _scrape({"steps": 500, "cuda_graph_replays": 453, "cuda_graph_eager_steps": 41}, info)
    assert "wirebench_engine_cuda_graph_replays_total 453" in after
    engine = engine_info.with_step_counts(engine_info.from_metrics(after), before, after)
    assert engine is not None and engine["overlapped"] is True
    assert engine["cuda_graph_replays"] == 450 and engine["cuda_graph_eager_steps"] == 40
    rows = dict(engine_info.report_rows(engine, 692.0))
    assert rows["Engine loop:"] == "one step of overlap (async scheduling)"
    want = "5 batch sizes captured, up to 16; 450 decode steps replayed a graph, 40 ran eagerly"
    assert rows["Engine CUDA graphs:"] == want
    failed = dict(info, cuda_graphs=dict(graphs, captured=[], error="out of memory"))
    back = engine_info.from_metrics(prometheus.render(engine_info.metric_samples(failed)))
    assert back is not None and back["cuda_graphs"] == "capture failed: out of memory"
    plain = engine_info.from_metrics(prometheus.render(engine_info.metric_samples(dict(GPU_INFO, overlapped=False))))
    assert plain is not None and "cuda_graphs" not in plain
    assert dict(engine_info.report_rows(plain))["Engine loop:"] == "schedule, run, update in series"
