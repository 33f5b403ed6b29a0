"""The frontend's side of the ZeroMQ link: the ``EngineClient`` interface and ``ZmqEngineClient``.

The frontend needs only the ``EngineClient`` surface; tests of the HTTP layer
alone use an in-process fake with the same surface. ``ZmqEngineClient`` talks
to the engine process over ZeroMQ through the selected codec.

Requests are encoded on the event loop and sent with ``copy=False`` (pyzmq
still copies frames under its copy threshold, where that is cheaper). One
reader task decodes every output batch and routes each output to its
request's queue. A monitor task turns a dead engine (process gone, or no
message for ``HEARTBEAT_TIMEOUT_S``) into ``EngineDeadError`` for every
request in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import msgspec
import zmq
import zmq.asyncio

from harness import transport
from harness.messages import (
    CodecStats,
    EngineCoreAbort,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)
from harness.transport import CodecCounters, EngineAddresses
from wirecodecs import CodecError, EncodeError, get_codec

log = logging.getLogger("wirebench.frontend")


class EngineDeadError(RuntimeError):
    """The engine process died or stopped answering; in-flight requests fail with this."""


class RequestRejectedError(ValueError):
    """The request could not be sent or was refused (codec cannot carry it, engine validation).

    ``code`` is a machine-readable kind when one is known (a codec error's
    ``code``, e.g. ``unsupported_payload``).
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class EngineRequestError(RuntimeError):
    """The engine failed while serving the request (a server-side error, not the client's)."""


class EngineClient(Protocol):
    codec_name: str

    def generate(self, request: EngineCoreRequest) -> AsyncIterator[EngineCoreOutput]:
        """Send the request; yield its outputs as they arrive, the last with finished=True.

        Raises RequestRejectedError (nothing was queued, or the engine sent back an
        error output) or EngineDeadError. Closing the iterator early (client
        disconnect) aborts the request in the engine.
        """
        ...

    async def abort(self, request_ids: list[str]) -> None: ...

    @property
    def is_healthy(self) -> bool: ...

    @property
    def dead_reason(self) -> str | None: ...

    # Cumulative codec counters: this process's (request encode, output decode)
    # and the engine's latest report (request decode, output encode).
    def frontend_codec_stats(self) -> CodecStats: ...

    def engine_codec_stats(self) -> CodecStats: ...


class ZmqEngineClient:
    def __init__(
        self,
        codec_name: str,
        addresses: EngineAddresses,
        is_process_alive: Callable[[], bool] | None = None,
        heartbeat_timeout_s: float = transport.HEARTBEAT_TIMEOUT_S,
        owns_engine: bool = True,
    ) -> None:
        self.codec_name = codec_name
        self._encoder = get_codec(codec_name)
        self._decoder = get_codec(codec_name)
        self._addresses = addresses
        self._is_process_alive = is_process_alive
        self._heartbeat_timeout_s = heartbeat_timeout_s
        # A frontend that started its engine stops it; one that joined a
        # remote engine (--frontend-only) leaves it running for the next one.
        self._owns_engine = owns_engine
        self._ctx = zmq.asyncio.Context()
        self._input = self._ctx.socket(zmq.PUSH)
        self._output = self._ctx.socket(zmq.PULL)
        for sock in (self._input, self._output):
            sock.setsockopt(zmq.LINGER, 0)
        self._input.connect(addresses.input)
        self._output.connect(addresses.output)
        self._queues: dict[str, asyncio.Queue[EngineCoreOutput | Exception]] = {}
        self._counters = CodecCounters()
        self._engine_stats = CodecStats()
        self._last_message = time.monotonic()
        self._dead_reason: str | None = None
        self._tasks: list[asyncio.Task] = []
        self.engine_info: dict = {}

    # --- lifecycle ----------------------------------------------------------
    async def wait_ready(self, timeout_s: float, accept_heartbeat: bool = False) -> dict:
        """Wait for the engine's READY message; raises EngineDeadError on failure or timeout.

        ``accept_heartbeat``: a frontend joining an engine that is already
        running (``--frontend-only``) may have missed READY; a heartbeat will do.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._is_process_alive is not None and not self._is_process_alive():
                raise EngineDeadError("engine process exited during startup")
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineDeadError(f"engine not ready after {timeout_s:.0f} s")
            if await self._output.poll(timeout=min(left, 0.2) * 1000):
                frames = await self._output.recv_multipart()
                kind, _ = transport.open_envelope(frames[0])
                if kind == transport.READY:
                    info = json.loads(frames[1]) if len(frames) > 1 else {}
                    if "error" in info:
                        raise EngineDeadError(f"engine failed to start: {info['error']}")
                    self.engine_info = info
                    self._last_message = time.monotonic()
                    return info
                if kind == transport.HEARTBEAT and accept_heartbeat:
                    self._last_message = time.monotonic()
                    return {"joined": "running engine"}

    def start(self) -> None:
        """Start the reader and monitor tasks (call after wait_ready, on the serving loop)."""
        self._tasks = [
            asyncio.create_task(self._read_outputs(), name="engine-outputs"),
            asyncio.create_task(self._monitor(), name="engine-monitor"),
        ]

    async def shutdown(self) -> None:
        """Fail what is in flight, ask the engine to stop, then close the sockets."""
        if self._dead_reason is None:
            self._declare_dead("the server is shutting down", expected=True)
        if self._owns_engine:
            with contextlib.suppress(zmq.ZMQError):
                await self._input.send(transport.envelope(transport.SHUTDOWN), zmq.NOBLOCK)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Give SHUTDOWN a moment to leave: linger 0 would drop it unsent.
        self._input.close(linger=1000)
        self._output.close()
        self._ctx.term()

    # --- EngineClient -------------------------------------------------------
    @property
    def is_healthy(self) -> bool:
        return self._dead_reason is None

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    def frontend_codec_stats(self) -> CodecStats:
        return self._counters.snapshot()

    def engine_codec_stats(self) -> CodecStats:
        return self._engine_stats

    async def generate(self, request: EngineCoreRequest) -> AsyncIterator[EngineCoreOutput]:
        if self._dead_reason is not None:
            raise EngineDeadError(self._dead_reason)
        rid = request.request_id
        if rid in self._queues:
            raise RequestRejectedError(f"request id {rid!r} is already in flight")
        started = time.perf_counter_ns()
        try:
            frames = self._encoder.encode(request)
        except EncodeError as exc:
            raise RequestRejectedError(str(exc), code=exc.code) from exc
        self._counters.add_encode(started, frames)
        q: asyncio.Queue[EngineCoreOutput | Exception] = asyncio.Queue()
        self._queues[rid] = q
        finished = False
        try:
            await self._input.send_multipart([transport.envelope(transport.ADD, rid), *frames], copy=False)
            while not finished:
                item = await q.get()
                if isinstance(item, Exception):
                    # A dead engine has nothing left to abort; otherwise (lost
                    # output, local abort) the finally below aborts it there.
                    finished = isinstance(item, EngineDeadError)
                    raise item
                if item.finish_reason == FinishReason.REJECTED:
                    finished = True
                    raise RequestRejectedError(item.error or "the engine refused the request")
                if item.finish_reason == FinishReason.ERROR:
                    finished = True
                    raise EngineRequestError(item.error or "the engine failed serving the request")
                finished = item.finished
                yield item
        finally:
            self._queues.pop(rid, None)
            if not finished and self._dead_reason is None:
                await self._send_abort([rid])

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in the engine; a generator still reading such a request ends with an error."""
        for rid in request_ids:
            q = self._queues.get(rid)
            if q is not None:
                q.put_nowait(RequestRejectedError(f"request {rid} was aborted"))
        if self._dead_reason is None:
            await self._send_abort(request_ids)

    async def _send_abort(self, request_ids: list[str]) -> None:
        frames = self._encoder.encode(EngineCoreAbort(request_ids=list(request_ids)))
        await self._input.send_multipart([transport.envelope(transport.ABORT), *frames])

    # --- background tasks ---------------------------------------------------
    async def _read_outputs(self) -> None:
        while True:
            frames = await self._output.recv_multipart(copy=False)
            self._last_message = time.monotonic()
            kind = None
            try:
                kind, _ = transport.open_envelope(frames[0])
                if kind == transport.HEARTBEAT and len(frames) > 1:
                    self._engine_stats = msgspec.json.decode(frames[1].buffer, type=CodecStats)
                if kind != transport.OUTPUTS:
                    continue
                body = frames[1:]
                started = time.perf_counter_ns()
                batch = self._decoder.decode(body, EngineCoreOutputs)
                self._counters.add_decode(started, body)
            except (CodecError, ValueError, msgspec.DecodeError) as exc:
                log.error("undecodable message from the engine: %s", exc)
                if kind == transport.OUTPUTS:
                    self._fail_in_flight(f"an output batch from the engine could not be decoded: {exc}")
                continue
            for output in batch.outputs:
                q = self._queues.get(output.request_id)
                if q is not None:
                    q.put_nowait(output)

    async def _monitor(self) -> None:
        last_tick = time.monotonic()
        while self._dead_reason is None:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            # If this loop itself was held up, heartbeats may be waiting unread:
            # silence only counts when messages are really not arriving.
            stalled, last_tick = now - last_tick > 1.0, now
            if self._is_process_alive is not None and not self._is_process_alive():
                self._declare_dead("the engine process exited")
            elif (
                not stalled
                and now - self._last_message > self._heartbeat_timeout_s
                and not int(self._output.get(zmq.EVENTS)) & zmq.POLLIN
            ):
                self._declare_dead(f"no message from the engine for {self._heartbeat_timeout_s:.1f} s")

    def _declare_dead(self, reason: str, expected: bool = False) -> None:
        log.log(logging.INFO if expected else logging.ERROR, "engine is unavailable: %s", reason)
        self._dead_reason = reason
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(reason))

    def _fail_in_flight(self, reason: str) -> None:
        """Outputs for unknown requests were lost: end every request in flight (they get aborted)."""
        for q in self._queues.values():
            q.put_nowait(RequestRejectedError(reason))
