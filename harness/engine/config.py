"""Configuration shared by the engine, its scheduler and executors.

One dataclass so the frontend can hand the spawned engine process everything
it needs in a single picklable object, and so a result file can record it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass
class EngineConfig:
    codec: str = "pickle"
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
    sim_step_fixed_ms: float = 2.0
    sim_step_per_token_ms: float = 0.01
    # Scheduler limits
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    # Total KV-cache capacity in tokens across all running sequences
    # (admission control keeps prompt + max_tokens of running requests within it).
    kv_cache_tokens: int = 65536
    long_prefill_token_threshold: int = 512  # chunk prefills longer than this
    # Multimodal: embeddings each image occupies at its placeholder.
    image_tokens: int = 16

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
