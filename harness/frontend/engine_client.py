"""The frontend's side of the ZeroMQ link: the ``EngineClient`` interface and ``ZmqEngineClient``.

The frontend needs only the ``EngineClient`` surface; tests of the HTTP layer alone use an
in-process fake with the same surface. ``ZmqEngineClient`` talks to the engine process over ZeroMQ
through the selected codec.

Requests are encoded on the event loop and sent with ``copy=False`` (pyzmq still copies frames
under its copy threshold, where that is cheaper). One reader task decodes every output batch and
routes each output to its request's queue. A monitor task watches the engine, in three states:

- ok: messages (outputs, heartbeats every 0.25 s) arrive;
- stalled: nothing for the stall timeout (``STALL_TIMEOUT_S``, ``bench serve
  --engine-stall-timeout``): every request in flight fails with ``EngineDeadError`` and is aborted
  in the engine; the first message that arrives again makes the engine ok again (a paused,
  swapping or restarted remote engine is taken back; ZeroMQ reconnects by itself);
- dead: the spawned engine process exited, or this frontend shuts down. Final.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import msgspec
import zmq
import zmq.asyncio

from harness.frontend.errors import EngineDeadError, EngineRequestError, OverloadedError, RequestRejectedError
from harness.frontend.extra_cpu import spend_cpu
from harness.frontend.output_queue import OutputQueue
from harness.frontend.timeline import Timelines
from harness.server_metrics import engine_info
from harness.transports import FrameSender, TransportError
from harness.wire import curve, zmq_link
from harness.wire.integrity import outputs_digest, read_outputs_check, request_digest
from harness.wire.messages import (
    CodecStats,
    EngineCoreAbort,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    pack_token_ids,
)
from harness.wire.spans import FrontPoints, host_clock_id
from harness.wire.zmq_link import CodecClock, CodecCounters, EngineAddresses
from wirecodecs import CodecCalls, CodecError, EncodeError, get_codec, packs_token_ids

log = logging.getLogger("wirebench.frontend")

# The engine as the frontend sees it (GET /health reports it).
OK, STALLED, DEAD = "ok", "stalled", "dead"


REQUEST_TIMEOUT_S = 300.0  # seconds without an output for one request before it fails

# The counters a heartbeat carries besides blocked_<cause> (EngineCore.step_counts).
STEP_COUNTERS = ("steps", *engine_info.KV_COUNTERS, *engine_info.GRAPH_COUNTERS)


class EngineClient(Protocol):
    codec_name: str  # of requests
    output_codec_name: str  # of the engine's outputs (--output-codec, else codec_name)
    # The request timelines of both processes (harness.wire.spans); disabled where not recorded.
    timelines: Timelines

    def generate(
        self, request: EngineCoreRequest, points: FrontPoints | None = None
    ) -> AsyncIterator[EngineCoreOutput]:
        """Send the request; yield its outputs as they arrive, the last with finished=True.

        Raises RequestRejectedError (nothing was queued, or the engine sent back an
        error output) or EngineDeadError. Closing the iterator early (client
        disconnect) aborts the request in the engine. ``points``: the request's
        frontend timestamps so far; the client adds encode, send and first output.
        """
        ...

    async def abort(self, request_ids: list[str]) -> None: ...

    def on_unavailable(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` on the event loop each time the engine leaves ok (dead or stalled), after
        the requests in flight were failed: the app fails the requests it is still preparing."""
        ...

    @property
    def is_healthy(self) -> bool: ...

    @property
    def dead_reason(self) -> str | None: ...

    @property
    def state(self) -> str:
        """ "ok", "stalled" or "dead" (see ZmqEngineClient)."""
        ...

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
        heartbeat_timeout_s: float = zmq_link.STALL_TIMEOUT_S,
        owns_engine: bool = True,
        spans: bool = True,
        sender: FrameSender | None = None,
        verify: bool = False,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        output_codec: str | None = None,
        extra_cpu_us_per_token: float = 0.0,
    ) -> None:
        self.codec_name = codec_name
        # --frontend-cpu-us-per-token: a heavier API server's work per output token, modelled.
        self._extra_cpu_us_per_token = extra_cpu_us_per_token
        self.output_codec_name = output_codec or codec_name  # the engine's outputs: a codec of their own if given
        self._request_timeout_s = request_timeout_s
        self._encoder = get_codec(codec_name)
        self._decoder = get_codec(self.output_codec_name)
        # Encode and decode apart from the codec's adapter (vllm's message conversion), timed apart.
        self._encode_calls, self._decode_calls = CodecCalls(self._encoder), CodecCalls(self._decoder)
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
        for sock, address in ((self._input, addresses.input), (self._output, addresses.output)):
            zmq_link.prepare_socket(sock, address)
            if addresses.curve is not None:
                curve.secure_client(sock, addresses.curve)
        self._input.connect(addresses.input)
        self._output.connect(addresses.output)
        self._queues: dict[str, OutputQueue] = {}
        self._counters = CodecCounters()
        self._engine_stats = CodecStats()
        self._last_message = time.monotonic()
        self._dead_reason: str | None = None
        self._state = OK
        self._abandoned: set[str] = set()  # failed during a stall: aborted in the engine
        self._unavailable_callbacks: list[Callable[[str], None]] = []
        self._tasks: list[asyncio.Task] = []
        self.engine_info: dict = {}
        # Requests the engine holds, from its latest heartbeat (sent when it is idle or between outputs).
        self.engine_load: dict[str, int] = {"running": 0, "waiting": 0}
        # The scheduler's step counters from the same heartbeat (steps, blocked_<cause>, KV counters).
        self.engine_steps: dict[str, int] = {}
        # Outputs relayed to requests, and those taken while the request's next output already waited
        # (the frontend behind that request: streamed, its chunks go out back to back). The client's guard reads them.
        self.outputs_relayed = 0
        self.outputs_behind = 0
        self.timelines = Timelines(enabled=spans)
        # Every --transport but zmq: big frames travel through its sender (harness.transports).
        self._sender = sender
        self.packed_token_ids = packs_token_ids(codec_name)  # the app then tokenizes to int32 arrays
        # --verify: each request carries its digest (harness.wire.integrity), checked by the engine.
        self._verify = verify
        # Pixel tensors built straight into the transport's memory travel without a copy.
        self.tensor_alloc = sender.tensors if sender is not None and sender.builds_in_place else None

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
                kind, _ = zmq_link.open_envelope(frames[0])
                if kind == zmq_link.READY:
                    info = json.loads(frames[1]) if len(frames) > 1 else {}
                    if "error" in info:
                        raise EngineDeadError(f"engine failed to start: {info['error']}")
                    self._check_codecs(info)
                    self.engine_info = info
                    self._check_clock(info)
                    self._last_message = time.monotonic()
                    return info
                if kind == zmq_link.HEARTBEAT and accept_heartbeat:
                    # Heartbeats repeat the engine's info (frame 2) for a frontend that missed READY.
                    info = json.loads(frames[2]) if len(frames) > 2 else {}
                    self._check_codecs(info)
                    self.engine_info = {**info, "joined": "running engine"}
                    self._check_clock(info)
                    self._last_message = time.monotonic()
                    return self.engine_info

    def _check_codecs(self, info: dict) -> None:
        """An engine (--engine-only, started apart) whose codecs are not this frontend's is refused at once:
        every request would fail to decode."""
        for key, ours in (("codec", self.codec_name), ("output_codec", self.output_codec_name)):
            theirs = info.get(key)
            if theirs is not None and theirs != ours:
                raise EngineDeadError(f"the engine's {key.replace('_', ' ')} is {theirs!r}, this frontend's {ours!r}")

    def _check_clock(self, info: dict) -> None:
        """Spans need one clock: the engine must run on this host and record them."""
        if not info.get("spans", False):
            self.timelines.disable("the engine records no spans (--no-spans)")
        elif info.get("clock") != host_clock_id():
            self.timelines.disable("the engine runs on another host: its monotonic clock is not this host's")

    def start(self) -> None:
        """Start the reader and monitor tasks (call after wait_ready, on the serving loop)."""
        self._tasks = [
            asyncio.create_task(self._read_outputs(), name="engine-outputs"),
            asyncio.create_task(self._monitor(), name="engine-monitor"),
        ]

    async def shutdown(self) -> None:
        """Fail what is in flight, ask the engine to stop, then close the sockets."""
        if self._state != DEAD:
            self._declare_dead("the server is shutting down", expected=True)
        if self._owns_engine:
            with contextlib.suppress(zmq.ZMQError):
                await self._input.send(zmq_link.envelope(zmq_link.SHUTDOWN), zmq.NOBLOCK)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Give SHUTDOWN a moment to leave: linger 0 would drop it unsent.
        self._input.close(linger=1000)
        self._output.close()
        self._ctx.term()
        if self._sender is not None:
            self._sender.close()

    # --- EngineClient -------------------------------------------------------
    def on_unavailable(self, callback: Callable[[str], None]) -> None:
        self._unavailable_callbacks.append(callback)

    @property
    def is_healthy(self) -> bool:
        return self._state == OK

    @property
    def state(self) -> str:
        """ok, stalled (no message for the stall timeout; taken back when one arrives) or dead."""
        return self._state

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    def frontend_codec_stats(self) -> CodecStats:
        return self._counters.snapshot()

    def engine_codec_stats(self) -> CodecStats:
        return self._engine_stats

    @property
    def mm_store_counts(self) -> dict[str, int] | None:
        """--transport shm-store: the store's hits, misses, evictions and fallbacks; None otherwise."""
        return self._sender.counts() if self._sender is not None else None

    async def generate(
        self, request: EngineCoreRequest, points: FrontPoints | None = None
    ) -> AsyncIterator[EngineCoreOutput]:
        if self._state != OK:
            raise EngineDeadError(self._dead_reason or "the engine is not available")
        rid = request.request_id
        if rid in self._queues:
            raise RequestRejectedError(f"request id {rid!r} is already in flight")
        if self.packed_token_ids and isinstance(request.prompt_token_ids, list):
            # An int32 buffer on the wire (msgspec-packed): text prompts come as one; a token-id prompt is packed here.
            request.prompt_token_ids = pack_token_ids(request.prompt_token_ids)
        calls = self._encode_calls
        try:
            adapt_start = time.monotonic_ns()
            native = calls.to_native(request)
            adapt_ns = time.monotonic_ns() - adapt_start if calls.adapts else 0
            clock = CodecClock().start()
            frames = calls.encode(native)
        except EncodeError as exc:
            raise RequestRejectedError(str(exc), code=exc.code) from exc
        self._counters.add_encode(clock.stop(), frames, adapt_ns)
        message: list[Any] = [zmq_link.envelope(zmq_link.ADD, rid), *frames]
        held: list[Any] = []
        if self._sender is not None:
            try:
                message, held = await self._sender.message(rid, frames, request)
            except TransportError as exc:
                raise OverloadedError(str(exc)) from exc
            if self._state != OK:  # the engine went while the frames were copied out: send nothing
                self._sender.unsent(held)
                raise EngineDeadError(self._dead_reason or "the engine is not available")
        if self._verify:  # the digest travels outside the codec: flagged kind, one last frame
            message[0] = bytes((message[0][0] | zmq_link.VERIFIED,)) + message[0][1:]
            big = bool(request.mm_inputs)  # hashing megabytes of pixels leaves the event loop
            message.append(await asyncio.to_thread(request_digest, request) if big else request_digest(request))
        q: OutputQueue = OutputQueue(self._request_timeout_s)
        self._queues[rid] = q
        finished = False
        try:
            try:
                await self._input.send_multipart(message, copy=False)
            except BaseException:
                if self._sender is not None:
                    self._sender.unsent(held)  # the engine never saw these blocks
                raise
            # ZeroMQ holds what it still sends; this generator lives as long as the request, and must not
            # keep a request's images, decoded or encoded (tens of MB), to the end.
            del message, frames, native, request
            if points is not None and self.timelines.enabled:
                points.encode_start, points.encode_end, points.encode_cpu = clock.start_ns, clock.end_ns, clock.cpu_ns
                points.adapt_ns = adapt_ns
                points.sent = time.monotonic_ns()
                self.timelines.track(rid, points)
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
                self.outputs_relayed += 1
                self.outputs_behind += q.waiting() > 0
                yield item
        finally:
            q.close()
            self._queues.pop(rid, None)
            self.timelines.front_finished(rid)
            if not finished and self._state == OK:
                await self._send_abort([rid])

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in the engine; a generator still reading such a request ends with an error."""
        for rid in request_ids:
            q = self._queues.get(rid)
            if q is not None:
                q.put_nowait(RequestRejectedError(f"request {rid} was aborted"))
        if self._state == OK:
            await self._send_abort(request_ids)

    async def _send_abort(self, request_ids: list[str]) -> None:
        frames = self._encoder.encode(EngineCoreAbort(request_ids=list(request_ids)))
        await self._input.send_multipart([zmq_link.envelope(zmq_link.ABORT), *frames])

    # --- background tasks ---------------------------------------------------
    async def _read_outputs(self) -> None:
        while True:
            frames = await self._output.recv_multipart(copy=False)
            received = time.monotonic_ns()
            self._last_message = time.monotonic()
            if self._state == STALLED:
                self._recover()
            kind = None
            try:
                check = None
                kind, _ = zmq_link.open_envelope(frames[0])
                if kind == zmq_link.HEARTBEAT and len(frames) > 1:
                    self._engine_stats = msgspec.json.decode(frames[1].buffer, type=CodecStats)
                    if len(frames) > 2:
                        status = json.loads(frames[2].bytes)
                        self.engine_load = {k: int(status.get(k, 0)) for k in ("running", "waiting")}
                        self.engine_steps = {
                            k: int(v) for k, v in status.items() if k in STEP_COUNTERS or k.startswith("blocked_")
                        }
                elif kind == zmq_link.SPANS and len(frames) > 1:
                    self.timelines.engine_spans(json.loads(frames[1].bytes))
                elif kind == zmq_link.RELEASE and len(frames) > 1 and self._sender is not None:
                    self._sender.released(json.loads(frames[1].bytes))
                if kind == zmq_link.OUTPUTS | zmq_link.VERIFIED:  # --verify: the batch's check frame is last
                    kind, body, check = zmq_link.OUTPUTS, frames[1:-1], frames[-1]
                elif kind == zmq_link.OUTPUTS:
                    body = frames[1:]
                else:
                    continue
                calls = self._decode_calls
                clock = CodecClock().start()
                native = calls.decode(body, EngineCoreOutputs)
                clock.stop()
                batch = calls.from_native(native, EngineCoreOutputs)
                adapt_ns = time.monotonic_ns() - clock.end_ns if calls.adapts else 0
                self._counters.add_decode(clock, body, adapt_ns)
            except (CodecError, ValueError, msgspec.DecodeError) as exc:
                log.error("undecodable message from the engine: %s", exc)
                if kind == zmq_link.OUTPUTS and check is not None:  # --verify names the batch's requests
                    self._fail_requests(read_outputs_check(check.bytes)[0], f"could not be decoded ({exc})")
                elif kind == zmq_link.OUTPUTS:
                    self._fail_in_flight(f"an output batch from the engine could not be decoded: {exc}")
                continue
            if check is not None and not self._outputs_intact(batch, check.bytes):
                continue
            if self.timelines.enabled:
                self._stamp_first_outputs(batch, zmq_link.output_seq(frames[0]), received, clock, adapt_ns)
            if self._extra_cpu_us_per_token:
                spend_cpu(self._extra_cpu_us_per_token * sum(len(o.new_token_ids) for o in batch.outputs))
            for output in batch.outputs:
                q = self._queues.get(output.request_id)
                if q is not None:
                    q.put_nowait(output)

    def _outputs_intact(self, batch: EngineCoreOutputs, check: bytes) -> bool:
        """--verify: whether the decoded batch is what the engine sent; if not, its requests fail."""
        ids, digest = read_outputs_check(check)
        if outputs_digest(batch) == digest:
            return True
        log.error("an output batch failed its integrity check (--verify): requests %s", ids)
        self._fail_requests(ids, "differs from what the engine sent")
        return False

    def _fail_requests(self, ids: list[str], what: str) -> None:
        for rid in ids:
            q = self._queues.get(rid)
            if q is not None:
                q.put_nowait(
                    EngineRequestError(
                        f"integrity check failed: an output batch for this request {what} (--verify): "
                        "a buffer reused or torn on the way"
                    )
                )

    def _stamp_first_outputs(
        self, batch: EngineCoreOutputs, seq: int, received: int, clock: CodecClock, adapt_ns: int
    ) -> None:
        self.timelines.batch_received(seq, received, clock.end_ns, clock.cpu_ns, adapt_ns)
        for output in batch.outputs:
            points = self.timelines.front_points(output.request_id)
            if points is not None and points.first_output_seq < 0:
                points.first_output_received, points.first_output_decoded = received, clock.end_ns
                points.first_output_decode_cpu, points.first_output_seq = clock.cpu_ns, seq
                points.first_output_adapt_ns = adapt_ns

    async def _monitor(self) -> None:
        last_tick = time.monotonic()
        while self._state != DEAD:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            # If this loop itself was held up, heartbeats may be waiting unread:
            # silence only counts when messages are really not arriving.
            held_up, last_tick = now - last_tick > 1.0, now
            if self._is_process_alive is not None and not self._is_process_alive():
                self._declare_dead("the engine process exited")
            elif (
                self._state == OK
                and not held_up
                and now - self._last_message > self._heartbeat_timeout_s
                and not int(self._output.get(zmq.EVENTS)) & zmq.POLLIN
            ):
                self._declare_stalled(f"no message from the engine for {self._heartbeat_timeout_s:.1f} s")

    def _declare_dead(self, reason: str, expected: bool = False) -> None:
        """For good: the engine process exited, or this frontend is shutting down."""
        log.log(logging.INFO if expected else logging.ERROR, "engine is unavailable: %s", reason)
        self._state, self._dead_reason = DEAD, reason
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(reason))
        self._tell_unavailable(reason)

    def _declare_stalled(self, reason: str) -> None:
        """The engine went quiet (paused, swapping, a remote one restarting): fail what is in flight
        now, and abort it there so it does not compute for nobody once it answers again."""
        log.error("engine is unavailable: %s", reason)
        self._state, self._dead_reason = STALLED, reason
        self._abandoned.update(self._queues)
        for q in self._queues.values():
            q.put_nowait(EngineDeadError(reason))
        self._abort_abandoned()
        self._tell_unavailable(reason)

    def _tell_unavailable(self, reason: str) -> None:
        for callback in self._unavailable_callbacks:
            try:
                callback(reason)
            except Exception:  # one listener's bug must not keep the others from hearing it
                log.exception("an engine-unavailable listener failed")

    def _recover(self) -> None:
        """A message arrived from a stalled engine: it is back; take it back."""
        log.warning("engine answers again after: %s", self._dead_reason)
        self._state, self._dead_reason = OK, None
        self._abort_abandoned()

    def _abort_abandoned(self) -> None:
        """Abort the requests failed during a stall (queued for the engine if it is paused)."""
        if not self._abandoned:
            return
        frames = self._encoder.encode(EngineCoreAbort(request_ids=sorted(self._abandoned)))
        try:
            self._input.send_multipart([zmq_link.envelope(zmq_link.ABORT), *frames], flags=zmq.NOBLOCK)
            self._abandoned.clear()
        except zmq.ZMQError:  # no peer to queue it for: retried when the engine answers again
            pass

    def _fail_in_flight(self, reason: str) -> None:
        """Outputs for unknown requests were lost: end every request in flight (they get aborted)."""
        for q in self._queues.values():
            q.put_nowait(RequestRejectedError(reason))
