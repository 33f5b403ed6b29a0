"""Configuration shared by the engine, its scheduler and executors.

One dataclass so the frontend can hand the spawned engine process everything
it needs in a single picklable object, and so a result file can record it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from harness.engine.step_time import STEP_MODELS
from harness.settings.declare import flag_type, setting
from harness.wire.limits import DEFAULT_LIMITS, RequestLimits
from wirecodecs import UnknownCodecError, check_codec_spec

# argparse type of --codec and --output-codec: a codec ``get_codec`` accepts, options included.
codec_spec = flag_type(check_codec_spec, UnknownCodecError)


# The names of harness.engine.model.PRESETS (a test keeps them equal): here, so --help needs no torch.
MODEL_PRESETS = ("tiny", "small", "medium", "llama-1b", "llama-8b")


@dataclass
class EngineConfig:
    """Every field with a ``setting`` is a ``bench serve`` flag (harness.settings.declare): its flag,
    help and default are written here only. The others are filled in by the program."""

    codec: str = "pickle"  # of requests, and of outputs unless output_codec is set (bench serve --codec)
    output_codec: str | None = setting(
        None,
        flag="--output-codec",
        type=codec_spec,
        metavar="CODEC",
        help="the codec of the engine's outputs, the same for every arm (default: each arm's --codec): "
        "vLLM PR #10245 moved only requests to pickle, so its preset keeps outputs msgspec",
        comparable=True,
    )
    # Model
    model_preset: str = setting(
        "tiny",
        flag="--model-preset",
        choices=MODEL_PRESETS,
        help="the engine's model shape (harness/engine/model.py): tiny keeps one CPU thread ahead of a real "
        "load; the llama ones are those models' shapes with random weights, for a GPU (default %(default)s)",
        comparable=True,
    )
    device: Literal["auto", "cpu", "cuda"] = setting(
        "auto",
        flag="--device",
        choices=("auto", "cpu", "cuda"),
        help="where the model runs: auto takes CUDA when torch sees a GPU, else the CPU (default %(default)s)",
        comparable=True,
    )
    dtype: str = setting("auto", flag="--dtype", help="auto: float32 on CPU, bfloat16 on CUDA", comparable=True)
    seed: int = 0  # bench serve --seed; bench run's is the workload's, which the servers get
    vocab_size: int = 4096  # set from the tokenizer by the frontend
    eos_token_id: int | None = None
    # CPU threads for torch in the engine (so it does not starve the frontend).
    num_threads: int = setting(1, flag="--engine-threads", help="torch CPU threads in the engine")
    executor: Literal["torch", "sim"] = setting(
        "torch",
        flag="--executor",
        choices=("torch", "sim"),
        help="torch runs the model; sim models each step's time with no compute",
        comparable=True,
    )
    # sim: the step-time model (harness.engine.step_time) and its knobs; None takes the model's own.
    sim_step_model: str = setting(
        "linear",
        flag="--sim-step-model",
        choices=STEP_MODELS,
        help="sim: how a step's GPU time is modelled: linear (fixed + per token), or llama8b-h100 "
        "(Llama-3.1-8B on one H100 from public measurements, harness/engine/step_time.py)",
        comparable=True,
    )
    sim_step_fixed_ms: float | None = setting(
        None,
        flag="--sim-step-fixed-ms",
        type=float,
        help="sim: fixed ms per step (default: the model's own)",
        comparable=True,
    )
    sim_step_per_token_ms: float | None = setting(
        None,
        flag="--sim-step-per-token-ms",
        type=float,
        help="sim: ms per token (default: the model's own)",
        comparable=True,
    )
    # The host schedules step N+1 while the device runs step N (harness/engine/overlap.py).
    async_scheduling: bool = setting(
        True,
        flag="--no-async-scheduling",
        help="run schedule, launch, wait and update in series (default: one step of overlap, as vLLM's "
        "--async-scheduling: the host schedules and stages the next step while the device runs this one, "
        "sim's modelled GPU or torch on CUDA; torch on the CPU runs in series, its forward needs the "
        "host's cores)",
        comparable=True,
    )
    overlap_on_cpu: bool = setting(
        False,
        flag="--overlap-on-cpu",
        help="torch on the CPU: overlap its steps too (for studies; measured slower on the CPU, where the "
        "forward and the host share the cores)",
        comparable=True,
    )
    # Scheduler limits
    max_num_seqs: int = setting(
        64, flag="--max-num-seqs", help="most requests in one step's batch (default %(default)s)", comparable=True
    )
    max_num_batched_tokens: int = setting(
        2048,
        flag="--max-num-batched-tokens",
        help="most tokens one step computes, prefill chunks and decodes together (default %(default)s)",
        comparable=True,
    )
    max_model_len: int = setting(
        2048,
        flag="--max-model-len",
        help="longest prompt plus output a request may have, in tokens (default %(default)s)",
        comparable=True,
    )
    # The paged KV cache (harness.engine.kv_blocks): blocks of kv_block_size tokens, as many as
    # kv_cache_tokens holds. None: max_num_seqs x max_model_len tokens, the memory the cache took when
    # each sequence pinned a whole max_model_len; paged, the same memory holds many more short sequences.
    kv_cache_tokens: int | None = setting(
        None,
        flag="--kv-cache-tokens",
        type=int,
        help="KV tokens the paged cache holds (rounded down to whole blocks); default max-num-seqs x max-model-len",
    )
    kv_block_size: int = setting(16, flag="--kv-block-size", help="tokens per KV cache block", comparable=True)
    # Reuse the KV of full blocks whose tokens (and images) an earlier request already computed. Off by
    # default: the seed's step time was fitted without it (docs/seed.md), and runs before it had none.
    prefix_caching: bool = setting(
        False,
        flag="--prefix-caching",
        help="reuse the cached KV blocks of a shared prompt prefix instead of computing them again "
        "(default: off, as the seed's calibration and the runs before the paged cache)",
        comparable=True,
    )
    # Chunk prefills longer than this when other requests are running or
    # waiting; above the default sonnet prompt (~550 tokens plus the chat
    # template), so a prompt takes one pass. <= 0: no cap.
    long_prefill_token_threshold: int = 1024
    # The per-request bounds the frontend checks (bench serve --max-stop-token-ids ...), checked again on
    # every request the engine decodes: a peer that ignores them gets an error output, not a slow engine.
    request_limits: RequestLimits = DEFAULT_LIMITS
    # Multimodal: embeddings each image occupies at its placeholder.
    image_tokens: int = setting(16, flag="--image-tokens", help="embeddings per image")
    # Record the engine's half of the request timelines (harness.wire.spans) and ship them as JSON.
    spans: bool = setting(
        True,
        flag="--no-spans",
        help="record no request timelines (GET /v1/wirebench/spans, the IPC budget): to measure what they cost",
    )
    # torch.compile the dense parts of each layer (torch executor; compiles at start).
    compile: bool = setting(False, flag="--compile", help="torch.compile each layer's dense parts (compiles at start)")
    # CUDA graphs for decode-only steps (harness.engine.cuda_graphs); the engine refuses it without CUDA.
    cuda_graphs: bool = setting(
        False,
        flag="--cuda-graphs",
        help="capture decode-only steps as CUDA graphs per batch-size bucket (model and sampler; "
        "steps with prefills, logit bias, penalties, logprobs or suppressed ids run eagerly; needs CUDA)",
        comparable=True,
    )
    # Attach the scheduler's state to every output batch (EngineCoreOutputs.scheduler_stats), as vLLM
    # does with stats logging on: heavier outputs for every codec.
    output_stats: bool = setting(
        False,
        flag="--output-stats",
        help="attach the scheduler's state (running, waiting, KV usage, step tokens) to every output batch, as "
        "vLLM does with stats logging on (its default): outputs as heavy as a real server's, for every codec",
        comparable=True,
    )
    # Freeze the heap once the model is loaded (harness.processes.heap), as vLLM's engine does; the frontend
    # freezes its own by the same setting.
    gc_freeze: bool = setting(
        True,
        flag="--no-gc-freeze",
        help="leave the frontend's and engine's startup heaps to the garbage collector's full collections, "
        "as vLLM did before 2025 (default: frozen once started, as vLLM's now are; scripts/studies/gc_pauses/)",
    )

    @property
    def codec_of_outputs(self) -> str:
        return self.output_codec or self.codec

    @property
    def num_kv_blocks(self) -> int:
        """Blocks of the paged KV cache: ``kv_cache_tokens`` (or max_num_seqs x max_model_len) in whole blocks."""
        tokens = self.kv_cache_tokens if self.kv_cache_tokens is not None else self.max_num_seqs * self.max_model_len
        return tokens // max(self.kv_block_size, 1)

    @property
    def kv_capacity(self) -> int:
        """KV tokens the cache holds: ``num_kv_blocks`` x ``kv_block_size``."""
        return self.num_kv_blocks * self.kv_block_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def limits_info(config: EngineConfig) -> dict[str, Any]:
    """The engine's admission limits, for its info dict (both executors)."""
    return {
        "max_num_seqs": config.max_num_seqs,
        # The tokenizer's vocabulary (what the sampler draws from; the LM head is at least as wide).
        "vocab_size": config.vocab_size,
        "max_model_len": config.max_model_len,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "long_prefill_token_threshold": config.long_prefill_token_threshold,
        # What the paged KV cache holds (num_kv_blocks x kv_block_size) ...
        "kv_cache_tokens": config.kv_capacity,
        "kv_cache_tokens_set": config.kv_cache_tokens is not None,
        # ... and what that allows at the worst case of a whole max_model_len each.
        "max_seqs_at_max_model_len": min(config.max_num_seqs, config.kv_capacity // config.max_model_len),
        "kv_block_size": config.kv_block_size,
        "prefix_caching": config.prefix_caching,
    }
