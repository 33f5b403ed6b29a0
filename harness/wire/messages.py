"""Wire messages between the API-server process and the engine process.

These mirror the shape of vLLM's EngineCoreRequest / EngineCoreOutputs: what a
real server sends per request and per step. They are msgspec Structs because
that is fastest for the msgspec codecs and still pickles for the pickle codecs.

``array_like=True`` encodes a Struct as a msgpack array (no field names on the
wire; every field is written, defaults included: ``omit_defaults=True`` drops
fields left at their default only from Structs encoded as maps, and is kept so
a switch to maps would not grow them), and ``gc=False`` skips GC tracking for
Structs that never form reference cycles.

Multimodal inputs are deliberately typed ``Any``: each item is either a
``PIL.Image.Image`` (what vLLM's requests carried when it moved to pickle) or
a processed ``dict[str, torch.Tensor | numpy.ndarray]`` (e.g. ``pixel_values``).
How they travel is the codec's business.
"""

from __future__ import annotations

import enum
import math
import struct
from typing import Any

import msgspec
import numpy as np


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The sampling parameters an OpenAI-compatible server forwards per request."""

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    logit_bias: dict[int, float] | None = None


# --- the sampling contract ------------------------------------------------------
# One set of bounds, checked by the frontend before any codec sees a request
# (a 400 naming the parameter) and again by the engine's scheduler (which may
# face a frontend it does not know). Integers must fit in int64 so that every
# codec carries the same values: msgpack and pickle differ beyond that.

# Far below float32's overflow: a temperature that becomes inf in the sampler
# turns a suppressed token's -inf / inf into NaN.
MAX_TEMPERATURE = 1000.0
# Dividing a logit by more than this already makes the token unreachable.
MAX_REPETITION_PENALTY = 1000.0
MAX_PENALTY = 2.0  # presence and frequency penalties, as OpenAI
MAX_LOGIT_BIAS = 100.0  # as OpenAI
MAX_LOGPROBS = 20  # top logprobs per token: OpenAI's limit and vLLM's default max_logprobs
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class SamplingParamsError(ValueError):
    """A sampling parameter outside the contract; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise SamplingParamsError(param, message)


def _in_int64(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


def validate_sampling_params(sp: SamplingParams) -> None:
    """Raise SamplingParamsError for a value the engine cannot honour.

    NaN fails every range check below (comparisons with NaN are false), so it
    needs no case of its own. ``max_tokens`` is checked for >= 1 only: what
    fits the context is the caller's business (it knows the prompt).
    """
    _check(
        sp.n == 1 and sp.best_of in (None, 1),
        "n",
        f"only n=1 (and best_of 1) is supported, got n={sp.n} best_of={sp.best_of}",
    )
    _check(
        0.0 <= sp.temperature <= MAX_TEMPERATURE,
        "temperature",
        f"temperature must be a finite number in [0, {MAX_TEMPERATURE:g}], got {sp.temperature}",
    )
    _check(0.0 < sp.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {sp.top_p}")
    _check(
        -1 <= sp.top_k <= INT64_MAX, "top_k", f"top_k must be -1 or 0 (disabled) or a positive int64, got {sp.top_k}"
    )
    _check(0.0 <= sp.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {sp.min_p}")
    _check(sp.seed is None or _in_int64(sp.seed), "seed", f"seed must fit in a signed 64-bit integer, got {sp.seed}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(sp, name)
        _check(
            -MAX_PENALTY <= value <= MAX_PENALTY,
            name,
            f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value}",
        )
    _check(
        0.0 < sp.repetition_penalty <= MAX_REPETITION_PENALTY,
        "repetition_penalty",
        f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], got {sp.repetition_penalty}",
    )
    _check(
        sp.max_tokens is None or 1 <= sp.max_tokens <= INT64_MAX,
        "max_tokens",
        f"max_tokens must be >= 1, got {sp.max_tokens}",
    )
    _check(0 <= sp.min_tokens <= INT64_MAX, "min_tokens", f"min_tokens must be >= 0, got {sp.min_tokens}")
    _check(
        sp.logprobs is None or 0 <= sp.logprobs <= MAX_LOGPROBS,
        "logprobs",
        f"logprobs must be in [0, {MAX_LOGPROBS}], got {sp.logprobs}",
    )
    _check(
        all(0 <= t <= INT64_MAX for t in sp.stop_token_ids),
        "stop_token_ids",
        "stop_token_ids must be non-negative 64-bit integers",
    )
    _check(all(s for s in sp.stop), "stop", "stop strings must not be empty")
    if sp.logit_bias:
        _check(all(_in_int64(t) for t in sp.logit_bias), "logit_bias", "logit_bias keys must be 64-bit token ids")
        _check(
            all(math.isfinite(v) and -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS for v in sp.logit_bias.values()),
            "logit_bias",
            f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
        )


def pack_token_ids(ids: list[int]) -> Any:
    """Token ids as a little-endian int32 numpy array, the form msgspec-packed carries.

    ``struct`` packs a list of ints faster than numpy converts one (measured:
    ~8 vs ~20 µs for 550 ids on a busy 2-core VM), and either is a Python int
    per token: the saving comes where the ids never become a list again.
    """
    return np.frombuffer(struct.pack(f"<{len(ids)}i", *ids), dtype="<i4")


class PlaceholderRange(msgspec.Struct, array_like=True, gc=False):
    """Where one multimodal item's embeddings go in the prompt: [offset, offset+length)."""

    offset: int
    length: int


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request from the frontend to the engine."""

    request_id: str
    prompt: str | None
    # A list of ints; from a codec with packed token ids (msgspec-packed) a read-only little-endian
    # int32 numpy array instead, which the engine slices without making a Python int per token.
    prompt_token_ids: list[int] | Any
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    # One entry per multimodal item: a PIL image or a dict of tensors/arrays.
    mm_inputs: list[Any] | None = None
    mm_hashes: list[str] | None = None
    mm_placeholders: list[PlaceholderRange] | None = None
    lora_request: str | None = None
    cache_salt: str | None = None
    priority: int = 0


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop token / string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # client aborted
    REJECTED = "rejected"  # the engine refused the request: invalid or undecodable (a client error)
    ERROR = "error"  # the engine failed while serving the request (a server error)


class Logprobs(msgspec.Struct, array_like=True, gc=False):
    """Top-K logprobs of each new token, as vLLM's sampler returns them (``LogprobsLists``).

    Per position: ``token_ids`` and ``logprobs`` hold the sampled token first,
    then the K most likely (K+1 entries); ``ranks`` the sampled token's rank in
    the distribution (1 = most likely).
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    ranks: list[int]


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """New tokens for one request from one engine step."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    # Set on an error output (finish_reason=ERROR): why the engine refused it.
    error: str | None = None
    # With SamplingParams.logprobs = K: the new tokens' top-K logprobs (last: absent, no bytes).
    new_logprobs: Logprobs | None = None


class CodecStats(msgspec.Struct, array_like=True, gc=False):
    """Cumulative codec counters of one side of the transport, for /metrics.

    Times are in nanoseconds of ``time.monotonic_ns`` (wall) and
    ``time.thread_time_ns`` (CPU); ``count`` is the number of messages. The
    engine reports its own in heartbeats (JSON, outside the codec), so the
    figures being measured don't carry their own bookkeeping.
    """

    decode_count: int = 0
    decode_ns: int = 0
    decode_bytes: int = 0
    decode_frames: int = 0
    encode_count: int = 0
    encode_ns: int = 0
    encode_bytes: int = 0
    encode_frames: int = 0
    # Thread CPU time (time.thread_time_ns) in the same calls: wall minus CPU is waiting (GIL, cores).
    decode_cpu_ns: int = 0
    encode_cpu_ns: int = 0
    # Wall time of the codec's adapter (our message to its native one and back: the `vllm`
    # codec's), outside the times above; 0 for codecs whose native messages are ours.
    encode_adapt_ns: int = 0
    decode_adapt_ns: int = 0


class SchedulerStats(msgspec.Struct, array_like=True, gc=False):
    """The scheduler's state after a step (``--output-stats``): what vLLM's ``SchedulerStats``,
    attached to every step's outputs with stats logging on (its default), says of the same things."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0  # reserved KV tokens over the capacity, 0..1
    num_scheduled_tokens: int = 0  # the step's tokens (prefill chunks and decodes)


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's outputs for every request that produced something."""

    outputs: list[EngineCoreOutput] = []
    step_index: int = 0
    # Wall-clock (time.time()) when the step started and when it was handed to
    # the output thread; both from the engine's clock.
    step_start_time: float = 0.0
    timestamp: float = 0.0
    # With --output-stats: the scheduler's state after the step, on every batch (last: absent, no bytes).
    scheduler_stats: SchedulerStats | None = None


class EngineCoreAbort(msgspec.Struct, array_like=True, gc=False):
    """Ask the engine to stop the given requests and free their memory."""

    request_ids: list[str]
