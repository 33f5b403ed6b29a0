"""OpenAI request parsing: JSON bodies of /v1/completions and /v1/chat/completions.

Pure functions with no aiohttp in them. Parsing is strict about the types of
the fields it understands (a wrong type is a 400 naming the field) and ignores
fields it does not know, as OpenAI clients send extras such as ``user``.
Value ranges are the sampling contract's (``harness.wire.messages.
validate_sampling_params``), checked once here so every codec carries the same
accepted values. Fields that would change the output in a way this server
cannot honour (``echo``, ``prompt_logprobs``, ``n > 1``...) are refused rather than
silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.wire.limits import DEFAULT_LIMITS, RequestLimits, over_limit
from harness.wire.messages import MAX_LOGPROBS, SamplingParams, SamplingParamsError, validate_sampling_params

# --- errors -------------------------------------------------------------------

ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class ProtocolError(Exception):
    """A request the server refuses; becomes an OpenAI-style error body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def error_body(message: str, status: int, param: str | None = None, kind: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}`` as OpenAI (and vLLM) send it; ``code`` is the HTTP status.

    ``type`` is ``kind`` when the failure has a machine-readable kind (e.g. a
    codec's ``unsupported_payload``), else the status's OpenAI type.
    """
    return {
        "error": {
            "message": message,
            "type": kind
            or ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error"),
            "param": param,
            "code": status,
        }
    }


# --- limits -------------------------------------------------------------------------
# The bounds are harness.wire.limits' (the engine checks the same ones again): each checked by a
# length before any element is walked, each refusal a 400 naming the `bench serve` flag that sets it.


def _bound(n: int, limit: int, what: str, flag: str, param: str) -> None:
    if (message := over_limit(n, limit, what, flag)) is not None:
        raise ProtocolError(message, param=param)


# --- typed field readers --------------------------------------------------------
# bool is a subclass of int in Python; JSON true must not pass as 1.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt_int(body: dict, name: str, lo: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise ProtocolError(f"'{name}' must be an integer, got {type(v).__name__}", param=name)
    if lo is not None and v < lo:
        raise ProtocolError(f"'{name}' must be >= {lo}, got {v}", param=name)
    return v


def _opt_float(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_number(v):
        raise ProtocolError(f"'{name}' must be a number, got {type(v).__name__}", param=name)
    if v != v or v in (float("inf"), float("-inf")):
        raise ProtocolError(f"'{name}' must be finite", param=name)
    return float(v)


def _opt_bool(body: dict, name: str) -> bool | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise ProtocolError(f"'{name}' must be a boolean, got {type(v).__name__}", param=name)
    return v


# --- requests -----------------------------------------------------------------------


@dataclass(frozen=True)
class StreamOptions:
    include_usage: bool = False
    # vLLM extension: cumulative usage in every chunk (per-chunk token counts).
    continuous_usage_stats: bool = False


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str | list[int]
    # max_tokens None: the caller fills it in from the context left.
    sampling: SamplingParams
    stream: bool
    stream_options: StreamOptions


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    # Normalised messages for the tokenizer's chat template: content is a
    # string or a list of {"type": "text", "text"} / {"type": "image_url", "image_url": {"url"}}.
    messages: list[dict[str, Any]]
    # The image URLs in the order their markers appear in the rendered prompt.
    image_urls: list[str]
    sampling: SamplingParams
    stream: bool
    stream_options: StreamOptions


def _require_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ProtocolError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _parse_model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ProtocolError("'model' must be a string", param="model")
    return model


def _parse_stop(body: dict, limits: RequestLimits) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list):
        raise ProtocolError("'stop' must be a string or a list of strings", param="stop")
    _bound(len(stop), limits.max_stop_strings, "stop strings", "--max-stop-strings", "stop")
    if not all(isinstance(s, str) for s in stop):
        raise ProtocolError("'stop' must be a string or a list of strings", param="stop")
    chars = sum(len(s) for s in stop)
    _bound(chars, limits.max_stop_chars, "characters in all stop strings", "--max-stop-chars", "stop")
    return stop


def _parse_int_list(body: dict, name: str, limit: int, flag: str) -> list[int]:
    v = body.get(name)
    if v is None:
        return []
    if not isinstance(v, list):
        raise ProtocolError(f"'{name}' must be a list of integers", param=name)
    _bound(len(v), limit, f"'{name}' entries", flag, name)
    if not all(_is_int(x) for x in v):
        raise ProtocolError(f"'{name}' must be a list of integers", param=name)
    return v


def _parse_logit_bias(body: dict, limits: RequestLimits) -> dict[int, float] | None:
    v = body.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ProtocolError("'logit_bias' must be an object of token id -> bias", param="logit_bias")
    _bound(len(v), limits.max_logit_bias, "'logit_bias' entries", "--max-logit-bias", "logit_bias")
    out: dict[int, float] = {}
    for key, bias in v.items():
        try:
            tid = int(key)
        except (TypeError, ValueError):
            raise ProtocolError(f"'logit_bias' key {key!r} is not a token id", param="logit_bias") from None
        if not _is_number(bias):
            raise ProtocolError("'logit_bias' values must be numbers", param="logit_bias")
        out[tid] = float(bias)
    return out


def _refuse_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ProtocolError("only n=1 is supported", param="n")
    best_of = body.get("best_of")
    if best_of is not None and (not _is_int(best_of) or best_of != 1):
        raise ProtocolError("only best_of=1 is supported", param="best_of")
    for name in ("echo", "suffix", "prompt_logprobs"):
        v = body.get(name)
        if v not in (None, False):
            raise ProtocolError(f"'{name}' is not supported by this server", param=name)


def _parse_logprobs(body: dict, chat: bool) -> int | None:
    """Top logprobs per token, or None: completions ``logprobs: K``; chat ``logprobs: true`` and ``top_logprobs: K``."""
    if chat:
        top = _opt_int(body, "top_logprobs", lo=0)
        if top is not None and top > MAX_LOGPROBS:
            raise ProtocolError(f"'top_logprobs' must be at most {MAX_LOGPROBS}", param="top_logprobs")
        if not _opt_bool(body, "logprobs"):
            if top:
                raise ProtocolError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
            return None
        return top or 0
    k = body.get("logprobs")
    if k is None:
        return None
    if not _is_int(k) or not 0 <= k <= MAX_LOGPROBS:
        raise ProtocolError(f"'logprobs' must be an integer in [0, {MAX_LOGPROBS}]", param="logprobs")
    return int(k)


def _parse_sampling(body: dict, chat: bool, limits: RequestLimits) -> SamplingParams:
    """The sampling fields as SamplingParams (max_tokens None when absent), within the contract."""
    _refuse_unsupported(body)
    max_tokens = _opt_int(body, "max_tokens", lo=1)
    if chat:
        # OpenAI's newer name wins when both are given.
        mct = _opt_int(body, "max_completion_tokens", lo=1)
        max_tokens = mct if mct is not None else max_tokens
    top_k = _opt_int(body, "top_k")
    params = SamplingParams(
        max_tokens=max_tokens,
        # OpenAI/vLLM use -1 (or 0) for "no top-k"; SamplingParams uses 0.
        top_k=0 if top_k in (None, -1) else top_k,
        seed=_opt_int(body, "seed"),
        stop=_parse_stop(body, limits),
        stop_token_ids=_parse_int_list(body, "stop_token_ids", limits.max_stop_token_ids, "--max-stop-token-ids"),
        ignore_eos=bool(_opt_bool(body, "ignore_eos")),
        min_tokens=_opt_int(body, "min_tokens") or 0,
        logit_bias=_parse_logit_bias(body, limits),
        logprobs=_parse_logprobs(body, chat),
    )
    for name in _FLOAT_FIELDS:  # absent: SamplingParams' default
        value = _opt_float(body, name)
        if value is not None:
            setattr(params, name, value)
    try:
        validate_sampling_params(params)
    except SamplingParamsError as exc:
        raise ProtocolError(str(exc), param=exc.param) from None
    return params


_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def _parse_stream(body: dict) -> tuple[bool, StreamOptions]:
    stream = bool(_opt_bool(body, "stream"))
    raw = body.get("stream_options")
    if raw is None:
        return stream, StreamOptions()
    if not isinstance(raw, dict):
        raise ProtocolError("'stream_options' must be an object", param="stream_options")
    if not stream:
        raise ProtocolError("'stream_options' is only allowed with stream=true", param="stream_options")
    return stream, StreamOptions(
        include_usage=bool(_opt_bool(raw, "include_usage")),
        continuous_usage_stats=bool(_opt_bool(raw, "continuous_usage_stats")),
    )


def parse_completion_request(body: Any, limits: RequestLimits = DEFAULT_LIMITS) -> CompletionRequest:
    """Validate a /v1/completions body; raises ProtocolError naming the bad field."""
    body = _require_object(body)
    if "prompt" not in body:
        raise ProtocolError("'prompt' is required", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list):
        if len(prompt) > limits.max_prompt_tokens:  # a token prompt longer than the context: refused unread
            raise ProtocolError(
                f"the prompt has {len(prompt)} token ids, over this model's context of {limits.max_prompt_tokens}",
                param="prompt",
            )
        # A list of strings or of token lists is a batch; a flat int list is one prompt.
        if prompt and all(_is_int(t) for t in prompt):
            pass
        elif len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
            if isinstance(prompt, list) and not all(_is_int(t) for t in prompt):
                raise ProtocolError("a token prompt must be a list of integers", param="prompt")
        elif len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
            raise ProtocolError("batched prompts are not supported; send one prompt per request", param="prompt")
        else:
            raise ProtocolError("'prompt' must be a string or a list of token ids", param="prompt")
    elif not isinstance(prompt, str):
        raise ProtocolError("'prompt' must be a string or a list of token ids", param="prompt")
    if len(prompt) == 0:
        raise ProtocolError("'prompt' must not be empty", param="prompt")
    stream, options = _parse_stream(body)
    return CompletionRequest(_parse_model(body), prompt, _parse_sampling(body, False, limits), stream, options)


_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _parse_content_part(part: Any, where: str, image_urls: list[str]) -> dict[str, Any]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise ProtocolError(f"{where} must be an object with a 'type'", param="messages")
    kind = part["type"]
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise ProtocolError(f"{where}.text must be a string", param="messages")
        return {"type": "text", "text": text}
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise ProtocolError(f"{where}.image_url.url must be a string", param="messages")
        if not url.startswith("data:"):
            raise ProtocolError(
                f"{where}: only base64 data URLs (data:image/png;base64,...) are supported, not remote URLs",
                param="messages",
            )
        image_urls.append(url)
        return {"type": "image_url", "image_url": {"url": url}}
    raise ProtocolError(f"{where}: content part type {kind!r} is not supported (text, image_url)", param="messages")


def parse_chat_request(body: Any, limits: RequestLimits = DEFAULT_LIMITS) -> ChatRequest:
    """Validate a /v1/chat/completions body; raises ProtocolError naming the bad field."""
    body = _require_object(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ProtocolError("'messages' must be a non-empty list", param="messages")
    _bound(len(raw), limits.max_messages, "messages", "--max-messages", "messages")
    messages: list[dict[str, Any]] = []
    image_urls: list[str] = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ProtocolError(f"{where} must be an object", param="messages")
        role = msg.get("role")
        if role not in _ROLES:
            raise ProtocolError(f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}", param="messages")
        content = msg.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            content = [_parse_content_part(p, f"{where}.content[{j}]", image_urls) for j, p in enumerate(content)]
        elif not isinstance(content, str):
            raise ProtocolError(f"{where}.content must be a string or a list of parts", param="messages")
        messages.append({"role": role, "content": content})
    stream, options = _parse_stream(body)
    sampling = _parse_sampling(body, True, limits)
    return ChatRequest(_parse_model(body), messages, image_urls, sampling, stream, options)
