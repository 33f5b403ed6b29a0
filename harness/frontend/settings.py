"""What the frontend process serves: model name, context, limits, how images travel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.engine.config import EngineConfig
from harness.frontend.images import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_PIXELS, MM_PAYLOADS, TENSOR_DTYPES, MmPayload
from harness.settings.declare import setting
from harness.wire.limits import DEFAULT_LIMITS, RequestLimits

# The prompt-size bounds follow the served context. Each guards work done before a prompt's tokens are
# counted (receiving, parsing, tokenizing), so each is the most a prompt that fits max_model_len can
# need, plus room for the rest of the body; the context itself, in tokens, is what refuses a prompt.
# A flag given (not None) replaces the derived value.

# Prompt bytes a token may stand for. Prose is ~4 bytes a token in both tokenizers and the embedded
# one's longest token is 17 bytes: at 16 any ordinary text that fits the context passes, and
# tokenizing stays bounded (2 MiB of text at a 131,072-token context). Only long runs of one
# character (tekken has tokens of 76 dashes) could fit the context in tokens and not in bytes.
PROMPT_BYTES_PER_TOKEN = 16
# JSON bytes one prompt byte can take in a body: a control character escaped as \u0000 takes 6
# (non-ASCII escaped as \uXXXX takes 2 a byte; a token-id prompt, "131071,", 8 a token).
JSON_BYTES_PER_PROMPT_BYTE = 6
# The rest of a body beside its prompt, base64 images above all: the whole of the fixed bound this replaced.
BODY_BYTES_BESIDE_PROMPT = 64 << 20
# Commas a context token may bring to a body: one per id of a token-id prompt, and a text prompt's own
# commas count too (the scan does not parse strings); CSV-like text has up to about one a token.
JSON_ELEMENTS_PER_TOKEN = 2
# Elements beside the prompt (messages, stop strings, logit_bias entries): the whole of the fixed bound
# this replaced.
JSON_ELEMENTS_BESIDE_PROMPT = 65_536


def prompt_bytes_for(max_model_len: int) -> int:
    """The default --max-prompt-bytes: the UTF-8 bytes a prompt of max_model_len tokens can need."""
    return max_model_len * PROMPT_BYTES_PER_TOKEN


def request_bytes_for(max_prompt_bytes: int) -> int:
    """The default --max-request-bytes: the largest prompt as escaped JSON, plus the rest of the body."""
    return max_prompt_bytes * JSON_BYTES_PER_PROMPT_BYTE + BODY_BYTES_BESIDE_PROMPT


def json_elements_for(max_model_len: int) -> int:
    """The default --max-json-elements: a token-id prompt of max_model_len ids, plus the rest of the body."""
    return max_model_len * JSON_ELEMENTS_PER_TOKEN + JSON_ELEMENTS_BESIDE_PROMPT


def default_model_name(preset: str) -> str:
    """The model id `bench serve` uses when --served-model-name is not given."""
    return f"wirebench-{preset}"


@dataclass(frozen=True)
class FrontendSettings:
    served_model_name: str = default_model_name(EngineConfig.model_preset)
    max_model_len: int = EngineConfig.max_model_len
    # Placeholder positions (embeddings) each image occupies in the prompt.
    image_tokens: int = EngineConfig.image_tokens
    # How images travel to the engine: the PIL image, or processed pixel tensors.
    mm_payload: MmPayload = "pil"
    mm_tensor_size: int = 336
    mm_tensor_dtype: str = "float16"
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES  # decoded bytes of one image file
    # The request limits are `bench serve` flags, declared here once (harness.settings.declare). Each is
    # checked before the work it bounds and its refusal names its flag.
    max_images_per_request: int = setting(
        8, flag="--max-images-per-request", help="images of a request (default %(default)s)"
    )
    # Decoded pixels, from the image headers before any pixel is decoded: per image and per request.
    max_image_pixels: int = setting(
        DEFAULT_MAX_PIXELS,
        flag="--max-image-pixels",
        help="pixels of one image, from its header before decoding (default %(default)s)",
    )
    max_request_pixels: int = setting(
        DEFAULT_MAX_PIXELS,
        flag="--max-request-pixels",
        help="pixels of all of a request's images, from their headers before decoding (default %(default)s)",
    )
    # Decoded pixels of all requests at once (PixelBudget): requests beyond it wait, then get a 503.
    max_inflight_pixels: int = setting(
        2 * DEFAULT_MAX_PIXELS,
        flag="--max-inflight-pixels",
        help="decoded pixels of all requests at once; more wait, then 503 (default %(default)s)",
    )
    # The three bounds below follow max_model_len: None (their flag not given) is replaced in __post_init__
    # by the value derived from it (prompt_bytes_for, request_bytes_for, json_elements_for), so each
    # field holds an int once built. Build the settings anew, not by replace(), to change the context.
    # The whole HTTP body (base64 images inflate by 4/3).
    max_request_bytes: int = setting(
        None,
        flag="--max-request-bytes",
        type=int,
        help=f"bytes of a request body (a 413 above) (default: {JSON_BYTES_PER_PROMPT_BYTE} x --max-prompt-bytes "
        f"+ {BODY_BYTES_BESIDE_PROMPT >> 20} MiB)",
    )
    # A prompt's UTF-8 bytes, checked before tokenizing.
    max_prompt_bytes: int = setting(
        None,
        flag="--max-prompt-bytes",
        type=int,
        help=f"a prompt's UTF-8 bytes, checked before tokenizing (default: {PROMPT_BYTES_PER_TOKEN} a token "
        "of --max-model-len)",
    )
    max_json_elements: int = setting(
        None,
        flag="--max-json-elements",
        type=int,
        help="JSON elements of a body (its commas, counted before parsing) (default: "
        f"{JSON_ELEMENTS_PER_TOKEN} a token of --max-model-len + {JSON_ELEMENTS_BESIDE_PROMPT:,})",
    )
    # The per-request bounds' defaults are RequestLimits' (one place for each, shared with the engine).
    max_messages: int = setting(
        DEFAULT_LIMITS.max_messages, flag="--max-messages", help="chat messages of a request (default %(default)s)"
    )
    max_stop_strings: int = setting(
        DEFAULT_LIMITS.max_stop_strings,
        flag="--max-stop-strings",
        help="stop strings of a request (default %(default)s)",
    )
    max_stop_chars: int = setting(
        DEFAULT_LIMITS.max_stop_chars,
        flag="--max-stop-chars",
        help="characters of all of a request's stop strings (default %(default)s)",
    )
    max_stop_token_ids: int = setting(
        DEFAULT_LIMITS.max_stop_token_ids,
        flag="--max-stop-token-ids",
        help="stop_token_ids of a request (default %(default)s)",
    )
    max_logit_bias: int = setting(
        DEFAULT_LIMITS.max_logit_bias,
        flag="--max-logit-bias",
        help="logit_bias entries of a request (default %(default)s)",
    )
    # Seconds to receive a whole request body (a client that never finishes one gets 408).
    body_timeout_s: float = setting(
        30.0, flag="--body-timeout", help="seconds to receive a request body (default %(default)s)"
    )
    # Seconds for a connection to send a request's complete headers, from its opening or its previous
    # response (aiohttp's keep-alive timeout, an hour by default): a slow-header client is cut off.
    header_timeout_s: float = setting(
        30.0,
        flag="--header-timeout",
        help="seconds for a connection to send a request's headers (from opening, or its last response); "
        "then it is closed (default %(default)s)",
    )
    # max_tokens when the request has none: this cap, or less to fit the context.
    default_max_tokens: int = 16
    # None: take them from the tokenizer (image: a fallback id if it has none).
    eos_token_id: int | None = None
    image_token_id: int | None = None

    def __post_init__(self) -> None:
        self._derive_prompt_bounds()
        if self.mm_payload not in MM_PAYLOADS:
            raise ValueError(f"mm_payload must be one of {MM_PAYLOADS}, got {self.mm_payload!r}")
        if self.mm_tensor_dtype not in TENSOR_DTYPES:
            raise ValueError(f"mm_tensor_dtype must be one of {TENSOR_DTYPES}, got {self.mm_tensor_dtype!r}")
        for name in (
            "max_image_pixels",
            "max_request_pixels",
            "max_inflight_pixels",
            "max_prompt_bytes",
            "body_timeout_s",
            "header_timeout_s",
            "max_model_len",
            "image_tokens",
            "mm_tensor_size",
            "max_image_bytes",
            "max_images_per_request",
            "max_request_bytes",
            "default_max_tokens",
            "max_json_elements",
            "max_messages",
            "max_stop_strings",
            "max_stop_chars",
            "max_stop_token_ids",
            "max_logit_bias",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"FrontendSettings.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_inflight_pixels < self.max_request_pixels:
            raise ValueError(
                f"max_inflight_pixels ({self.max_inflight_pixels}) must be >= max_request_pixels "
                f"({self.max_request_pixels}): a request at the limit could never be decoded"
            )

    def _derive_prompt_bounds(self) -> None:
        """The prompt-size bounds not given, from the context (a frozen dataclass: set once, here)."""
        if self.max_prompt_bytes is None:
            object.__setattr__(self, "max_prompt_bytes", prompt_bytes_for(self.max_model_len))
        if self.max_request_bytes is None:
            object.__setattr__(self, "max_request_bytes", request_bytes_for(self.max_prompt_bytes))
        if self.max_json_elements is None:
            object.__setattr__(self, "max_json_elements", json_elements_for(self.max_model_len))

    @classmethod
    def from_engine_config(cls, config: EngineConfig, **overrides: Any) -> FrontendSettings:
        """Settings that agree with the engine on model name, context length, image size and EOS."""
        agreed = {
            "served_model_name": default_model_name(config.model_preset),
            "max_model_len": config.max_model_len,
            "image_tokens": config.image_tokens,
            "eos_token_id": config.eos_token_id,
        }
        return cls(**{**agreed, **overrides})  # one construction: the derived bounds see the final context

    def limits(self) -> RequestLimits:
        """The bounds the request parser checks, by length, before walking any field."""
        return RequestLimits(
            max_prompt_tokens=self.max_model_len,
            max_messages=self.max_messages,
            max_stop_strings=self.max_stop_strings,
            max_stop_chars=self.max_stop_chars,
            max_stop_token_ids=self.max_stop_token_ids,
            max_logit_bias=self.max_logit_bias,
        )
