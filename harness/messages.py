"""Wire messages between the API-server process and the engine process.

These mirror the shape of vLLM's EngineCoreRequest / EngineCoreOutputs: what a
real server sends per request and per step. They are msgspec Structs because
that is fastest for the msgspec codecs and still pickles for the pickle codecs.

``array_like=True`` encodes a Struct as a msgpack array (no field names on the
wire), ``omit_defaults=True`` drops fields left at their default, and
``gc=False`` skips GC tracking for Structs that never form reference cycles.

Multimodal inputs are deliberately typed ``Any``: each item is either a
``PIL.Image.Image`` (what vLLM's requests carried when it moved to pickle) or
a processed ``dict[str, torch.Tensor | numpy.ndarray]`` (e.g. ``pixel_values``).
How they travel is the codec's business.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec


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


class PlaceholderRange(msgspec.Struct, array_like=True, gc=False):
    """Where one multimodal item's embeddings go in the prompt: [offset, offset+length)."""

    offset: int
    length: int


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request from the frontend to the engine."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
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


class CodecStats(msgspec.Struct, array_like=True, gc=False):
    """Cumulative codec counters of one side of the transport, for /metrics.

    Times are in nanoseconds of ``time.perf_counter_ns``; ``count`` is the number
    of messages. The engine reports its own in heartbeats (JSON, outside the
    codec), so the figures being measured don't carry their own bookkeeping.
    """

    decode_count: int = 0
    decode_ns: int = 0
    decode_bytes: int = 0
    decode_frames: int = 0
    encode_count: int = 0
    encode_ns: int = 0
    encode_bytes: int = 0
    encode_frames: int = 0


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's outputs for every request that produced something."""

    outputs: list[EngineCoreOutput] = []
    step_index: int = 0
    # Wall-clock (time.time()) when the step started and when it was handed to
    # the output thread; both from the engine's clock.
    step_start_time: float = 0.0
    timestamp: float = 0.0


class EngineCoreAbort(msgspec.Struct, array_like=True, gc=False):
    """Ask the engine to stop the given requests and free their memory."""

    request_ids: list[str]


WireMessage = EngineCoreRequest | EngineCoreOutputs | EngineCoreAbort
