"""Streaming client for OpenAI-compatible servers: one record per request.

``send_request`` posts a pre-serialized body to ``/v1/completions`` or
``/v1/chat/completions`` with ``stream: true`` and reads the server-sent
events as they arrive. It fills a ``RequestRecord`` and never raises: a
refused connection, an HTTP error (with its body), malformed SSE, a timeout
or a stream that ends before ``data: [DONE]`` all end as ``success=False``
with the error kept. The one exception is cancellation, which is re-raised
after marking the record "cancelled" so the run can stop on Ctrl-C.

Token counting. If the server puts ``usage`` in every chunk (vLLM's and
wirebench's ``stream_options.continuous_usage_stats``), ``completion_tokens``
is cumulative and a chunk carries the difference from the previous one;
otherwise every chunk with non-empty text counts as one token. The total
prefers the final usage's ``completion_tokens`` when the server sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from harness.workloads.datasets import user_message
from harness.workloads.sample import SampleRequest

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT_COMPLETIONS)

_ERROR_BODY_LIMIT = 2000


@dataclass
class RequestRecord:
    """What happened to one request. Times are seconds.

    ``planned_send``, ``dispatched`` and ``actual_send`` are offsets from the
    start of the run; ``ttft``, ``latency`` and ``chunk_times`` are measured
    from ``actual_send``.
    """

    index: int
    prompt_len: int
    expected_output_len: int
    planned_send: float
    # When the runner acted on the planned time (before waiting for a
    # --max-concurrency slot).
    dispatched: float = math.nan
    # Just before the HTTP request was written.
    actual_send: float = math.nan
    # That moment on CLOCK_MONOTONIC (time.monotonic_ns; 0: never sent), the clock of the server's spans on
    # one host: it places a block's window among the server's output batches (harness.loadgen.ipc).
    send_ns: int = 0
    # First chunk that carried output, from actual_send.
    ttft: float = math.nan
    # E2EL: until data: [DONE], from actual_send.
    latency: float = math.nan
    # Arrival of every chunk that carried output (text or tokens), from
    # actual_send, and how many tokens each carried.
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    generated_text: str = ""
    output_tokens: int = 0
    # As reported by the server's usage (None when it sent none).
    prompt_tokens: int | None = None
    # True when the server sent usage with every chunk.
    usage_per_chunk: bool = False
    success: bool = False
    error: str = ""
    # The server's machine-readable kind of the error (an OpenAI-style body's
    # error.type, e.g. "unsupported_payload"), "" when it sent none.
    error_type: str = ""
    # The HTTP status of the response (200 for an error inside a stream), 0 when none came (connection
    # refused, timeout), and the server's own message (an OpenAI-style body's error.message), "" without one.
    status: int = 0
    error_message: str = ""
    # The response id the server gave (every chunk's "id"): joins the server's timelines.
    server_id: str = ""
    # The codec's µs and codec + wire µs on this request's way to its first token, from the server's
    # timelines (harness.wire.spans.CODEC_SPANS, CODEC_WIRE_SPANS); NaN for a server without them.
    codec_us: float = math.nan
    codec_wire_us: float = math.nan
    # The rate (req/s) the load offered when this request was planned: a ramp's at its place
    # (--ramp-up-strategy), else --request-rate (inf: all at once); NaN at a trace's own send times.
    offered_rps: float = math.nan
    # A conversation's turn (harness.loadgen.conversations): its conversation and turn, from 0, and the size
    # of the body sent, built as it was sent; None for an independent request.
    conversation: int | None = None
    turn: int | None = None
    request_bytes: int | None = None

    @property
    def schedule_lag(self) -> float:
        """actual − planned send; includes any wait for a concurrency slot."""
        return self.actual_send - self.planned_send

    @property
    def sent(self) -> bool:
        return not math.isnan(self.actual_send)


def is_chat(endpoint: str) -> bool:
    return endpoint.rstrip("/").endswith("chat/completions")


def build_payload(
    sample: SampleRequest,
    model: str,
    endpoint: str,
    *,
    continuous_usage: bool = True,
    logprobs: int | None = None,
) -> dict[str, Any]:
    """The JSON body for one request; images only go through chat."""
    body: dict[str, Any] = {"model": model}
    if is_chat(endpoint):
        # The message prompt_len was counted with (datasets.chat_prompt_len).
        messages = list(sample.messages) if sample.messages else [user_message(sample.prompt, sample.image_data_urls)]
        body["messages"] = messages
    else:
        if sample.image_data_urls:
            raise ValueError(
                f"request has {len(sample.image_data_urls)} image(s): images need "
                f"--endpoint {CHAT_COMPLETIONS}, not {endpoint}"
            )
        body["prompt"] = sample.completion_prompt or sample.prompt
    stream_options: dict[str, Any] = {"include_usage": True}
    if continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body.update(
        max_tokens=sample.expected_output_len,
        temperature=0.0,
        ignore_eos=True,
        stream=True,
        stream_options=stream_options,
    )
    if logprobs is not None:
        body.update({"logprobs": True, "top_logprobs": logprobs} if is_chat(endpoint) else {"logprobs": logprobs})
    return body


def encode_payload(body: dict[str, Any]) -> bytes:
    """Serialize before the clock starts, so JSON encoding of big data URLs is not measured."""
    return json.dumps(body, separators=(",", ":")).encode()


class SSEDecoder:
    """Incremental server-sent-events parser: bytes in, each event's data out.

    Only ``data:`` fields matter here; comments and other fields are skipped.
    Multi-line data is joined with newlines, as the SSE spec says.
    """

    def __init__(self) -> None:
        self._pending = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        events: list[str] = []
        for raw in lines:
            self._line(raw.rstrip(b"\r"), events)
        return events

    def flush(self) -> list[str]:
        """Events left when the stream ends without a final blank line."""
        events: list[str] = []
        if self._pending:
            self._line(self._pending.rstrip(b"\r"), events)
            self._pending = b""
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[str]) -> None:
        if not raw:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if raw.startswith(b":"):
            return
        name, _, value = raw.partition(b":")
        if name != b"data":
            return
        if value.startswith(b" "):
            value = value[1:]
        self._data.append(value.decode("utf-8", errors="replace"))


class StreamError(Exception):
    """The stream said something that makes the request a failure."""


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None


class _Chunk(msgspec.Struct):
    """The fields a streamed chunk is read for. msgspec skips the rest without building them (a
    quarter of ``json.loads``'s time per chunk); a chunk of any other shape (an error, an odd type)
    fails this decode and takes the generic path."""

    id: Any = None
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # present at all (null too): the generic path


_CHUNK = msgspec.json.Decoder(_Chunk)


class _StreamState:
    """Folds the events of one response into the record."""

    def __init__(self, record: RequestRecord, chat: bool) -> None:
        self.record = record
        self.chat = chat
        self.done = False
        self.cumulative = 0  # last cumulative completion_tokens seen in a chunk
        self.final_completion: int | None = None

    def event(self, data: str, t: float) -> None:
        if self.done:
            return  # anything after [DONE] is ignored
        if data.strip() == "[DONE]":
            self.done = True
            self.record.latency = t
            return
        try:
            chunk = _CHUNK.decode(data)
        except msgspec.DecodeError:
            chunk = None
        if chunk is None or chunk.error is not msgspec.UNSET:
            self._generic(data, t)
            return
        usage = chunk.usage
        if not self.record.server_id and isinstance(chunk.id, str):
            self.record.server_id = chunk.id
        if chunk.choices:
            choice = chunk.choices[0]
            text = ((choice.delta.content if choice.delta else None) if self.chat else choice.text) or ""
            self._chunk(text, usage.completion_tokens if usage else None, t)
        elif usage is not None:
            self.final_completion = usage.completion_tokens
        if usage is not None and usage.prompt_tokens is not None:
            self.record.prompt_tokens = usage.prompt_tokens

    def _generic(self, data: str, t: float) -> None:
        """Any chunk, as a dict: what the typed decode refused (errors, odd types) ends here."""
        try:
            msg = json.loads(data)
        except ValueError:
            raise StreamError(f"malformed SSE data: {data[:200]!r}") from None
        if not isinstance(msg, dict):
            raise StreamError(f"malformed SSE data (not an object): {data[:200]!r}")
        if "error" in msg:
            self.record.error_type, self.record.error_message = _error_type(msg), _error_message(msg)
            raise StreamError(f"server error in stream: {json.dumps(msg['error'])[:_ERROR_BODY_LIMIT]}")
        choices = msg.get("choices") or []
        usage = msg.get("usage")
        if not self.record.server_id and isinstance(msg.get("id"), str):
            self.record.server_id = msg["id"]
        if choices:
            # A choice, delta or text of another type fails the request here (AttributeError,
            # TypeError), as it always has: a stream that breaks the protocol is not a success.
            choice = choices[0]
            text = (choice.get("delta") or {}).get("content") or "" if self.chat else choice.get("text") or ""
            completion = _int_or_none(usage.get("completion_tokens")) if isinstance(usage, dict) else None
            self._chunk(text, completion, t)
        elif isinstance(usage, dict):
            # The final usage-only chunk of include_usage.
            self.final_completion = _int_or_none(usage.get("completion_tokens"))
        if isinstance(usage, dict) and usage.get("prompt_tokens") is not None:
            self.record.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))

    def _chunk(self, text: str, completion: int | None, t: float) -> None:
        if completion is not None:
            self.record.usage_per_chunk = True
            tokens = max(0, completion - self.cumulative)
            self.cumulative = max(self.cumulative, completion)
        else:
            tokens = 1 if text else 0
        if not text and tokens == 0:
            return  # role-only or empty keep-alive chunk
        rec = self.record
        if not rec.chunk_times:
            rec.ttft = t
        rec.chunk_times.append(t)
        rec.chunk_tokens.append(tokens)
        rec.generated_text += text

    def finish(self) -> None:
        rec = self.record
        if not self.done:
            raise StreamError("stream ended before data: [DONE]")
        if self.final_completion is not None:
            rec.output_tokens = self.final_completion
        elif rec.usage_per_chunk:
            rec.output_tokens = self.cumulative
        else:
            rec.output_tokens = sum(rec.chunk_tokens)
        if not rec.chunk_times:
            raise StreamError("stream finished without any output token")


def _error_type(body: Any) -> str:
    """error.type of an OpenAI-style error body, "" when there is none."""
    error = body.get("error") if isinstance(body, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else ""


def _error_message(body: Any) -> str:
    """error.message of an OpenAI-style error body (an error event's ``error`` may be the message itself)."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return message[:_ERROR_BODY_LIMIT] if isinstance(message, str) else ""


def failure_key(record: RequestRecord) -> tuple[int, str]:
    """What a failed request is counted under: (HTTP status, 0 when no response came; the server's own
    message, else what went wrong: "timeout after 5 s", the body's text)."""
    if record.error_message:
        return record.status, record.error_message
    text = record.error or "unknown error"
    return record.status, text.split(": ", 1)[-1] if text.startswith("HTTP ") else text


def describe_failure(status: int, message: str) -> str:
    """One failure reason as the console shows it."""
    return f"in stream: {message}" if status == 200 else f"HTTP {status}: {message}" if status else message


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _describe(exc: BaseException, timeout_s: float | None) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"timeout after {timeout_s:g} s" if timeout_s else "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection failed: {exc}"
    if isinstance(exc, StreamError):
        return str(exc)
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"


async def send_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    record: RequestRecord,
    *,
    origin: float,
    chat: bool,
    timeout_s: float | None = None,
) -> RequestRecord:
    """Send one streaming request and fill ``record``; never raises except on cancellation.

    ``origin`` is the ``time.perf_counter()`` of the run's start, the zero of
    ``record.actual_send``.
    """
    state = _StreamState(record, chat)
    decoder = SSEDecoder()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    start = time.perf_counter()
    record.send_ns = time.monotonic_ns()
    record.actual_send = start - origin
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
            record.status = resp.status
            if resp.status != 200:
                text = await resp.text(errors="replace")
                with contextlib.suppress(ValueError):
                    parsed = json.loads(text)
                    record.error_type, record.error_message = _error_type(parsed), _error_message(parsed)
                text = text[:_ERROR_BODY_LIMIT]
                record.error = f"HTTP {resp.status} {resp.reason or ''}".rstrip() + (f": {text}" if text else "")
                return record
            async for chunk in resp.content.iter_any():
                # One time per read for all its events: guard.py counts coalesced reads by equal chunk times.
                t = time.perf_counter() - start
                for data in decoder.feed(chunk):
                    state.event(data, t)
            t = time.perf_counter() - start
            for data in decoder.flush():
                state.event(data, t)
        state.finish()
        record.success = True
    except asyncio.CancelledError:
        record.success = False
        record.error = "cancelled"
        raise
    except Exception as exc:  # the request function never raises: keep the error
        record.success = False
        record.error = _describe(exc, timeout_s)
    return record
