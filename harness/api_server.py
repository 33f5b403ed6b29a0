"""The OpenAI-compatible HTTP frontend: an aiohttp app built by ``build_app``.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming SSE
or not), ``GET /v1/models``, ``GET /health``, ``GET /metrics``.

Per request: parse and validate (``harness.openai_protocol``), tokenize, decode
images in a worker thread (``harness.mm_processing``), build an
``EngineCoreRequest``, then relay the engine's outputs, detokenizing
incrementally and applying stop strings here in the frontend.

Error policy (all bodies are ``{"error": {message, type, param, code}}``):
  * 400 bad JSON, bad fields, prompt + max_tokens over the context, bad images,
    and a request the codec cannot carry (``RequestRejectedError``);
  * 404 unknown model (as OpenAI does) and unknown routes; 413 body too large;
  * 503 when the engine is dead before the response started. Once an SSE
    stream has started, an error becomes one ``data: {"error": {...}}`` event
    and the stream ends *without* ``data: [DONE]``, so a client that waits
    for [DONE] cannot mistake it for a success.

The first engine output is awaited before the HTTP response starts, so codec
rejections and a dead engine still get a proper status code.

Client disconnects: the engine's generator is always closed, which (by the
EngineClient contract) aborts any request the engine did not finish. Run
the app with ``handler_cancellation=True`` (AppRunner / run_app) so a client
that leaves before its first token is noticed at once; without it the
disconnect is noticed at the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

import msgspec
from aiohttp import web

from . import openai_protocol as proto
from . import prom
from .engine_api import EngineClient, EngineDeadError, EngineRequestError, RequestRejectedError
from .messages import EngineCoreOutput, EngineCoreRequest, FinishReason, PlaceholderRange
from .mm_processing import MM_PAYLOADS, TENSOR_DTYPES, MmPayload, ProcessedImage, process_image_url
from .openai_protocol import ProtocolError
from .tokenizer import DEFAULT_IMAGE_MARKER, TextTokenizer

if TYPE_CHECKING:
    from .config import EngineConfig

log = logging.getLogger("wirebench.frontend")

# Placeholder token id when the tokenizer has no image token (user tokenizers):
# the engine only needs *some* id at the placeholder positions, it replaces
# their embeddings with the image's.
FALLBACK_IMAGE_TOKEN_ID = 0

OUTCOMES = ("completed", "failed", "aborted", "rejected")


@dataclass(frozen=True)
class FrontendSettings:
    served_model_name: str = "wirebench-tiny"
    max_model_len: int = 2048
    # Placeholder positions (embeddings) each image occupies in the prompt.
    image_tokens: int = 16
    # How images travel to the engine: the PIL image, or processed pixel tensors.
    mm_payload: MmPayload = "pil"
    mm_tensor_size: int = 336
    mm_tensor_dtype: str = "float16"
    max_image_bytes: int = 20 * 1024 * 1024  # decoded bytes of one image file
    max_images_per_request: int = 8
    max_request_bytes: int = 64 * 1024 * 1024  # whole HTTP body (base64 images inflate by 4/3)
    # max_tokens when the request has none: this cap, or less to fit the context.
    default_max_tokens: int = 16
    # None: take them from the tokenizer (image: FALLBACK_IMAGE_TOKEN_ID if it has none).
    eos_token_id: int | None = None
    image_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.mm_payload not in MM_PAYLOADS:
            raise ValueError(f"mm_payload must be one of {MM_PAYLOADS}, got {self.mm_payload!r}")
        if self.mm_tensor_dtype not in TENSOR_DTYPES:
            raise ValueError(f"mm_tensor_dtype must be one of {TENSOR_DTYPES}, got {self.mm_tensor_dtype!r}")
        for name in ("max_model_len", "image_tokens", "mm_tensor_size", "max_image_bytes",
                     "max_images_per_request", "max_request_bytes", "default_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"FrontendSettings.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_engine_config(cls, config: "EngineConfig", **overrides: Any) -> "FrontendSettings":
        """Settings that agree with the engine on context length, image size and EOS."""
        base = cls(max_model_len=config.max_model_len, image_tokens=config.image_tokens,
                   eos_token_id=config.eos_token_id)
        return replace(base, **overrides)


@dataclass
class FrontendMetrics:
    """The frontend's own counters for /metrics (the codec's come from the engine client)."""

    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0

    def samples(self, engine: EngineClient) -> dict[str, list[tuple[dict[str, str], float]]]:
        out: dict[str, list[tuple[dict[str, str], float]]] = {
            prom.REQUESTS: [({"outcome": k}, v) for k, v in self.requests.items()],
            prom.PROMPT_TOKENS: [({}, self.prompt_tokens)],
            prom.GENERATION_TOKENS: [({}, self.generation_tokens)],
            prom.REQUESTS_RUNNING: [({}, self.running)],
            prom.ENGINE_HEALTHY: [({}, 1.0 if engine.is_healthy else 0.0)],
            prom.CODEC_INFO: [({"codec": engine.codec_name}, 1.0)],
        }
        out.update(prom.codec_samples(engine.frontend_codec_stats(), engine.engine_codec_stats()))
        return out


ENGINE = web.AppKey("engine", EngineClient)
TOKENIZER = web.AppKey("tokenizer", TextTokenizer)
SETTINGS = web.AppKey("settings", FrontendSettings)
METRICS = web.AppKey("metrics", FrontendMetrics)
STARTED = web.AppKey("started", int)

_json = msgspec.json.Encoder()


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def error_response(message: str, status: int = 400, param: str | None = None) -> web.Response:
    return json_response(proto.error_body(message, status, param), status)


def _sse(obj: Any) -> bytes:
    return b"data: " + _json.encode(obj) + b"\n\n"


_DONE = b"data: [DONE]\n\n"


# --- building the engine request -------------------------------------------------


@dataclass
class Prepared:
    """A validated request, ready for the engine."""

    request: EngineCoreRequest
    chat: bool
    stream: bool
    options: proto.StreamOptions
    stops: list[str]
    model: str


def _check_model(app: web.Application, model: str | None) -> str:
    served = app[SETTINGS].served_model_name
    if model is not None and model != served:
        raise ProtocolError(f"The model `{model}` does not exist (this server serves `{served}`).",
                            status=404, param="model")
    return served


def _resolve_max_tokens(settings: FrontendSettings, prompt_len: int, requested: int | None, chat: bool) -> int:
    room = settings.max_model_len - prompt_len
    if requested is None:
        if room < 1:
            raise ProtocolError(
                f"The prompt is {prompt_len} tokens, which leaves no room to generate within this "
                f"model's maximum context length of {settings.max_model_len} tokens.", param="prompt")
        # As OpenAI and vLLM: completions default to 16 tokens, chat to the rest of the context.
        return room if chat else min(settings.default_max_tokens, room)
    if requested > room:
        raise ProtocolError(
            f"This model's maximum context length is {settings.max_model_len} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the "
            f"completion). Please reduce the prompt or max_tokens.", param="max_tokens")
    return requested


def _image_token_id(tokenizer: TextTokenizer, settings: FrontendSettings) -> int:
    if settings.image_token_id is not None:
        return settings.image_token_id
    tid = getattr(tokenizer, "image_token_id", None)
    return FALLBACK_IMAGE_TOKEN_ID if tid is None else tid


def _tokenize_with_markers(tokenizer: TextTokenizer, text: str, n_images: int) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and the index of each image marker in them.

    With an image token in the vocabulary the marker tokenizes to it and is
    found by id. Without one (user tokenizers) the text is split at the
    markers and each piece tokenized on its own; the marker positions get a
    placeholder id later.
    """
    marker_id = tokenizer.image_token_id
    marker = getattr(tokenizer, "image_marker", DEFAULT_IMAGE_MARKER)
    if marker_id is not None:
        ids = list(tokenizer.encode(text))
        positions = [i for i, t in enumerate(ids) if t == marker_id]
    else:
        pieces = text.split(marker)
        ids, positions = [], []
        for i, piece in enumerate(pieces):
            if i:
                positions.append(len(ids))
                ids.append(FALLBACK_IMAGE_TOKEN_ID)
            if piece:
                ids.extend(tokenizer.encode(piece))
    if len(positions) != n_images:
        raise ProtocolError(
            f"the prompt has {len(positions)} image markers for {n_images} images; "
            f"the text must not contain {marker!r} itself", param="messages")
    return ids, positions


def _expand_images(ids: list[int], positions: list[int], image_id: int,
                   length: int) -> tuple[list[int], list[PlaceholderRange]]:
    """Replace each marker with ``length`` placeholder ids; their ranges in the new prompt."""
    out: list[int] = []
    ranges: list[PlaceholderRange] = []
    prev = 0
    for pos in positions:
        out.extend(ids[prev:pos])
        ranges.append(PlaceholderRange(offset=len(out), length=length))
        out.extend([image_id] * length)
        prev = pos + 1
    out.extend(ids[prev:])
    return out, ranges


def _eos(tokenizer: TextTokenizer, settings: FrontendSettings) -> int | None:
    return settings.eos_token_id if settings.eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)


async def prepare_completion(app: web.Application, body: Any) -> Prepared:
    req = proto.parse_completion_request(body)
    model = _check_model(app, req.model)
    tokenizer, settings = app[TOKENIZER], app[SETTINGS]
    if isinstance(req.prompt, str):
        text: str | None = req.prompt
        ids = list(tokenizer.encode(req.prompt))
        if not ids:
            raise ProtocolError("the prompt tokenizes to nothing", param="prompt")
    else:
        text, ids = None, list(req.prompt)
        vocab = tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ProtocolError(f"token id {bad} is outside the vocabulary [0, {vocab})", param="prompt")
    max_tokens = _resolve_max_tokens(settings, len(ids), req.sampling.max_tokens, chat=False)
    request = _engine_request("cmpl", text, ids, req.sampling, max_tokens, tokenizer, settings)
    return Prepared(request, False, req.stream, req.stream_options, req.sampling.stop, model)


def _engine_request(id_prefix: str, text: str | None, ids: list[int], sampling: Any, max_tokens: int,
                    tokenizer: TextTokenizer, settings: FrontendSettings, **mm: Any) -> EngineCoreRequest:
    """The EngineCoreRequest both endpoints send; ``mm`` holds the chat endpoint's image fields."""
    return EngineCoreRequest(
        request_id=f"{id_prefix}-{uuid.uuid4().hex}",
        prompt=text,
        prompt_token_ids=ids,
        sampling_params=sampling.to_sampling_params(max_tokens),
        eos_token_id=_eos(tokenizer, settings),
        arrival_time=time.time(),
        **mm,
    )


async def prepare_chat(app: web.Application, body: Any) -> Prepared:
    req = proto.parse_chat_request(body)
    model = _check_model(app, req.model)
    tokenizer, settings = app[TOKENIZER], app[SETTINGS]
    n_images = len(req.image_urls)
    if n_images > settings.max_images_per_request:
        raise ProtocolError(f"at most {settings.max_images_per_request} images per request, got {n_images}",
                            param="messages")
    text = tokenizer.apply_chat_template(req.messages)
    ids, positions = _tokenize_with_markers(tokenizer, text, n_images)
    ids, ranges = _expand_images(ids, positions, _image_token_id(tokenizer, settings), settings.image_tokens)
    # Check the context before the costly image decoding.
    max_tokens = _resolve_max_tokens(settings, len(ids), req.sampling.max_tokens, chat=True)
    mm_inputs = mm_hashes = None
    if n_images:
        images = await _process_images(req.image_urls, settings)
        mm_inputs = [img.mm_input for img in images]
        mm_hashes = [img.mm_hash for img in images]
    request = _engine_request("chatcmpl", text, ids, req.sampling, max_tokens, tokenizer, settings,
                              mm_inputs=mm_inputs, mm_hashes=mm_hashes, mm_placeholders=ranges or None)
    return Prepared(request, True, req.stream, req.stream_options, req.sampling.stop, model)


async def _process_images(urls: list[str], settings: FrontendSettings) -> list[ProcessedImage]:
    """Decode (and convert) the images off the event loop, in order."""

    def work() -> list[ProcessedImage]:
        out = []
        for i, url in enumerate(urls):
            try:
                out.append(process_image_url(url, max_bytes=settings.max_image_bytes, payload=settings.mm_payload,
                                             size=settings.mm_tensor_size, dtype=settings.mm_tensor_dtype))
            except ValueError as exc:
                raise ProtocolError(f"image {i}: {exc}", param="messages") from exc
        return out

    return await asyncio.to_thread(work)


# --- relaying the engine's outputs -------------------------------------------------------


class _Relay:
    """Turns engine outputs into text pieces: detokenize, apply stop strings, count."""

    def __init__(self, tokenizer: TextTokenizer, prep: Prepared, metrics: FrontendMetrics) -> None:
        self.metrics = metrics
        self.detok = tokenizer.incremental()
        self.filter = proto.StopStringFilter(prep.stops)
        self.prompt_tokens = len(prep.request.prompt_token_ids)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.engine_finished = False

    def add(self, out: EngineCoreOutput) -> str:
        """The text this output adds; sets finish_reason when the request is done."""
        # The client normally raises these itself; be safe if it does not.
        if out.finish_reason == FinishReason.REJECTED:
            raise RequestRejectedError(out.error or "the engine refused the request")
        if out.finish_reason == FinishReason.ERROR:
            raise EngineRequestError(out.error or "the engine failed serving the request")
        self.completion_tokens += len(out.new_token_ids)
        self.metrics.generation_tokens += len(out.new_token_ids)
        text = self.detok.add(out.new_token_ids)
        if out.finished:
            self.engine_finished = True
            text += self.detok.flush()
        piece = self.filter.push(text, final=out.finished)
        if self.filter.stopped is not None:
            self.finish_reason, self.stop_reason = "stop", self.filter.stopped
        elif out.finished:
            reason = out.finish_reason.value if out.finish_reason is not None else "stop"
            self.finish_reason, self.stop_reason = reason, out.stop_reason
        return piece

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def usage(self) -> dict[str, int]:
        return proto.usage(self.prompt_tokens, self.completion_tokens)


def _error_event(message: str, status: int) -> bytes:
    return _sse(proto.error_body(message, status))


async def _run(request: web.Request, prep: Prepared) -> web.StreamResponse:
    app = request.app
    engine, metrics = app[ENGINE], app[METRICS]
    rid = prep.request.request_id
    relay = _Relay(app[TOKENIZER], prep, metrics)
    outcome = "failed"
    metrics.running += 1
    gen: AsyncIterator[EngineCoreOutput] = engine.generate(prep.request)
    try:
        try:
            first = await anext(gen)
        except RequestRejectedError as exc:
            outcome = "rejected"
            return error_response(str(exc), 400)
        except EngineDeadError as exc:
            return error_response(f"the engine is not available: {exc}", 503)
        except EngineRequestError as exc:
            return error_response(str(exc), 500)
        except StopAsyncIteration:
            return error_response("the engine ended the request without any output", 500)
        metrics.prompt_tokens += relay.prompt_tokens
        if not prep.stream:
            resp, outcome = await _collect(prep, relay, first, gen)
            return resp
        sse = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        outcome = await _stream(request, sse, prep, relay, first, gen)
        return sse
    except asyncio.CancelledError:
        outcome = "aborted"  # the client went away (handler_cancellation)
        raise
    finally:
        metrics.running -= 1
        metrics.requests[outcome] += 1
        await _close(gen, rid)


async def _close(gen: AsyncIterator[EngineCoreOutput], rid: str) -> None:
    """Close the engine's generator; by the EngineClient contract that aborts what
    the engine did not finish (stop string, disconnect, error)."""
    try:
        await gen.aclose()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - closing must not mask the request's outcome
        log.exception("closing the engine stream of %s failed", rid)


def _chunk(prep: Prepared, relay: _Relay, text: str, first: bool, created: int) -> dict[str, Any]:
    opts = prep.options
    usage = relay.usage() if opts.continuous_usage_stats else None
    rid = prep.request.request_id
    if prep.chat:
        return proto.chat_chunk(rid, prep.model, created, text, first, relay.finish_reason, relay.stop_reason, usage)
    return proto.completion_chunk(rid, prep.model, created, text, relay.finish_reason, relay.stop_reason, usage)


async def _stream(request: web.Request, resp: web.StreamResponse, prep: Prepared, relay: _Relay,
                  first: EngineCoreOutput, gen: AsyncIterator[EngineCoreOutput]) -> str:
    """Send one SSE chunk per engine output; return the request's outcome."""
    created = proto.now()
    try:
        await resp.prepare(request)
        out: EngineCoreOutput | None = first
        is_first = True
        while out is not None:
            try:
                text = relay.add(out)
            except RequestRejectedError as exc:
                await resp.write(_error_event(str(exc), 400))
                return "rejected"
            except EngineRequestError as exc:
                await resp.write(_error_event(str(exc), 500))
                return "failed"
            await resp.write(_sse(_chunk(prep, relay, text, is_first, created)))
            is_first = False
            if relay.done:
                break
            try:
                out = await anext(gen)
            except StopAsyncIteration:
                out = None
            except RequestRejectedError as exc:
                await resp.write(_error_event(str(exc), 400))
                return "rejected"
            except EngineRequestError as exc:
                await resp.write(_error_event(str(exc), 500))
                return "failed"
            except EngineDeadError as exc:
                await resp.write(_error_event(f"the engine is not available: {exc}", 503))
                return "failed"
        if not relay.done:
            await resp.write(_error_event("the engine ended the request without finishing it", 500))
            return "failed"
        if prep.options.include_usage:
            await resp.write(_sse(proto.usage_chunk(prep.request.request_id, prep.model, created, prep.chat,
                                                    relay.usage())))
        await resp.write(_DONE)
        await resp.write_eof()
        return "completed"
    except ConnectionResetError:
        return "aborted"  # the client went away (noticed on write)
    except Exception:  # a bug here must still end the stream with an error, not hang it
        log.exception("streaming %s failed", prep.request.request_id)
        with contextlib.suppress(Exception):
            await resp.write(_error_event("internal server error while streaming", 500))
        return "failed"


async def _collect(prep: Prepared, relay: _Relay, first: EngineCoreOutput,
                   gen: AsyncIterator[EngineCoreOutput]) -> tuple[web.Response, str]:
    """Gather the whole output for a non-streaming response."""
    out: EngineCoreOutput | None = first
    try:
        while out is not None:
            relay.add(out)
            if relay.done:
                break
            out = await anext(gen, None)
    except RequestRejectedError as exc:
        return error_response(str(exc), 400), "rejected"
    except EngineRequestError as exc:
        return error_response(str(exc), 500), "failed"
    except EngineDeadError as exc:
        return error_response(f"the engine is not available: {exc}", 503), "failed"
    if not relay.done:
        return error_response("the engine ended the request without finishing it", 500), "failed"
    rid, created = prep.request.request_id, proto.now()
    body = proto.full_response(rid, prep.model, created, prep.chat, relay.filter.text, relay.finish_reason,
                               relay.stop_reason, relay.usage())
    return json_response(body), "completed"


# --- handlers ---------------------------------------------------------------------------


async def _read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].max_request_bytes
        raise ProtocolError(f"the request body is larger than the limit of {limit} bytes", status=413) from None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"the request body is not valid JSON: {exc}") from None


def _generation_handler(
    prepare: Callable[[web.Application, Any], Awaitable[Prepared]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        app = request.app
        try:
            prep = await prepare(app, await _read_json(request))
        except ProtocolError as exc:
            app[METRICS].requests["rejected"] += 1
            return error_response(exc.message, exc.status, exc.param)
        return await _run(request, prep)

    return handler


async def models(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return json_response({
        "object": "list",
        "data": [{
            "id": settings.served_model_name,
            "object": "model",
            "created": request.app[STARTED],
            "owned_by": "wirebench",
            "max_model_len": settings.max_model_len,
        }],
    })


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    if engine.is_healthy:
        return json_response({"status": "ok"})
    return json_response({"status": "unhealthy", "reason": engine.dead_reason}, 503)


async def metrics_handler(request: web.Request) -> web.Response:
    app = request.app
    text = prom.render(app[METRICS].samples(app[ENGINE]))
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Prometheus-Format": "0.0.4"})


@web.middleware
async def json_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
    """Unknown routes, wrong methods and unexpected failures as OpenAI-style JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason if exc.status != 404 else f"no route {request.method} {request.path}"
        return error_response(message, exc.status)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response("internal server error", 500)


def build_app(engine: EngineClient, tokenizer: TextTokenizer, settings: FrontendSettings) -> web.Application:
    """The frontend app. The caller owns the engine client's lifecycle (start/shutdown)."""
    app = web.Application(client_max_size=settings.max_request_bytes, middlewares=[json_errors])
    app[ENGINE] = engine
    app[TOKENIZER] = tokenizer
    app[SETTINGS] = settings
    app[METRICS] = FrontendMetrics()
    app[STARTED] = int(time.time())
    app.router.add_post("/v1/completions", _generation_handler(prepare_completion))
    app.router.add_post("/v1/chat/completions", _generation_handler(prepare_chat))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler)
    return app
