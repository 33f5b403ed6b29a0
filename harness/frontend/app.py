"""The OpenAI-compatible HTTP frontend: routes, error mapping and the app factory.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming SSE
or not), ``GET /v1/models``, ``GET /health``, ``GET /metrics``, and
``GET /v1/wirebench/spans`` (each request's IPC timeline, ``harness.wire.spans``).

A request goes: parse and prepare (``inputs``: tokenize, decode images, build
the ``EngineCoreRequest``) → the engine client (codec + transport) → relay the
outputs (``outputs``: detokenize, stop strings, chunks) → HTTP.

Error policy (all bodies are ``{"error": {message, type, param, code}}``):
  * 400 bad JSON, bad fields, prompt + max_tokens over the context, bad images,
    and a request the codec cannot carry (``RequestRejectedError``; its
    machine-readable kind, e.g. ``unsupported_payload``, is the error's type);
  * 404 unknown model (as OpenAI does) and unknown routes; 413 body too large;
    415 a body that is not JSON or is compressed (``Content-Encoding``: refused before it is read);
  * engine failures as ``ENGINE_ERRORS`` says (500 failed serving, 503 engine
    dead). Before the response started they are the response's status; once an
    SSE stream has started an error becomes one ``data: {"error": {...}}`` event
    and the stream ends *without* ``data: [DONE]``, so a client that waits for
    [DONE] cannot mistake it for a success.

The first engine output is awaited before the HTTP response starts, so codec
rejections and a dead engine still get a proper status code.

Client disconnects: the engine's generator is always closed, which (by the
EngineClient contract) aborts any request the engine did not finish. Run the
app with ``handler_cancellation=True`` (AppRunner / run_app) so a client that
leaves before its first token is noticed at once; without it the disconnect
is noticed at the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler

from harness.frontend import outputs
from harness.frontend.engine_client import EngineClient
from harness.frontend.errors import (
    EngineDeadError,
    EngineRequestError,
    OverloadedError,
    RequestRejectedError,
    RequestTimeoutError,
)
from harness.frontend.images import PixelBudget, TensorAlloc
from harness.frontend.inputs import Prepared, prepare_chat, prepare_completion
from harness.frontend.metrics import FrontendMetrics
from harness.frontend.protocol import ProtocolError, error_body
from harness.frontend.settings import FrontendSettings
from harness.server_metrics import prometheus
from harness.tokenizers.tokenizer import TextTokenizer
from harness.wire.messages import EngineCoreOutput
from harness.wire.spans import FrontPoints

log = logging.getLogger("wirebench.frontend")

# What an engine-side failure becomes: HTTP status, the request's outcome in
# /metrics, and a prefix for its message. The first matching class wins.
ENGINE_ERRORS: tuple[tuple[type[Exception], int, str, str], ...] = (
    (RequestRejectedError, 400, "rejected", ""),
    (EngineDeadError, 503, "failed", "the engine is not available: "),
    (OverloadedError, 503, "failed", ""),
    (RequestTimeoutError, 504, "failed", ""),
    (EngineRequestError, 500, "failed", ""),
)


def engine_error(exc: Exception) -> tuple[dict[str, Any], int, str] | None:
    """(error body, status, outcome) for an engine client error; None for anything else."""
    for cls, status, outcome, prefix in ENGINE_ERRORS:
        if isinstance(exc, cls):
            return error_body(prefix + str(exc), status, kind=getattr(exc, "code", None)), status, outcome
    return None


ENGINE = web.AppKey("engine", EngineClient)
TOKENIZER = web.AppKey("tokenizer", TextTokenizer)
SETTINGS = web.AppKey("settings", FrontendSettings)
METRICS = web.AppKey("metrics", FrontendMetrics)
STARTED = web.AppKey("started", int)
PIXELS = web.AppKey("pixels", PixelBudget)
PARSER = web.AppKey("json_parser", ThreadPoolExecutor)
# Handlers still preparing their request (body, tokens, images) → None, or why they were cancelled.
PREPARING = web.AppKey("preparing", dict)

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")

_json = msgspec.json.Encoder()
_DONE = b"data: [DONE]\n\n"


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(body), status=status, content_type="application/json")


def error_response(message: str, status: int = 400, param: str | None = None) -> web.Response:
    return json_response(error_body(message, status, param), status)


def _sse(obj: Any) -> bytes:
    return b"data: " + _json.encode(obj) + b"\n\n"


# --- serving one request -----------------------------------------------------------


async def _run(request: web.Request, prep: Prepared, points: FrontPoints) -> web.StreamResponse:
    app = request.app
    engine, metrics = app[ENGINE], app[METRICS]
    relay = outputs.Relay(app[TOKENIZER], prep)
    outcome = "failed"
    metrics.running += 1
    gen: AsyncIterator[EngineCoreOutput] = engine.generate(prep.request, points)
    try:
        try:
            first = await anext(gen, None)
            _images_done(prep)
            if first is None:
                raise outputs.IncompleteOutputError("the engine ended the request without any output")
            metrics.prompt_tokens += relay.prompt_tokens
            if not prep.stream:
                body = await outputs.collect(prep, relay, first, gen)
                outcome = "completed"
                return json_response(body)
        except Exception as exc:
            mapped = engine_error(exc)
            if mapped is None:
                raise
            body, status, outcome = mapped
            return json_response(body, status)
        sse = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        outcome = await _stream(request, sse, prep, relay, first, gen, points)
        return sse
    except asyncio.CancelledError:
        outcome = "aborted"  # the client went away (handler_cancellation)
        raise
    finally:
        _images_done(prep)
        metrics.running -= 1
        metrics.requests[outcome] += 1
        metrics.generation_tokens += relay.completion_tokens
        await _close(gen, prep.request.request_id)


def _images_done(prep: Prepared) -> None:
    """The engine has answered (or the request ended): its decoded images are no longer needed here.
    Their pixels go back to the budget and the request stops referring to them."""
    prep.release_pixels()
    if prep.request.mm_inputs:  # a copy without them: the sent request may still be someone's record
        prep.request = msgspec.structs.replace(prep.request, mm_inputs=None)


async def _stream(
    request: web.Request,
    resp: web.StreamResponse,
    prep: Prepared,
    relay: outputs.Relay,
    first: EngineCoreOutput,
    gen: AsyncIterator[EngineCoreOutput],
    points: FrontPoints,
) -> str:
    """Send one SSE chunk per engine output; return the request's outcome."""
    try:
        await resp.prepare(request)
        try:
            async for chunk in outputs.stream(prep, relay, first, gen):
                await resp.write(_sse(chunk))
                if not points.first_sse_written:
                    points.first_sse_written = time.monotonic_ns()
                    request.app[ENGINE].timelines.front_finished(prep.request.request_id)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:
            mapped = engine_error(exc)
            if mapped is None:
                raise
            body, _, outcome = mapped
            await resp.write(_sse(body))
            return outcome
        await resp.write(_DONE)
        await resp.write_eof()
        return "completed"
    except ConnectionResetError:
        return "aborted"  # the client went away (noticed on write)
    except Exception:  # a bug here must still end the stream with an error, not hang it
        log.exception("streaming %s failed", prep.request.request_id)
        with contextlib.suppress(Exception):  # the client may be gone too
            await resp.write(_sse(error_body("internal server error while streaming", 500)))
        return "failed"


async def _close(gen: AsyncIterator[EngineCoreOutput], rid: str) -> None:
    """Close the engine's generator; by the EngineClient contract that aborts what
    the engine did not finish (stop string, disconnect, error)."""
    try:
        await gen.aclose()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - closing must not mask the request's outcome
        log.exception("closing the engine stream of %s failed", rid)


# --- handlers ----------------------------------------------------------------------------


async def _read_json(request: web.Request) -> Any:
    """The JSON body: only ``application/json`` (415 otherwise: a browser's cross-site form post, which
    needs no CORS preflight, never gets in), received within body_timeout_s (408), within the size
    limit (413), parsed with bounded nesting (400): off the event loop when it is large."""
    settings = request.app[SETTINGS]
    if request.content_type != "application/json":
        shown = request.content_type or "none"
        raise ProtocolError(f"the request body must be application/json, got {shown}", status=415)
    try:
        raw = await asyncio.wait_for(_receive(request, settings.max_request_bytes), settings.body_timeout_s)
    except TimeoutError:
        raise ProtocolError(
            f"the request body did not arrive within {settings.body_timeout_s:g} s", status=408
        ) from None
    if len(raw) >= PARSE_OFF_LOOP_BYTES:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(request.app[PARSER], _parse_then_yield, raw, settings.max_json_elements)
    return parse_json_body(raw, settings.max_json_elements)


async def _receive(request: web.Request, limit: int) -> bytearray:
    """The body as it arrived, within ``limit`` bytes (413). Kept as the bytearray it was received
    into: ``request.read()`` copies it once more into bytes, on the loop (~50 ms for 60 MB)."""
    too_large = ProtocolError(
        f"the request body is larger than the limit of {limit} bytes (bench serve --max-request-bytes)", status=413
    )
    if (request.content_length or 0) > limit:  # refused unread
        raise too_large
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > limit:
            raise too_large
    return body


# Bodies this large or larger are counted and parsed on a worker thread: on the loop, a 60 MB body held
# it ~115 ms, and eight at once stalled /health ~1 s; smaller ones stay inline (a thread hop costs more
# than they take). Neither count nor parse releases the GIL: the count goes by windows, so the loop can
# take the GIL between them, and one thread parses (PARSER), pausing after each parse as long as it
# took (_parse_then_yield), so the loop competes with one parse at a time and gets turns between them.
PARSE_OFF_LOOP_BYTES = 1 << 20
_COUNT_WINDOW = 1 << 20


def _parse_then_yield(raw: bytearray, max_elements: int) -> Any:
    """parse_json_body on the parser thread, then as long a pause before the next parse: the decode
    holds the GIL throughout, and each turn of the loop (which lets the GIL go in its poll) can wait a
    whole one, so without the pause a queue of large bodies leaves the loop one GIL turn per decode."""
    start = time.perf_counter()
    try:
        return parse_json_body(raw, max_elements)
    finally:
        time.sleep(time.perf_counter() - start)


def _count_commas(raw: bytes | bytearray) -> int:
    if len(raw) <= _COUNT_WINDOW:
        return raw.count(b",")
    return sum(raw.count(b",", start, start + _COUNT_WINDOW) for start in range(0, len(raw), _COUNT_WINDOW))


def parse_json_body(raw: bytes | bytearray, max_elements: int) -> Any:
    """The parsed body, or ProtocolError: 413 over ``max_elements``, 400 for bad or too deeply nested JSON.

    Parsing costs per element: the elements are bounded first, by the commas a byte scan counts
    (a base64 image has one)."""
    elements = _count_commas(raw)
    if elements > max_elements:
        raise ProtocolError(
            f"the request body has {elements} JSON elements, over the limit of {max_elements} "
            "(bench serve --max-json-elements)",
            status=413,
        )
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("the request body's JSON is nested too deeply") from None


Prepare = Callable[[Any, TextTokenizer, FrontendSettings, TensorAlloc | None, PixelBudget, bool], Awaitable[Prepared]]


def _unavailable(app: web.Application, reason: str) -> web.Response:
    """The 503 of a request the engine will not serve (it is dead or stalled), counted as failed."""
    body, status, outcome = engine_error(EngineDeadError(reason)) or ({}, 503, "failed")
    app[METRICS].requests[outcome] += 1
    return json_response(body, status)


def _fail_preparing(preparing: dict[asyncio.Task, str | None], reason: str) -> None:
    """The engine left ok: the requests still being prepared would only wait for it (a backlog of large
    images kept decoding for a dead engine for minutes). Each is cancelled now, answered 503 by its
    handler; the image decodes it queued are dropped with it."""
    for task, why in preparing.items():
        if why is None:
            preparing[task] = reason
            task.cancel()


def _generation_handler(prepare: Prepare) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        app = request.app
        points = FrontPoints(http_received=time.monotonic_ns())
        engine = app[ENGINE]
        if not engine.is_healthy:  # nothing to prepare for
            return _unavailable(app, engine.dead_reason or "the engine is not available")
        task = asyncio.current_task()
        assert task is not None
        preparing = app[PREPARING]
        preparing[task] = None
        try:
            alloc = getattr(engine, "tensor_alloc", None)  # the shm transport builds tensors in place
            packed = getattr(engine, "packed_token_ids", False)  # its codec takes the tokenizer's int32 ids
            body = await _read_json(request)
            prep = await prepare(body, app[TOKENIZER], app[SETTINGS], alloc, app[PIXELS], packed)
        except ProtocolError as exc:
            app[METRICS].requests["rejected"] += 1
            return error_response(exc.message, exc.status, exc.param)
        except asyncio.CancelledError:  # the engine went (_fail_preparing), or the client left
            reason = preparing.get(task)
            if reason is not None:
                task.uncancel()
                return _unavailable(app, reason)
            app[METRICS].requests["aborted"] += 1
            raise
        except ConnectionResetError:  # ... or while its body was still arriving: ended as a cancelled
            app[METRICS].requests["aborted"] += 1  # handler is, not logged as a server error
            raise asyncio.CancelledError from None
        except Exception:  # a bug: the middleware answers 500, and the request still has an outcome
            app[METRICS].requests["failed"] += 1
            raise
        finally:
            preparing.pop(task, None)
        points.prepared = time.monotonic_ns()
        return await _run(request, prep, points)

    return handler


async def _expect_continue(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: a body declared over the size limit is refused (413) before the client
    is told to send it; otherwise aiohttp's own answer."""
    limit = request.app[SETTINGS].max_request_bytes
    if (request.content_length or 0) > limit:
        request.app[METRICS].requests["rejected"] += 1
        response = error_response(
            f"the request body is larger than the limit of {limit} bytes (bench serve --max-request-bytes)", 413
        )
        response.force_close()  # the body is never read
        return response
    await _default_expect_handler(request)
    return None


async def models(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": settings.served_model_name,
                    "object": "model",
                    "created": request.app[STARTED],
                    "owned_by": "wirebench",
                    "max_model_len": settings.max_model_len,
                }
            ],
        }
    )


async def health(request: web.Request) -> web.Response:
    """200 {"status": "ok"}, or 503 with "stalled" (taken back when it answers) or "dead", and why."""
    engine = request.app[ENGINE]
    if engine.is_healthy:
        return json_response({"status": "ok"})
    return json_response({"status": engine.state, "reason": engine.dead_reason}, 503)


async def spans_handler(request: web.Request) -> web.Response:
    """Joined request timelines and output batches after the given cursors (harness.wire.spans)."""
    try:
        since = {k: int(request.query.get(f"since_{k}", "0")) for k in ("request", "batch", "lag")}
    except ValueError:
        return error_response("since_request, since_batch and since_lag must be integers", 400)
    timelines = request.app[ENGINE].timelines
    return json_response(timelines.snapshot(since["request"], since["batch"], since["lag"]))


async def _json_parser(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the one thread that parses large bodies (PARSE_OFF_LOOP_BYTES)."""
    app[PARSER] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="json-parse")
    yield
    app[PARSER].shutdown(wait=False, cancel_futures=True)


async def _watch_loop_lag(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the event-loop lag gauge runs while the app does."""
    task = asyncio.create_task(app[ENGINE].timelines.watch_loop_lag(), name="loop-lag")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def metrics_handler(request: web.Request) -> web.Response:
    app = request.app
    text = prometheus.render(app[METRICS].samples(app[ENGINE]))
    text += "\n".join(line for h in app[ENGINE].timelines.histograms() for line in h.render()) + "\n"
    return web.Response(text=text, content_type="text/plain", charset="utf-8", headers={"X-Prometheus-Format": "0.0.4"})


@web.middleware
async def refuse_compressed_bodies(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """415 for a request body with a Content-Encoding other than identity, before any byte of it is read.

    aiohttp would inflate it while reading, ahead of the body limit and on the event loop (a 1 MB gzip
    body can become 1 GiB). No LLM API client compresses its requests by default, so none is accepted.
    The connection is closed after the answer, so the rest of the body is not read either. aiohttp
    inflates the body bytes that arrive with the headers before any handler runs, so `bench serve`
    also runs the server with ``auto_decompress=False``: with it a bomb costs nothing at all.
    """
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity") or not request.body_exists:
        return await handler(request)
    response = error_response(
        f"compressed request bodies are not accepted (Content-Encoding: {encoding[:40]}); send the body uncompressed",
        415,
    )
    response.force_close()
    if request.path in GENERATION_PATHS:  # a request refused like any other: it has an outcome
        request.app[METRICS].requests["rejected"] += 1
    return response


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
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
    app = web.Application(
        client_max_size=settings.max_request_bytes, middlewares=[refuse_compressed_bodies, json_errors]
    )
    app[ENGINE] = engine
    app[TOKENIZER] = tokenizer
    app[SETTINGS] = settings
    app[METRICS] = FrontendMetrics()
    app[STARTED] = int(time.time())
    app[PIXELS] = PixelBudget(settings.max_inflight_pixels)
    app[PREPARING] = {}
    engine.on_unavailable(functools.partial(_fail_preparing, app[PREPARING]))
    app.router.add_post("/v1/completions", _generation_handler(prepare_completion), expect_handler=_expect_continue)
    app.router.add_post("/v1/chat/completions", _generation_handler(prepare_chat), expect_handler=_expect_continue)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/v1/wirebench/spans", spans_handler)
    app.cleanup_ctx.append(_json_parser)
    app.cleanup_ctx.append(_watch_loop_lag)
    return app
