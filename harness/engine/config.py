"""Configuration shared by the engine, its scheduler and executors.

One dataclass so the frontend can hand the spawned engine process everything
it needs in a single picklable object, and so a result file can record it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass
class EngineConfig:
    codec: str = "pickle"  # of requests, and of outputs unless output_codec is set
    output_codec: str | None = None
    # Model
    model_preset: str = "tiny"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    seed: int = 0
    vocab_size: int = 4096  # set from the tokenizer by the frontend
    eos_token_id: int | None = None
    # CPU threads for torch in the engine (so it does not starve the frontend).
    num_threads: int = 1
    # Executor: "torch" runs the model; "sim" models each step's time.
    executor: Literal["torch", "sim"] = "torch"
    # sim: the step-time model (harness.engine.step_time) and its knobs; None takes the model's own.
    sim_step_model: str = "linear"
    sim_step_fixed_ms: float | None = None
    sim_step_per_token_ms: float | None = None
    # Scheduler limits
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    # KV-cache tokens admission may reserve across running sequences (each
    # request reserves prompt + max_tokens). None: what the preallocated cache
    # holds, max_num_seqs x max_model_len (one slot of max_model_len per
    # sequence), so max_num_seqs is the only admission limit. A smaller value
    # admits fewer requests; the cache's memory does not change.
    kv_cache_tokens: int | None = None
    # Chunk prefills longer than this when other requests are running or
    # waiting; above the default sonnet prompt (~550 tokens plus the chat
    # template), so a prompt takes one pass. <= 0: no cap.
    long_prefill_token_threshold: int = 1024
    # Multimodal: embeddings each image occupies at its placeholder.
    image_tokens: int = 16
    # Record the engine's half of the request timelines (harness.wire.spans) and ship them as JSON.
    spans: bool = True
    # torch.compile the dense parts of each layer (torch executor; compiles at start).
    compile: bool = False
    # Attach the scheduler's state to every output batch (EngineCoreOutputs.scheduler_stats), as vLLM
    # does with stats logging on: heavier outputs for every codec.
    output_stats: bool = False
    # Freeze the heap once the model is loaded (harness.wire.heap), as vLLM's engine does.
    gc_freeze: bool = True

    @property
    def codec_of_outputs(self) -> str:
        return self.output_codec or self.codec

    @property
    def kv_capacity(self) -> int:
        """KV tokens admission may reserve: ``kv_cache_tokens``, or max_num_seqs x max_model_len when None."""
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        return self.max_num_seqs * self.max_model_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
