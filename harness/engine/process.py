"""The engine process: socket threads around a schedule → execute → update loop.

  input thread   recv_multipart(copy=False) → codec.decode → input queue
  busy loop      drain the queue, then one engine step; outputs → output queue
  output thread  codec.encode(EngineCoreOutputs) → send_multipart(copy=False);
                 heartbeats and the engine's span timestamps (JSON) when due

Socket I/O and codec work sit on their own threads, as in vLLM's engine core, so the model step
overlaps them (torch releases the GIL in its kernels). A frame that fails to decode, or a request
that fails validation, becomes an error output for its request id; the engine keeps serving.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore, error_output
from harness.engine.timings import EngineTimings
from harness.processes.heap import freeze_heap
from harness.transports import Peer, RefusedSender, get_transport
from harness.transports.base import check_sender
from harness.transports.registry import remove_leftovers
from harness.wire import curve, zmq_link
from harness.wire.integrity import outputs_check, request_digest
from harness.wire.messages import (
    EngineCoreAbort,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    SchedulerStats,
)
from harness.wire.spans import host_clock_id
from harness.wire.zmq_link import CodecClock, CodecCounters, EngineAddresses
from wirecodecs import CodecCalls, CodecError, get_codec

log = logging.getLogger("wirebench.engine")

_STOP = object()  # sentinel through the queues


def _adds(kind: int) -> bool:
    """A kind that adds a request: its frames in the message, or its big ones apart (a transport's)."""
    return kind == zmq_link.ADD or kind in zmq_link.OUT_OF_BAND_ADDS


class _Release(list):
    """An entry of the engine's transport receiver on its way back to the sender, in a RELEASE message."""


class EngineProcess:
    """Runs in the spawned process: owns the sockets, threads and EngineCore."""

    def __init__(self, config: EngineConfig, addresses: EngineAddresses) -> None:
        self.config = config
        self.addresses = addresses
        self.codec_in = get_codec(config.codec)  # decodes requests (input thread)
        self.codec_out = get_codec(config.codec_of_outputs)  # encodes outputs (output thread)
        # Decode and encode apart from the codec's adapter (vllm's message conversion), timed apart.
        self.calls_in, self.calls_out = CodecCalls(self.codec_in), CodecCalls(self.codec_out)
        self.counters = CodecCounters()
        self.inputs: queue.Queue[Any] = queue.Queue()
        self.outputs: queue.Queue[Any] = queue.Queue()
        self.stopping = threading.Event()
        self.ctx: zmq.Context = zmq.Context()
        self._parent_checked = 0.0
        # The engine's half of the request timelines; None with --no-spans.
        self.timings: EngineTimings | None = EngineTimings() if config.spans else None
        self._out_seq = 0
        # The engine's half of its transport (None for zmq): opens the frontend's out-of-band ADDs; what
        # it is done with goes back to the frontend in RELEASE messages.
        self.transport = get_transport(addresses.transport)
        peer = Peer(addresses.frontend_pid or 0, addresses.frontend_segment, self._release)
        self.receiver = self.transport.receiver(peer) if addresses.frontend_pid is not None else None
        # Tests only: WIREBENCH_FAULT=reuse-output-buffer writes each output body into one reused buffer and
        # writes the next batch into it before the previous one is handed to ZeroMQ (vLLM #45730's bug class).
        self._reused: bytearray | None = (
            bytearray(1 << 20) if os.environ.get("WIREBENCH_FAULT") == ("reuse-output-buffer") else None
        )
        self._held: list[Any] | None = None
        # --verify: once a verified request arrived, every output batch carries its check frame.
        self.verify_outputs = False
        # What the engine is holding now (busy loop writes, heartbeats read): requests running and waiting.
        self.load: dict[str, int] = {"running": 0, "waiting": 0}

    # --- input thread -------------------------------------------------------
    def _input_loop(self, sock: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self.stopping.is_set():
                if not poller.poll(100):
                    continue
                frames = sock.recv_multipart(copy=False)
                received = time.monotonic_ns()
                try:
                    self._handle_input(frames, received)
                except Exception:  # a bad frame must never kill the engine
                    log.exception("dropped an undecodable input message")
        finally:
            sock.close()  # closed by the thread that owns it: zmq sockets aren't thread-safe

    def _handle_input(self, frames: list[zmq.Frame], received_ns: int) -> None:
        kind, request_id = zmq_link.open_envelope(frames[0])
        body = frames[1:]
        digest = None
        if kind & zmq_link.VERIFIED and _adds(kind & ~zmq_link.VERIFIED):
            kind &= ~zmq_link.VERIFIED
            body, digest = body[:-1], zmq_link.frame_bytes(body[-1]) if body else b""
            self.verify_outputs = True
        if kind == zmq_link.SHUTDOWN:
            self.stopping.set()
            self.inputs.put(_STOP)
            return
        if _adds(kind) and kind != zmq_link.ADD:
            try:
                check_sender(kind, frames[0], self.addresses, self.transport)
                if self.receiver is None:
                    raise RefusedSender(f"--transport {self.transport.name} has no receiver")
                body = self.receiver.open(body)
            except Exception as exc:  # whatever a transport's receiver raises fails this request alone
                if request_id is None:
                    raise
                self._send_outputs([error_output(request_id, f"request could not be received: {exc}")])
                return
            kind, received_ns = zmq_link.ADD, time.monotonic_ns()  # received once its views exist
        msg_type: type | None = {zmq_link.ADD: EngineCoreRequest, zmq_link.ABORT: EngineCoreAbort}.get(kind)
        if msg_type is None:
            raise ValueError(f"unknown message kind {kind:#x}")
        clock = CodecClock().start()
        adapt_ns = 0
        try:
            msg: Any = self.calls_in.decode(body, msg_type)
            clock.stop()
            if self.calls_in.adapts:
                msg = self.calls_in.from_native(msg, msg_type)
                adapt_ns = time.monotonic_ns() - clock.end_ns
        except CodecError as exc:
            if request_id is None:
                raise
            self._send_outputs([error_output(request_id, f"request could not be decoded: {exc}")])
            return
        if msg_type is EngineCoreRequest:
            self.counters.add_decode(clock, body, adapt_ns)
            if self.timings is not None and request_id is not None:
                self.timings.received(request_id, received_ns, clock.end_ns, clock.cpu_ns, adapt_ns)
            if request_id is not None and msg.request_id != request_id:
                self._send_outputs([error_output(request_id, "request id in body and envelope differ")])
                return
            if digest is not None and request_digest(msg) != digest:
                why = "the request's token ids or multimodal buffers are not what the frontend sent (--verify)"
                self._send_outputs([error_output(msg.request_id, "integrity check failed: " + why, rejected=False)])
                return
        self.inputs.put(msg)

    def _release(self, entry: list[Any]) -> None:
        """The receiver is done with a handle (a view died, a storage is mapped): tell the sender, from the
        output thread."""
        self.outputs.put(_Release(entry))

    # --- output thread ------------------------------------------------------
    def _send(self, sock: zmq.Socket, frames: list[Any], copy: bool = True, give_up_s: float | None = None) -> bool:
        """Send, retrying while no frontend is connected, until sent or stopping."""
        deadline = None if give_up_s is None else time.monotonic() + give_up_s
        while not self.stopping.is_set():
            try:
                sock.send_multipart(frames, copy=copy)
                return True
            except zmq.Again:  # SNDTIMEO: no peer to take it right now
                if deadline is not None and time.monotonic() > deadline:
                    return False
        return False

    def _output_loop(self, sock: zmq.Socket, ready: list[bytes], core: EngineCore) -> None:
        try:
            self._send(sock, ready)
            while True:
                try:
                    item = self.outputs.get(timeout=zmq_link.HEARTBEAT_INTERVAL_S)
                except queue.Empty:
                    self._flush_held(sock)
                    # The engine's codec counters travel in heartbeats (JSON, not
                    # the codec under test), so once idle the frontend has them all.
                    stats = msgspec.json.encode(self.counters.snapshot())
                    # The status frame: requests held, and the scheduler's step counters, read here
                    # (only heartbeats need them; their keys are fixed, so reading across threads is safe).
                    status = json.dumps({**json.loads(ready[1]), **self.load, **core.step_counts()}).encode()
                    self._send(sock, [zmq_link.envelope(zmq_link.HEARTBEAT), stats, status])
                    self._send_spans(sock, force=True)
                    continue
                if item is _STOP:
                    return
                if isinstance(item, _Release):
                    self._send(sock, [zmq_link.envelope(zmq_link.RELEASE), json.dumps([list(item)]).encode()])
                    continue
                self._send_batch(sock, item)
                self._send_spans(sock)
        finally:
            sock.close()

    def _send_batch(self, sock: zmq.Socket, batch: EngineCoreOutputs) -> None:
        seq = self._out_seq
        self._out_seq += 1
        check = outputs_check(batch) if self.verify_outputs else None  # what the engine meant to send
        frames, clock, adapt_ns = self._encode_outputs(batch)
        message = [zmq_link.output_envelope(seq, check is not None), *frames, *([check] if check else [])]
        if self._reused is not None:
            self._send_reusing_buffer(sock, message)
        else:
            self._send(sock, message, copy=False)
        if self.timings is not None:
            sent = time.monotonic_ns()
            record = {
                "seq": seq,
                "step_index": batch.step_index,
                "outputs": len(batch.outputs),
                "encode_start": clock.start_ns,
                "encode_end": clock.end_ns,
                "encode_cpu": clock.cpu_ns,
                "adapt": adapt_ns,
                "sent": sent,
                "bytes": zmq_link.frames_nbytes(frames),
            }
            self.timings.batch_sent(record, [o.request_id for o in batch.outputs])

    def _send_reusing_buffer(self, sock: zmq.Socket, message: list[Any]) -> None:
        """The fault: the body goes into the one reused buffer, overwriting the batch not yet sent."""
        assert self._reused is not None
        body = bytes(memoryview(message[1]).cast("B"))
        if len(body) > len(self._reused):
            self._send(sock, message, copy=False)
            return
        self._reused[: len(body)] = body  # the held batch's frame views these bytes too
        message[1] = memoryview(self._reused)[: len(body)]
        if self._held is not None:
            self._send(sock, self._held)
        self._held = message  # sent when the next batch has overwritten it, or intact once the engine idles

    def _flush_held(self, sock: zmq.Socket) -> None:
        if self._held is not None:
            self._send(sock, self._held)
            self._held = None

    def _send_spans(self, sock: zmq.Socket, force: bool = False) -> None:
        ready = self.timings.take(force) if self.timings is not None else None
        if ready is not None:
            self._send(sock, [zmq_link.envelope(zmq_link.SPANS), msgspec.json.encode(ready)])

    def _encode_outputs(self, batch: EngineCoreOutputs) -> tuple[list[Any], CodecClock, int]:
        """The batch's codec frames, the encode's clock and the adapter's ns; a batch the codec cannot
        encode becomes error outputs for its requests."""
        batch.timestamp = time.time()
        calls = self.calls_out
        adapt_start = time.monotonic_ns()
        clock = CodecClock()
        try:
            native = calls.to_native(batch)
            clock.start()
            frames = calls.encode(native)
        except CodecError as exc:
            # Nothing may be lost: the same requests end with an error instead.
            log.exception("could not encode an output batch")
            message = f"engine could not encode its output: {exc}"
            batch = EngineCoreOutputs(
                outputs=[error_output(o.request_id, message, rejected=False) for o in batch.outputs]
            )
            frames = self.codec_out.encode(batch)
            clock.start()  # nothing of the failed encode is counted
            return frames, clock.stop(), 0
        clock.stop()
        adapt_ns = clock.start_ns - adapt_start if calls.adapts else 0
        self.counters.add_encode(clock, frames, adapt_ns)
        return frames, clock, adapt_ns

    def _send_outputs(
        self,
        outputs: list[EngineCoreOutput],
        step_start: float = 0.0,
        step_index: int = 0,
        stats: SchedulerStats | None = None,
    ) -> None:
        self.outputs.put(
            EngineCoreOutputs(outputs=outputs, step_index=step_index, step_start_time=step_start, scheduler_stats=stats)
        )

    # --- busy loop ----------------------------------------------------------
    def _apply(self, core: EngineCore, item: Any) -> None:
        try:
            if isinstance(item, EngineCoreRequest):
                error = core.add_request(item)
                if error is not None:
                    self._send_outputs([error])
                elif self.timings is not None:
                    self.timings.added(item.request_id, time.monotonic_ns())
            elif isinstance(item, EngineCoreAbort):
                core.abort(item.request_ids)
                if self.timings is not None:
                    self.timings.dropped(item.request_ids)
        except Exception as exc:  # e.g. a decoded request with a wrongly typed field
            log.exception("could not apply an input message")
            rid = getattr(item, "request_id", None)
            if isinstance(rid, str):
                self._send_outputs([error_output(rid, f"invalid request: {type(exc).__name__}: {exc}")])

    def _parent_gone(self) -> bool:
        """A spawned engine stops when its frontend process is gone (e.g. SIGKILLed)."""
        now = time.monotonic()
        if now - self._parent_checked < 0.5:
            return False
        self._parent_checked = now
        parent = multiprocessing.parent_process()
        return parent is not None and not parent.is_alive()

    def _remove_frontend_leftovers(self) -> None:
        """What a killed frontend could not remove and nobody else will: what its transport left (e.g. its
        shared-memory segment, torch's files it was killed before unlinking) and the sockets' private ipc
        directory."""
        try:
            if self.receiver is not None:
                self.receiver.peer_gone()
            if self.addresses.frontend_pid is not None:
                remove_leftovers(self.addresses.frontend_pid)
        finally:
            self.addresses.cleanup()

    def _busy_loop(self, core: EngineCore) -> None:
        while not self.stopping.is_set():
            if self._parent_gone():
                log.error("the frontend process is gone; stopping")
                self._remove_frontend_leftovers()
                return
            # Block only when idle; otherwise take what arrived and step.
            try:
                item = self.inputs.get(timeout=0.1) if not core.has_work() else self.inputs.get_nowait()
            except queue.Empty:
                item = None
            while item is not None:
                if item is _STOP:
                    return
                self._apply(core, item)
                try:
                    item = self.inputs.get_nowait()
                except queue.Empty:
                    item = None
            self.load["running"], self.load["waiting"] = core.scheduler.num_running, core.scheduler.num_waiting
            if not core.has_work():
                continue
            step_start = time.time()
            start_ns = time.monotonic_ns()
            try:
                outputs = core.step()
            except Exception as exc:
                log.exception("engine step failed")
                outputs = core.fail_all(f"engine step failed: {type(exc).__name__}: {exc}")
            if self.timings is not None and (core.last_step is not None or outputs):  # overlapped: N+1 in, N out
                sampled = [o.request_id for o in outputs]
                self.timings.step(
                    core.step_index, start_ns, time.monotonic_ns(), core.last_step, sampled, core.device_span
                )
            if outputs:
                stats = core.scheduler_stats() if self.config.output_stats else None
                self._send_outputs(outputs, step_start, core.step_index, stats)

    def run(self, on_listening: Callable[[], None] | None = None) -> None:
        in_sock = self.ctx.socket(zmq.PULL)
        out_sock = self.ctx.socket(zmq.PUSH)
        keys = self.addresses.curve
        # Only our frontend's key gets through the CURVE handshake (harness.wire.curve).
        auth = curve.start_authenticator(self.ctx, keys) if keys is not None else None
        for sock, address in ((in_sock, self.addresses.input), (out_sock, self.addresses.output)):
            sock.setsockopt(zmq.LINGER, 0)
            zmq_link.prepare_socket(sock, address)
            if keys is not None:
                curve.secure_server(sock, keys)
        # Sends time out instead of blocking while no frontend is connected,
        # so a stop request is always noticed.
        out_sock.setsockopt(zmq.SNDTIMEO, 200)
        for sock, address in ((in_sock, self.addresses.input), (out_sock, self.addresses.output)):
            try:
                sock.bind(address)
            except zmq.ZMQError as exc:  # one line, not a traceback: the frontend says the engine exited
                hint = " (choose another --engine-port)" if address.startswith("tcp://") else ""
                print(f"wirebench engine: cannot listen: {exc.strerror}{hint}", file=sys.stderr)
                in_sock.close()
                out_sock.close()
                if auth is not None:
                    auth.stop()
                self.ctx.term()
                raise SystemExit(2) from None
        if on_listening is not None:
            on_listening()  # bound: only now may a standalone engine say it listens
        threads_done = True
        try:
            threads_done = self._serve(in_sock, out_sock)
        finally:
            if auth is not None:
                auth.stop()  # before term(): its sockets live in this context
            if threads_done:
                self.ctx.term()

    def _serve(self, in_sock: zmq.Socket, out_sock: zmq.Socket) -> bool:
        """Run until stopped; whether every socket thread ended (then the context may be terminated)."""
        try:
            core = EngineCore(self.config)
        except Exception as exc:
            log.exception("engine failed to start")
            error = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
            self._send(out_sock, [zmq_link.envelope(zmq_link.READY), error], give_up_s=10)
            in_sock.close()
            out_sock.close()
            raise SystemExit(1) from exc
        if self.timings is not None:
            self.timings.device = core.device_stats()  # sim's modelled GPU or torch's device thread
        if self.config.gc_freeze:
            freeze_heap()  # the model is loaded: keep it out of full collections
        info = {
            "pid": os.getpid(),
            "codec": self.config.codec,
            "output_codec": self.config.codec_of_outputs,
            "clock": host_clock_id(),
            "spans": self.config.spans,
            "overlapped": core.overlapped,  # one step of overlap ran (async scheduling)
            **core.executor.info(),
        }
        ready = [zmq_link.envelope(zmq_link.READY), json.dumps(info).encode()]
        threads = [
            threading.Thread(target=self._input_loop, args=(in_sock,), name="engine-input", daemon=True),
            threading.Thread(target=self._output_loop, args=(out_sock, ready, core), name="engine-output", daemon=True),
        ]
        for t in threads:
            t.start()
        try:
            self._busy_loop(core)
        finally:
            self.stopping.set()
            self.outputs.put(_STOP)
            for t in threads:
                t.join(timeout=2)
        return not any(t.is_alive() for t in threads)


def run_engine(
    config: EngineConfig,
    addresses: EngineAddresses,
    log_level: str = "WARNING",
    spawned: bool = True,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Entry point of the engine process (spawn target and `bench serve --engine-only`)."""
    logging.basicConfig(level=log_level, format="%(asctime)s engine %(levelname)s %(message)s")
    process = EngineProcess(config, addresses)

    def on_signal(signum: int, frame: Any) -> None:
        process.stopping.set()
        process.inputs.put(_STOP)

    # Ctrl-C reaches the whole process group: a spawned engine leaves the
    # decision to its frontend (which sends SHUTDOWN); a standalone one stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN if spawned else on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    process.run(on_listening)
