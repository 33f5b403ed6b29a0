"""The OpenAI-compatible wire format: request parsing, response shapes, stop strings.

Pure functions and small classes with no aiohttp in them, so the HTTP layer
(``harness.api_server``) stays a thin shell and this part is easy to test.

Parsing is strict about the fields it understands (wrong types and out-of-range
values are a 400 naming the field) and ignores fields it does not know, as
OpenAI clients send extras such as ``user``. Fields that would change the
output in a way this server cannot honour (``logprobs``, ``echo``, ``n > 1``...)
are refused rather than silently dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .messages import SamplingParams

# --- errors -------------------------------------------------------------------

ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


class ProtocolError(Exception):
    """A request the server refuses; becomes an OpenAI-style error body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}`` as OpenAI (and vLLM) send it; ``code`` is the HTTP status."""
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error"),
            "param": param,
            "code": status,
        }
    }


# --- typed field readers --------------------------------------------------------
# bool is a subclass of int in Python; JSON true must not pass as 1.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt_int(body: dict, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise ProtocolError(f"'{name}' must be an integer, got {type(v).__name__}", param=name)
    if lo is not None and v < lo:
        raise ProtocolError(f"'{name}' must be >= {lo}, got {v}", param=name)
    if hi is not None and v > hi:
        raise ProtocolError(f"'{name}' must be <= {hi}, got {v}", param=name)
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


def _in_range(name: str, v: float | None, lo: float, hi: float, lo_open: bool = False) -> None:
    if v is None:
        return
    if (v <= lo if lo_open else v < lo) or v > hi:
        left = "(" if lo_open else "["
        raise ProtocolError(f"'{name}' must be in {left}{lo:g}, {hi:g}], got {v:g}", param=name)


# --- requests -----------------------------------------------------------------------


@dataclass(frozen=True)
class StreamOptions:
    include_usage: bool = False
    # vLLM extension: cumulative usage in every chunk (per-chunk token counts).
    continuous_usage_stats: bool = False


@dataclass(frozen=True)
class SamplingFields:
    """The sampling fields of a request as sent (max_tokens may be absent)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            n=1,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            stop=list(self.stop),
            stop_token_ids=list(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            logit_bias=self.logit_bias,
        )


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt: str | list[int]
    sampling: SamplingFields
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
    sampling: SamplingFields
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


def _parse_stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ProtocolError("'stop' must be a string or a list of strings", param="stop")
    if any(s == "" for s in stop):
        raise ProtocolError("'stop' strings must not be empty", param="stop")
    return stop


def _parse_int_list(body: dict, name: str) -> list[int]:
    v = body.get(name)
    if v is None:
        return []
    if not isinstance(v, list) or not all(_is_int(x) and x >= 0 for x in v):
        raise ProtocolError(f"'{name}' must be a list of non-negative integers", param=name)
    return v


def _parse_logit_bias(body: dict) -> dict[int, float] | None:
    v = body.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ProtocolError("'logit_bias' must be an object of token id -> bias", param="logit_bias")
    out: dict[int, float] = {}
    for key, bias in v.items():
        try:
            tid = int(key)
        except (TypeError, ValueError):
            raise ProtocolError(f"'logit_bias' key {key!r} is not a token id", param="logit_bias") from None
        if not _is_number(bias) or not -100 <= bias <= 100:
            raise ProtocolError("'logit_bias' values must be numbers in [-100, 100]", param="logit_bias")
        out[tid] = float(bias)
    return out


def _refuse_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ProtocolError("only n=1 is supported", param="n")
    best_of = body.get("best_of")
    if best_of is not None and (not _is_int(best_of) or best_of != 1):
        raise ProtocolError("only best_of=1 is supported", param="best_of")
    for name in ("logprobs", "top_logprobs", "echo", "suffix", "prompt_logprobs"):
        v = body.get(name)
        if v not in (None, False):
            raise ProtocolError(f"'{name}' is not supported by this server", param=name)


def _parse_sampling(body: dict, chat: bool) -> SamplingFields:
    _refuse_unsupported(body)
    max_tokens = _opt_int(body, "max_tokens", lo=1)
    if chat:
        # OpenAI's newer name wins when both are given.
        mct = _opt_int(body, "max_completion_tokens", lo=1)
        max_tokens = mct if mct is not None else max_tokens
    temperature = _opt_float(body, "temperature")
    _in_range("temperature", temperature, 0.0, float("inf"))
    top_p = _opt_float(body, "top_p")
    _in_range("top_p", top_p, 0.0, 1.0, lo_open=True)
    top_k = _opt_int(body, "top_k", lo=-1)
    min_p = _opt_float(body, "min_p")
    _in_range("min_p", min_p, 0.0, 1.0)
    presence = _opt_float(body, "presence_penalty")
    _in_range("presence_penalty", presence, -2.0, 2.0)
    frequency = _opt_float(body, "frequency_penalty")
    _in_range("frequency_penalty", frequency, -2.0, 2.0)
    repetition = _opt_float(body, "repetition_penalty")
    _in_range("repetition_penalty", repetition, 0.0, float("inf"), lo_open=True)
    return SamplingFields(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        # OpenAI/vLLM use -1 (or 0) for "no top-k"; SamplingParams uses 0.
        top_k=0 if top_k in (None, -1) else top_k,
        min_p=0.0 if min_p is None else min_p,
        seed=_opt_int(body, "seed"),
        stop=_parse_stop(body),
        stop_token_ids=_parse_int_list(body, "stop_token_ids"),
        presence_penalty=presence or 0.0,
        frequency_penalty=frequency or 0.0,
        repetition_penalty=1.0 if repetition is None else repetition,
        ignore_eos=bool(_opt_bool(body, "ignore_eos")),
        min_tokens=_opt_int(body, "min_tokens", lo=0) or 0,
        logit_bias=_parse_logit_bias(body),
    )


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


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a /v1/completions body; raises ProtocolError naming the bad field."""
    body = _require_object(body)
    if "prompt" not in body:
        raise ProtocolError("'prompt' is required", param="prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list):
        # A list of strings or of token lists is a batch; a flat int list is one prompt.
        if prompt and all(_is_int(t) for t in prompt):
            pass
        elif len(prompt) == 1 and (isinstance(prompt[0], str) or isinstance(prompt[0], list)):
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
    return CompletionRequest(_parse_model(body), prompt, _parse_sampling(body, chat=False), stream, options)


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


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a /v1/chat/completions body; raises ProtocolError naming the bad field."""
    body = _require_object(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ProtocolError("'messages' must be a non-empty list", param="messages")
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
    return ChatRequest(_parse_model(body), messages, image_urls, _parse_sampling(body, chat=True), stream, options)


# --- stop strings ----------------------------------------------------------------------


class StopStringFilter:
    """Applies stop strings to streamed text, holding back what could still start one.

    ``push`` returns the text that is safe to send now. A tail of the text that
    is the beginning of a stop string is held back until it is clear whether
    the stop string follows; ``final=True`` releases it. When a stop string appears the
    text is cut before it and ``stopped`` names it.
    """

    def __init__(self, stops: list[str]) -> None:
        self._stops = list(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._text = ""
        self._sent = 0
        self.stopped: str | None = None

    @property
    def text(self) -> str:
        """Everything sent so far (the final output once finished)."""
        return self._text[: self._sent]

    def _partial_match(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        tail = self._text[-self._hold:] if self._hold else ""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(tail)), best, -1):
                if tail.endswith(stop[:k]):
                    best = k
                    break
        return best

    def push(self, new_text: str, final: bool = False) -> str:
        if self.stopped is not None:
            return ""
        # A stop string ending in the new text starts at most _hold chars earlier.
        search_from = max(0, len(self._text) - self._hold)
        self._text += new_text
        hit, hit_at = None, len(self._text)
        for stop in self._stops:
            at = self._text.find(stop, search_from)
            if at != -1 and at < hit_at:
                hit, hit_at = stop, at
        if hit is not None:
            self.stopped = hit
            self._text = self._text[:hit_at]
            end = hit_at
        elif final or not self._stops:
            end = len(self._text)
        else:
            end = max(self._sent, len(self._text) - self._partial_match())
        out = self._text[self._sent : end]
        self._sent = end
        return out


# --- responses ---------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def now() -> int:
    return int(time.time())


def completion_chunk(
    rid: str, model: str, created: int, text: str, finish_reason: str | None = None,
    stop_reason: int | str | None = None, usage_: dict | None = None,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason}
        ],
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def chat_chunk(
    rid: str, model: str, created: int, text: str, first: bool, finish_reason: str | None = None,
    stop_reason: int | str | None = None, usage_: dict | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason}
        ],
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def usage_chunk(rid: str, model: str, created: int, chat: bool, usage_: dict) -> dict[str, Any]:
    """The last chunk with ``include_usage``: empty choices, the totals."""
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def full_response(
    rid: str, model: str, created: int, chat: bool, text: str, finish_reason: str | None,
    stop_reason: int | str | None, usage_: dict,
) -> dict[str, Any]:
    """A non-streaming completion or chat completion; they differ only in how text is held."""
    held = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, **held, "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason}
        ],
        "usage": usage_,
    }
