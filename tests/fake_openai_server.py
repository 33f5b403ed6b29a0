"""A small OpenAI-compatible streaming server with known timing, for load generator tests.

It runs in-process on 127.0.0.1 with an ephemeral port, on its own thread
and event loop, so both ``asyncio.run``-based CLI code and async tests can
talk to it. Chunk j of a response is written at ``ttft_s + j * k * token_gap_s``
after the request arrived (k = tokens per chunk), on an absolute schedule so
delays do not accumulate: per-token ITL is ``token_gap_s``, per-chunk ITL
``k * token_gap_s``.

Prompts containing a marker misbehave: ``FAIL500`` → HTTP 500 with a JSON
error body; ``CUTSTREAM`` → the connection is closed halfway through the
stream; ``NODONE`` → the stream ends without ``data: [DONE]``; ``BADJSON`` →
one malformed SSE event; ``ERROREVENT`` → a ``data: {"error": ...}`` event
after the first chunk, then the stream ends (as wirebench's frontend does).

/metrics serves wirebench's codec counters (rendered by harness.server_metrics.prometheus) with
fixed costs per message, so the load generator's codec figures are known.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from harness.server_metrics import prometheus
from harness.wire.messages import CodecStats

# Fixed fake codec costs per message.
REQ_ENCODE_NS, REQ_DECODE_NS, REQ_BYTES, REQ_FRAMES = 5_000, 7_000, 1_000, 1
OUT_ENCODE_NS, OUT_DECODE_NS, OUT_BYTES, OUT_FRAMES = 3_000, 4_000, 200, 2


@dataclass
class FakeConfig:
    ttft_s: float = 0.08
    token_gap_s: float = 0.02
    tokens_per_chunk: int = 1
    # Tokens per response; None: the request's max_tokens.
    num_tokens: int | None = None
    codec: str = "fakecodec"
    serve_metrics: bool = True
    # As vLLM does: a request naming any model but the one /v1/models lists gets a 404.
    strict_model: bool = False


@dataclass
class FakeState:
    frontend: CodecStats = field(default_factory=CodecStats)
    engine: CodecStats = field(default_factory=CodecStats)
    bodies: list[dict[str, Any]] = field(default_factory=list)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _prompt_text(body: dict[str, Any]) -> str:
    if "prompt" in body:
        return str(body["prompt"])
    parts = body["messages"][-1]["content"]
    if isinstance(parts, str):
        return parts
    return " ".join(p.get("text", "") for p in parts if p.get("type") == "text")


class FakeOpenAIServer:
    def __init__(self, config: FakeConfig | None = None, port: int = 0) -> None:
        self.config = config or FakeConfig()
        self.port = port
        self.state = FakeState()
        self.base_url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------

    def start(self) -> str:
        ready = threading.Event()
        errors: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._setup())
            except BaseException as exc:  # report to the starting thread
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="fake-openai-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]
        return self.base_url

    async def _setup(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        if self.config.serve_metrics:
            app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- handlers --------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        samples = prometheus.codec_samples(self.state.frontend, self.state.engine)
        samples[prometheus.CODEC_INFO] = [({"codec": self.config.codec}, 1.0)]
        return web.Response(text=prometheus.render(samples), content_type="text/plain")

    def _count_request(self) -> None:
        f, e = self.state.frontend, self.state.engine
        f.encode_count += 1
        f.encode_ns += REQ_ENCODE_NS
        f.encode_bytes += REQ_BYTES
        f.encode_frames += REQ_FRAMES
        e.decode_count += 1
        e.decode_ns += REQ_DECODE_NS
        e.decode_bytes += REQ_BYTES
        e.decode_frames += REQ_FRAMES

    def _count_output(self) -> None:
        f, e = self.state.frontend, self.state.engine
        e.encode_count += 1
        e.encode_ns += OUT_ENCODE_NS
        e.encode_bytes += OUT_BYTES
        e.encode_frames += OUT_FRAMES
        f.decode_count += 1
        f.decode_ns += OUT_DECODE_NS
        f.decode_bytes += OUT_BYTES
        f.decode_frames += OUT_FRAMES

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        body = await request.json()
        self.state.bodies.append(body)
        if self.config.strict_model and body.get("model") != "fake-model":
            error = {"message": f"The model `{body.get('model')}` does not exist.", "type": "NotFoundError"}
            return web.json_response({"error": {**error, "code": 404}}, status=404)
        chat = request.path.endswith("chat/completions")
        prompt = _prompt_text(body)
        if "FAIL500" in prompt:
            return web.json_response({"error": {"message": "injected failure", "type": "server_error"}}, status=500)
        self._count_request()
        cfg = self.config
        n = cfg.num_tokens if cfg.num_tokens is not None else int(body.get("max_tokens", 16))
        options = body.get("stream_options") or {}
        continuous = bool(options.get("continuous_usage_stats"))
        k = cfg.tokens_per_chunk
        usage_prompt = len(prompt.split())

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sent = 0
        j = 0
        while sent < n:
            k_j = min(k, n - sent)
            delay = t0 + cfg.ttft_s + j * k * cfg.token_gap_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if "CUTSTREAM" in prompt and sent >= n // 2:
                assert request.transport is not None
                request.transport.close()
                return resp
            if "BADJSON" in prompt and j == 1:
                await resp.write(b"data: {not json\n\n")
            if "ERROREVENT" in prompt and j == 1:
                await resp.write(_sse({"error": {"message": "engine died", "code": 503}}))
                await resp.write_eof()
                return resp
            sent += k_j
            text = "".join(f" t{sent - k_j + i}" for i in range(k_j))
            if chat:
                delta = {"role": "assistant", "content": text} if j == 0 else {"content": text}
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
            else:
                choice = {"index": 0, "text": text, "finish_reason": None}
            if sent == n:
                choice["finish_reason"] = "length"
            chunk: dict[str, Any] = {"id": "fake", "object": "chunk", "choices": [choice]}
            if continuous:
                chunk["usage"] = {
                    "prompt_tokens": usage_prompt,
                    "completion_tokens": sent,
                    "total_tokens": usage_prompt + sent,
                }
            self._count_output()
            await resp.write(_sse(chunk))
            j += 1
        if options.get("include_usage"):
            usage = {"prompt_tokens": usage_prompt, "completion_tokens": n, "total_tokens": usage_prompt + n}
            await resp.write(_sse({"id": "fake", "object": "chunk", "choices": [], "usage": usage}))
        if "NODONE" not in prompt:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


if __name__ == "__main__":  # a server of its own, for a bench run --arm NAME='--command "..."' test
    import argparse
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--strict-model", action="store_true")
    args = parser.parse_args()
    with FakeOpenAIServer(FakeConfig(strict_model=args.strict_model, serve_metrics=False), port=args.port):
        while True:
            time.sleep(3600)
