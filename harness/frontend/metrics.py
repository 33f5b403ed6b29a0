"""The frontend's own counters for /metrics; the codec's come from the engine client."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.frontend.engine_client import EngineClient
from harness.server_metrics import engine_info, prometheus

OUTCOMES = ("completed", "failed", "aborted", "rejected")

Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass
class FrontendMetrics:
    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0

    def samples(self, engine: EngineClient) -> Samples:
        out: Samples = {
            prometheus.REQUESTS: [({"outcome": k}, v) for k, v in self.requests.items()],
            prometheus.PROMPT_TOKENS: [({}, self.prompt_tokens)],
            prometheus.GENERATION_TOKENS: [({}, self.generation_tokens)],
            prometheus.REQUESTS_RUNNING: [({}, self.running)],
            prometheus.ENGINE_HEALTHY: [({}, 1.0 if engine.is_healthy else 0.0)],
            prometheus.CODEC_INFO: [({"codec": engine.codec_name, "output_codec": engine.output_codec_name}, 1.0)],
        }
        out.update(prometheus.codec_samples(engine.frontend_codec_stats(), engine.engine_codec_stats()))
        load = getattr(engine, "engine_load", None)  # the ZeroMQ client's, from the engine's heartbeats
        if load:
            out[prometheus.ENGINE_REQUESTS] = [({"state": k}, v) for k, v in load.items()]
        steps = getattr(engine, "engine_steps", None)
        if steps:
            out[prometheus.ENGINE_STEPS] = [({}, steps.get("steps", 0))]
            out[prometheus.ENGINE_WAITING_STEPS] = [
                ({"blocked_by": k.removeprefix("blocked_")}, v) for k, v in steps.items() if k.startswith("blocked_")
            ]
            for key, name in (engine_info.KV_COUNTERS | engine_info.GRAPH_COUNTERS).items():
                if key in steps:
                    out[name] = [({}, steps[key])]
        relayed = getattr(engine, "outputs_relayed", None)  # the ZeroMQ client's
        if relayed is not None:
            out[prometheus.OUTPUTS_RELAYED] = [({}, relayed)]
            out[prometheus.OUTPUTS_BEHIND] = [({}, getattr(engine, "outputs_behind", 0))]
        store = getattr(engine, "mm_store_counts", None)  # --transport shm-store's hits, misses, ...
        if store:
            out[prometheus.MM_STORE] = [({"event": k}, v) for k, v in store.items()]
        out.update(engine_info.metric_samples(getattr(engine, "engine_info", None) or {}))  # from READY
        return out
