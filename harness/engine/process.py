"""The engine process: socket threads around a schedule → execute → update loop.

  input thread   recv_multipart(copy=False) → codec.decode → input queue
  busy loop      drain the queue, then one engine step; outputs → output queue
  output thread  codec.encode(EngineCoreOutputs) → send_multipart(copy=False)

Socket I/O and codec work sit on their own threads, as in vLLM's engine core,
so the model step overlaps them (torch releases the GIL in its kernels).
A frame that fails to decode, or a request that fails validation, becomes an
error output for its request id; the engine keeps serving.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from typing import Any

import msgspec
import zmq

from harness import transport
from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore, error_output
from harness.messages import EngineCoreAbort, EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from harness.transport import CodecCounters, EngineAddresses
from wirecodecs import CodecError, get_codec

log = logging.getLogger("wirebench.engine")

_STOP = object()  # sentinel through the queues


class EngineProcess:
    """Runs in the spawned process: owns the sockets, threads and EngineCore."""

    def __init__(self, config: EngineConfig, addresses: EngineAddresses) -> None:
        self.config = config
        self.addresses = addresses
        self.codec_in = get_codec(config.codec)  # decodes requests (input thread)
        self.codec_out = get_codec(config.codec)  # encodes outputs (output thread)
        self.counters = CodecCounters()
        self.inputs: queue.Queue[Any] = queue.Queue()
        self.outputs: queue.Queue[Any] = queue.Queue()
        self.stopping = threading.Event()
        self.ctx: zmq.Context = zmq.Context()
        self._parent_checked = 0.0

    # --- input thread -------------------------------------------------------
    def _input_loop(self, sock: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self.stopping.is_set():
                if not poller.poll(100):
                    continue
                frames = sock.recv_multipart(copy=False)
                try:
                    self._handle_input(frames)
                except Exception:  # a bad frame must never kill the engine
                    log.exception("dropped an undecodable input message")
        finally:
            sock.close()  # closed by the thread that owns it: zmq sockets aren't thread-safe

    def _handle_input(self, frames: list[zmq.Frame]) -> None:
        kind, request_id = transport.open_envelope(frames[0])
        body = frames[1:]
        if kind == transport.SHUTDOWN:
            self.stopping.set()
            self.inputs.put(_STOP)
            return
        msg_type: type | None = {transport.ADD: EngineCoreRequest, transport.ABORT: EngineCoreAbort}.get(kind)
        if msg_type is None:
            raise ValueError(f"unknown message kind {kind:#x}")
        started = time.perf_counter_ns()
        try:
            msg: Any = self.codec_in.decode(body, msg_type)
        except CodecError as exc:
            if request_id is None:
                raise
            self._send_outputs([error_output(request_id, f"request could not be decoded: {exc}")])
            return
        if msg_type is EngineCoreRequest:
            self.counters.add_decode(started, body)
            if request_id is not None and msg.request_id != request_id:
                self._send_outputs([error_output(request_id, "request id in body and envelope differ")])
                return
        self.inputs.put(msg)

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

    def _output_loop(self, sock: zmq.Socket, ready: list[bytes]) -> None:
        try:
            self._send(sock, ready)
            while True:
                try:
                    item = self.outputs.get(timeout=transport.HEARTBEAT_INTERVAL_S)
                except queue.Empty:
                    # The engine's codec counters travel in heartbeats (JSON, not
                    # the codec under test), so once idle the frontend has them all.
                    stats = msgspec.json.encode(self.counters.snapshot())
                    self._send(sock, [transport.envelope(transport.HEARTBEAT), stats])
                    continue
                if item is _STOP:
                    return
                self._send(sock, self._encode_outputs(item), copy=False)
        finally:
            sock.close()

    def _encode_outputs(self, batch: EngineCoreOutputs) -> list[Any]:
        batch.timestamp = time.time()
        started = time.perf_counter_ns()
        try:
            frames = self.codec_out.encode(batch)
        except CodecError as exc:
            # Nothing may be lost: the same requests end with an error instead.
            log.exception("could not encode an output batch")
            message = f"engine could not encode its output: {exc}"
            batch = EngineCoreOutputs(
                outputs=[error_output(o.request_id, message, rejected=False) for o in batch.outputs]
            )
            frames = self.codec_out.encode(batch)
        else:
            self.counters.add_encode(started, frames)
        return [transport.envelope(transport.OUTPUTS), *frames]

    def _send_outputs(self, outputs: list[EngineCoreOutput], step_start: float = 0.0, step_index: int = 0) -> None:
        self.outputs.put(EngineCoreOutputs(outputs=outputs, step_index=step_index, step_start_time=step_start))

    # --- busy loop ----------------------------------------------------------
    def _apply(self, core: EngineCore, item: Any) -> None:
        try:
            if isinstance(item, EngineCoreRequest):
                error = core.add_request(item)
                if error is not None:
                    self._send_outputs([error])
            elif isinstance(item, EngineCoreAbort):
                core.abort(item.request_ids)
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

    def _busy_loop(self, core: EngineCore) -> None:
        while not self.stopping.is_set():
            if self._parent_gone():
                log.error("the frontend process is gone; stopping")
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
            if not core.has_work():
                continue
            step_start = time.time()
            try:
                outputs = core.step()
            except Exception as exc:
                log.exception("engine step failed")
                outputs = core.fail_all(f"engine step failed: {type(exc).__name__}: {exc}")
            if outputs:
                self._send_outputs(outputs, step_start, core.step_index)

    def run(self) -> None:
        in_sock = self.ctx.socket(zmq.PULL)
        out_sock = self.ctx.socket(zmq.PUSH)
        for sock in (in_sock, out_sock):
            sock.setsockopt(zmq.LINGER, 0)
        # Sends time out instead of blocking while no frontend is connected,
        # so a stop request is always noticed.
        out_sock.setsockopt(zmq.SNDTIMEO, 200)
        in_sock.bind(self.addresses.input)
        out_sock.bind(self.addresses.output)
        try:
            core = EngineCore(self.config)
        except Exception as exc:
            log.exception("engine failed to start")
            error = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
            self._send(out_sock, [transport.envelope(transport.READY), error], give_up_s=10)
            in_sock.close()
            out_sock.close()
            self.ctx.term()
            raise SystemExit(1) from exc
        info = {"pid": os.getpid(), "codec": self.config.codec, **core.executor.info()}
        ready = [transport.envelope(transport.READY), json.dumps(info).encode()]
        threads = [
            threading.Thread(target=self._input_loop, args=(in_sock,), name="engine-input", daemon=True),
            threading.Thread(target=self._output_loop, args=(out_sock, ready), name="engine-output", daemon=True),
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
            if not any(t.is_alive() for t in threads):
                self.ctx.term()


def run_engine(
    config: EngineConfig, addresses: EngineAddresses, log_level: str = "WARNING", spawned: bool = True
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
    process.run()
