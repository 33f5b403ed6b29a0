"""Delivery: encode, send, receive in another process, decode — until the receiver holds the message.

``bench micro --transport zmq,shm`` times, for each codec × transport ×
payload, what the serving loop pays to move one request between its two
processes, against one memcpy of the payload's bytes:

  sender     t0 → codec.encode → (shm: copy big frames into the arena, or none when the
             frame was built there) → send_multipart(copy=False)
  receiver   recv_multipart(copy=False) → (shm: views on the arena) → codec.decode → t1

delivery = t1 − t0 on CLOCK_MONOTONIC (one clock for both processes on a
host). The receiver then drops the message (releasing its shared-memory
views, whose RELEASE returns with the reply) and answers; one message is in
flight at a time, so no queueing enters the figure. Transports:

- ``zmq``: every frame through the ipc socket (ZeroMQ copies big frames);
- ``shm``: frames of at least the threshold through the arena (``harness.wire.shm``);
- ``shm-inplace``: the same, with the payload's tensor already built in the
  arena (as ``--mm-payload tensor`` does on the shm transport): nothing is copied.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import zmq

import wirecodecs
from harness.wire import transport
from harness.wire.shm import DEFAULT_THRESHOLD, Arena, Handle, Mappings

TRANSPORTS = ("zmq", "shm", "shm-inplace")


@dataclass(frozen=True)
class Delivery:
    codec: str
    transport: str
    payload: str
    status: str  # ok | unsupported | error
    reason: str = ""
    p50_us: float = float("nan")
    p99_us: float = float("nan")
    iterations: int = 0


def _receiver(address: str, codec_name: str, msg_type_name: str, conn: Connection) -> None:
    from harness.wire import messages

    msg_type = getattr(messages, msg_type_name)
    calls = wirecodecs.CodecCalls(wirecodecs.get_codec(codec_name))
    released: list[list[Any]] = []
    maps = Mappings(lambda seg, block, gen: released.append([seg, block, gen]))
    ctx: zmq.Context = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.bind(address)
    conn.send("ready")
    try:
        while True:
            frames = sock.recv_multipart(copy=False)
            kind = frames[0].bytes[0]
            if kind == transport.SHUTDOWN:
                return
            body: list[Any] = list(frames[1:])
            if kind == transport.ADD_SHM:
                table = json.loads(body[0].bytes)
                body = body[1:]
                for index, *handle in table:
                    body[index] = maps.view(Handle.from_list(handle))
            msg = calls.decode(body, msg_type)  # the codec's native message: its adapter is not delivery
            done = time.monotonic_ns()
            del msg, body, frames  # the views die here: their blocks are released
            conn.send((done, released[:]))
            released.clear()
    finally:
        sock.close(linger=0)
        ctx.term()


def _place_in_arena(msg: Any, arena: Arena) -> Any:
    """The payload's pixel tensor rebuilt in the arena (what a frontend on the shm transport produces)."""
    import torch

    items = getattr(msg, "mm_inputs", None) or []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("pixel_values"), torch.Tensor):
            src = item["pixel_values"]
            dst = arena.tensor(tuple(src.shape), src.dtype)
            dst.copy_(src)
            item["pixel_values"] = dst
    return msg


def measure(
    codec_name: str,
    transport_name: str,
    payload: str,
    msg: Any,
    *,
    iterations: int = 50,
    threshold: int = DEFAULT_THRESHOLD,
) -> Delivery:
    """The delivery time of ``msg`` (p50/p99 µs over ``iterations`` one-at-a-time sends)."""
    codec = wirecodecs.get_codec(codec_name)
    calls = wirecodecs.CodecCalls(codec)  # the adapter (vllm's) runs outside the clock
    if transport_name != "zmq" and not wirecodecs.sends_out_of_band(codec_name):
        return Delivery(codec_name, transport_name, payload, "unsupported", "no out-of-band frames for shm")
    try:
        native = calls.to_native(msg)
        calls.encode(native)
    except wirecodecs.EncodeError as exc:
        return Delivery(codec_name, transport_name, payload, "unsupported", str(exc)[:60])
    folder = tempfile.mkdtemp(prefix="wirebench-delivery-")
    address = f"ipc://{folder}/d"
    arena = Arena(max(64 << 20, 4 * _payload_bytes(codec, msg))) if transport_name != "zmq" else None
    ctx_mp = mp.get_context("spawn")
    parent, child = ctx_mp.Pipe()
    proc = ctx_mp.Process(target=_receiver, args=(address, codec_name, type(msg).__name__, child), daemon=True)
    proc.start()
    ctx: zmq.Context = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    try:
        if parent.recv() != "ready":
            raise RuntimeError("receiver did not start")
        sock.connect(address)
        if arena is not None and transport_name == "shm-inplace":
            native = calls.to_native(_place_in_arena(msg, arena))
        times = []
        for _ in range(iterations):
            start = time.monotonic_ns()
            frames = calls.encode(native)
            message = _message(frames, arena, threshold)
            sock.send_multipart(message, copy=False)
            done, released = parent.recv()
            times.append(done - start)
            if arena is not None:
                for _, block, gen in released:
                    arena.free(block, gen)
                if transport_name == "shm-inplace":  # its block went back with the release
                    native = calls.to_native(_place_in_arena(msg, arena))
        sock.send(bytes((transport.SHUTDOWN,)))
        us = np.array(times) / 1e3
        return Delivery(
            codec_name,
            transport_name,
            payload,
            "ok",
            "",
            float(np.percentile(us, 50)),
            float(np.percentile(us, 99)),
            len(times),
        )
    except Exception as exc:  # a measuring tool reports, it does not crash the table
        return Delivery(codec_name, transport_name, payload, "error", f"{type(exc).__name__}: {exc}"[:80])
    finally:
        sock.close(linger=1000)
        ctx.term()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
        if arena is not None:
            arena.close()
        shutil.rmtree(folder, ignore_errors=True)


def _payload_bytes(codec: Any, msg: Any) -> int:
    return transport.frames_nbytes(codec.encode(msg))


def _message(frames: list[Any], arena: Arena | None, threshold: int) -> list[Any]:
    if arena is None:
        return [transport.envelope(transport.ADD, "d"), *frames]
    table, out = [], [frames[0]]
    for i, frame in enumerate(frames[1:], start=1):
        view = memoryview(frame).cast("B")
        if view.nbytes < threshold:
            out.append(frame)
            continue
        handle = arena.handle_of(view)
        if handle is None:
            block, gen, dst = arena.alloc(view.nbytes)
            dst[:] = view
            handle = Handle(arena.name, block, view.nbytes, gen)
        table.append([i, *handle.to_list()])
        out.append(b"")
    if not table:
        return [transport.envelope(transport.ADD, "d"), *frames]
    return [transport.envelope(transport.ADD_SHM, "d"), json.dumps(table).encode(), *out]
