"""What a server runs on, as the engine says it, on its way to a result: info dict -> /metrics -> run document.

The engine process sends ``executor.info()`` in its READY message; the frontend
renders the parts a reader of a result needs as the labels of one gauge,

    wirebench_engine_info{device="cuda:0",dtype="bfloat16",preset="llama-8b",params="8030261248",...} 1

and the load generator, which sees only /metrics, reads them back into a dict
for the run document's ``metadata["engine"]`` and its report. A CPU run while
a GPU was visible carries ``device_warning`` all the way.
"""

from __future__ import annotations

from typing import Any

from harness.server_metrics import prometheus

# label -> key of the engine's info dict
_FIELDS = {
    "output_codec": "output_codec",
    "executor": "executor",
    "sim_step": "sim_step_description",
    "device": "device",
    "device_name": "device_name",
    "dtype": "dtype",
    "preset": "model_preset",
    "params": "num_params",
    "kv_cache_tokens": "kv_cache_tokens",
    "max_num_seqs": "max_num_seqs",
    "vocab_size": "vocab_size",
    "max_model_len": "max_model_len",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "compile": "compile",
    "overlapped": "overlapped",
    "device_time": "device_time",
    "device_warning": "device_warning",
    "sdpa_warning": "sdpa_warning",
}
_BOOLS = ("compile", "overlapped")
_INTS = ("params", "kv_cache_tokens", "max_num_seqs", "vocab_size", "max_model_len", "max_num_batched_tokens")


def _clean(value: Any) -> str:
    """A label value the text format and ``prometheus.parse`` both keep intact."""
    text = str(value).replace("\\", "/").replace('"', "'").replace("\n", " ")
    return text.replace("{", "(").replace("}", ")")


def metric_labels(info: dict[str, Any]) -> dict[str, str]:
    """The gauge's labels from the engine's info dict (keys it lacks are left out)."""
    labels = {label: _clean(info[key]) for label, key in _FIELDS.items() if info.get(key) is not None}
    for flag in _BOOLS:
        if flag in labels:
            labels[flag] = "true" if info[flag] else "false"
    graphs = info.get("cuda_graphs")
    if isinstance(graphs, dict) and graphs.get("enabled"):
        captured = graphs.get("captured") or []
        failed = f"capture failed: {graphs['error']}" if graphs.get("error") else ""
        labels["cuda_graphs"] = _clean(
            failed or f"{len(captured)} batch sizes captured, up to {max(captured, default=0)}"
        )
    sdpa = info.get("sdpa")
    if isinstance(sdpa, dict) and sdpa:
        labels["sdpa"] = _clean(",".join(f"{k}={v}" for k, v in sdpa.items()))
    return labels


def metric_samples(info: dict[str, Any]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``{ENGINE_INFO: [(labels, 1)]}``, or nothing before the engine has said anything."""
    return {prometheus.ENGINE_INFO: [(metric_labels(info), 1.0)]} if info else {}


def from_metrics(text: str | None) -> dict[str, Any] | None:
    """The engine's account of itself from a /metrics scrape; None when the server has none."""
    if not text:
        return None
    for (name, labels), value in prometheus.parse(text).items():
        if name != prometheus.ENGINE_INFO or not value:
            continue
        out: dict[str, Any] = dict(labels)
        for key in _INTS:
            if str(out.get(key, "")).isdigit():
                out[key] = int(out[key])
        for flag in _BOOLS:
            if flag in out:
                out[flag] = out[flag] == "true"
        if "sdpa" in out:
            out["sdpa"] = dict(part.partition("=")[::2] for part in str(out["sdpa"]).split(",") if part)
        return out
    return None


def with_step_counts(engine: dict[str, Any] | None, before: str | None, after: str | None) -> dict[str, Any] | None:
    """``engine`` plus the run's engine steps and the steps that left requests waiting, by cause.

    Differences of the heartbeat counters between two scrapes (``steps``,
    ``steps_waiting``); ``engine`` unchanged when either scrape lacks them.
    """
    if engine is None or not before or not after:
        return engine
    counts = []
    scrapes = []
    for text in (before, after):
        values = prometheus.parse(text)
        scrapes.append(values)
        steps = values.get((prometheus.ENGINE_STEPS, frozenset()))
        waiting = {
            dict(labels).get("blocked_by", "?"): v
            for (name, labels), v in values.items()
            if name == prometheus.ENGINE_WAITING_STEPS
        }
        if steps is None:
            return engine
        counts.append((steps, waiting))
    (steps0, waiting0), (steps1, waiting1) = counts
    out = {
        **engine,
        "steps": int(steps1 - steps0),
        "steps_waiting": {k: int(v - waiting0.get(k, 0)) for k, v in waiting1.items()},
    }
    delta = _deltas(scrapes, KV_COUNTERS)
    if delta is not None:  # an engine with a paged KV cache
        out["preemptions"] = delta["preemptions"]
        queries = delta["prefix_cache_query_tokens"]
        out["prefix_cache_hit_pct"] = round(100 * delta["prefix_cache_hit_tokens"] / queries, 1) if queries else 0.0
    graphs = _deltas(scrapes, GRAPH_COUNTERS)
    if graphs is not None:  # an engine with --cuda-graphs
        out.update(graphs)
    return out


def _deltas(
    scrapes: list[dict[tuple[str, frozenset[tuple[str, str]]], float]], counters: dict[str, str]
) -> dict[str, int] | None:
    """Each of ``counters`` (key: its unlabelled /metrics name) after minus before, over two parsed
    scrapes; None when either scrape lacks one of them."""
    out = {}
    for key, name in counters.items():
        before, after = (scrape.get((name, frozenset())) for scrape in scrapes)
        if before is None or after is None:
            return None
        out[key] = int(after - before)
    return out


# The scheduler's KV counters (Scheduler.step_counts) and their /metrics names.
KV_COUNTERS = {
    "preemptions": prometheus.ENGINE_PREEMPTIONS,
    "prefix_cache_hit_tokens": prometheus.ENGINE_PREFIX_HITS,
    "prefix_cache_query_tokens": prometheus.ENGINE_PREFIX_QUERIES,
}
# The executor's CUDA-graph counters (TorchExecutor.step_counts), only with --cuda-graphs.
GRAPH_COUNTERS = {
    "cuda_graph_replays": prometheus.ENGINE_GRAPH_REPLAYS,
    "cuda_graph_eager_steps": prometheus.ENGINE_GRAPH_EAGER,
}


def with_device_time(engine: dict[str, Any] | None, device: dict[str, float] | None) -> dict[str, Any] | None:
    """``engine`` plus its device's busy and idle ms over the run (sim's modelled GPU, torch's device
    thread when overlapped; from the request timelines)."""
    if engine is None or not device:
        return engine
    return {**engine, "gpu_busy_ms": device["busy_ms"], "gpu_idle_ms": device["idle_ms"]}


# Above this share of steps leaving requests waiting for KV blocks or a
# sequence slot, the report says admission limited concurrency.
ADMISSION_LIMITED_SHARE = 0.05


def report_rows(engine: dict[str, Any] | None, request_tokens: float | None = None) -> list[tuple[str, str]]:
    """(label, value) rows for the console report: what ran, and what admission allowed.

    ``request_tokens``: the workload's mean prompt + output tokens, which each
    request holds in the KV cache at its longest.
    """
    if not engine:
        return []
    params = engine.get("params")
    size = ""
    if isinstance(params, int):
        size = f", {params / 1e9:.2f}B params" if params >= 1e9 else f", {params / 1e6:.1f}M params"
    if engine.get("executor") == "sim":
        rows = [("Engine:", "sim executor, no model: each step's GPU time is modelled, not run")]
        rows.append(("Modelled step time:", str(engine.get("sim_step", "?"))))
    else:
        where = f"{engine.get('preset', '?')} on {engine.get('device', '?')} ({engine.get('dtype', '?')}{size})"
        rows = [("Engine:", where)]
    if engine.get("device_name") and engine.get("device_name") != "cpu":
        rows.append(("Engine device:", str(engine["device_name"])))
    if engine.get("sdpa"):
        rows.append(("Engine SDPA kernels:", ", ".join(f"{k} {v}" for k, v in engine["sdpa"].items())))
    kv, seqs = engine.get("kv_cache_tokens"), engine.get("max_num_seqs")
    if isinstance(kv, int) and isinstance(seqs, int):
        admits = f"max_num_seqs {seqs}, KV {kv:,} tokens"
        if request_tokens and request_tokens > 0:
            fit = min(seqs, int(kv // request_tokens))
            admits = f"{fit} requests of ~{request_tokens:.0f} tokens ({admits})"
        rows.append(("Engine admits at once:", admits))
    hit_pct, preempted = engine.get("prefix_cache_hit_pct"), engine.get("preemptions")
    if isinstance(hit_pct, (int, float)) and isinstance(preempted, int):
        rows.append(
            ("Engine KV cache:", f"prefix-cache hit rate {hit_pct:.1f}% of prompt tokens, {preempted:,} preemptions")
        )
    steps, waiting = engine.get("steps"), engine.get("steps_waiting")
    if isinstance(steps, int) and steps > 0 and isinstance(waiting, dict):
        admission = waiting.get("kv_cache", 0) + waiting.get("max_num_seqs", 0)
        causes = ", ".join(f"{k} {v:,}" for k, v in sorted(waiting.items()))
        rows.append(("Engine steps, with requests waiting:", f"{steps:,}; waiting after {causes}"))
        share = admission / steps
        if share > ADMISSION_LIMITED_SHARE:
            rows.append(
                (
                    "Admission-limited:",
                    f"in {share:.0%} of steps requests waited for KV blocks or a sequence slot, not for "
                    "compute: concurrency was capped by --kv-cache-tokens / --max-num-seqs",
                )
            )
    if isinstance(engine.get("overlapped"), bool):
        loop = "one step of overlap (async scheduling)" if engine["overlapped"] else "schedule, run, update in series"
        rows.append(("Engine loop:", loop))
    busy, idle = engine.get("gpu_busy_ms"), engine.get("gpu_idle_ms")
    if isinstance(busy, (int, float)) and isinstance(idle, (int, float)) and busy > 0:
        # sim: its modelled GPU; torch: CUDA events on the GPU's stream, or the thread that runs
        # each step's forward and sampling.
        label = "Engine device thread"
        if engine.get("executor") == "sim":
            label = "Modelled GPU"
        elif engine.get("device_time") == "cuda-events":
            label = "GPU (CUDA events)"
        rows.append(
            (f"{label} idle between steps:", f"{idle / busy:.1%} of its busy time ({idle:,.0f} / {busy:,.0f} ms)")
        )
    if engine.get("cuda_graphs"):
        graphs = str(engine["cuda_graphs"])
        replays, eager = engine.get("cuda_graph_replays"), engine.get("cuda_graph_eager_steps")
        if isinstance(replays, int) and isinstance(eager, int):
            graphs += f"; {replays:,} decode steps replayed a graph, {eager:,} ran eagerly"
        rows.append(("Engine CUDA graphs:", graphs))
    if engine.get("compile"):
        rows.append(("Engine torch.compile:", "on"))
    for key in ("device_warning", "sdpa_warning"):
        if engine.get(key):
            rows.append(("WARNING:", str(engine[key])))
    return rows
