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
  arena (as ``--mm-payload tensor`` does on the shm transport): nothing is copied;
- ``torch-shm``: big frames copied into torch shared storages, one per frame and send
  (``harness.wire.torch_shm``), through the serving loop's sender (its event loop included);
  ``torch-shm-inplace``: the payload's tensor built in a shared storage in the first place (as
  ``--mm-payload tensor`` does on torch-shm): nothing is copied;
- ``shm-store``: through the content-addressed store (``harness.wire.mm_store``), the same
  payload every send: after the first, each send is a hit (not copied); a pixel tensor is keyed by
  the request's ``mm_hashes``, as in serving, other big frames are hashed;
  ``shm-store-miss``: the store forgets it after each send, so each is a miss (copied);
- ``shm-bell``: ``shm``'s arena and message, the message sent as one packet on
  a Unix SOCK_SEQPACKET socket instead of ZeroMQ: what the notify would cost
  without ZeroMQ's I/O threads (four thread hand-overs per message: sender →
  its I/O thread → the receiver's I/O thread → receiver). The serving loop does
  not use it: a measurement of what a lighter notify would save, not a transport.

Each send is also cut into four parts (``PARTS``) by timestamps on the same
clock, so the parts of one send add up to its delivery exactly; each part is
reported by its own p50 (p50s need not add up to the total's p50).

The first ``WARMUP_SENDS`` sends are not in p50/p99: the first one pays one-time
costs the serving loop pays once per process — the receiver's lazy imports on
its first decode (torch: ≈1 s on the development VM, which made the p99 of a
50-send cell) and page faults of arena blocks used for the first time
(≈10 ms for 12.6 MB). The first send's delivery is reported apart (``first_us``).
On the warm-up sends the receiver also digests what it decoded (``request_digest``:
token ids and every multimodal buffer), outside the clock, and a cell whose
bytes did not arrive intact is an error, not a figure.
The arena is pre-faulted (``Arena(prefault=True)``): blocks are reused first-fit
one message at a time, so a serving arena's hot blocks are resident too.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import shutil
import socket
import struct
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import zmq

import wirecodecs
from harness.engine import receivers
from harness.frontend.mm_senders import StoreSender, TorchShmSender
from harness.wire import zmq_link
from harness.wire.integrity import request_digest
from harness.wire.messages import EngineCoreRequest
from harness.wire.mm_store import MmStore
from harness.wire.shm import DEFAULT_THRESHOLD, Arena, Handle, Mappings, copy_into
from harness.wire.torch_shm import TAKEN

TRANSPORTS = ("zmq", "shm", "shm-inplace", "shm-bell", "torch-shm", "torch-shm-inplace", "shm-store", "shm-store-miss")
# Measured through the serving loop's senders.
_SENDERS = ("torch-shm", "torch-shm-inplace", "shm-store", "shm-store-miss")
WARMUP_SENDS = 3  # untimed; the first of them is reported as first_us
CHECK_ID = "check"  # the request id of warm-up sends: the receiver digests what it decoded

# The parts of one send, in order; their one-line definitions are printed with the table.
PARTS: dict[str, str] = {
    "encode": "codec.encode in the sender",
    "copy": "the sender's copy of big frames into the arena, its block and handle table (zmq, shm-inplace: the "
    "message's assembly only; torch-shm: a new shared storage per frame and the copy; shm-store: the hash, and "
    "on a miss the copy)",
    "notify": "send_multipart → recv_multipart returns in the receiver: ZeroMQ's hand-over (zmq: with its copies of "
    "the big frames; shm-bell: the socket's) and the receiver's wake-up",
    "decode": "the receiver's handle table, views on the arena (torch-shm: opening and mapping each storage) and "
    "codec.decode, until it holds the message",
}


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
    first_us: float = float("nan")  # the first send, before the warm-up ones: one-time costs
    encode_p50_us: float = float("nan")  # the parts (PARTS), p50 each
    copy_p50_us: float = float("nan")
    notify_p50_us: float = float("nan")
    decode_p50_us: float = float("nan")

    @property
    def parts_p50_us(self) -> dict[str, float]:
        return {name: getattr(self, f"{name}_p50_us") for name in PARTS}


class _Bell:
    """Messages of frames as single packets on a Unix SOCK_SEQPACKET socket: one kernel hand-over."""

    MAX_BYTES = 1 << 20  # the small frames only: big ones travel in the arena

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send_multipart(self, frames: list[Any], copy: bool = False) -> None:
        sizes = [memoryview(f).nbytes for f in frames]
        self.sock.sendmsg([struct.pack(f"<I{len(sizes)}Q", len(sizes), *sizes), *frames])

    def recv_multipart(self, copy: bool = False) -> list[memoryview]:
        data, _, flags, _ = self.sock.recvmsg(self.MAX_BYTES)
        if flags & socket.MSG_TRUNC:
            raise RuntimeError(f"a message over {self.MAX_BYTES} bytes")
        (count,) = struct.unpack_from("<I", data)
        sizes = struct.unpack_from(f"<{count}Q", data, 4)
        view, frames, at = memoryview(data), [], 4 + 8 * count
        for n in sizes:
            frames.append(view[at : at + n])
            at += n
        return frames

    def send(self, frame: bytes) -> None:
        self.send_multipart([frame])

    def close(self, linger: int = 0) -> None:
        self.sock.close()


def _receiver(address: str, codec_name: str, msg_type_name: str, conn: Connection) -> None:
    from harness.wire import messages

    msg_type = getattr(messages, msg_type_name)
    calls = wirecodecs.CodecCalls(wirecodecs.get_codec(codec_name))
    released: list[list[Any]] = []
    maps = Mappings(lambda seg, block, gen: released.append([seg, block, gen]))
    ctx: zmq.Context = zmq.Context()
    sock: Any
    if address.startswith("ipc://"):
        sock = ctx.socket(zmq.PULL)
        sock.bind(address)
        conn.send("ready")
    else:  # shm-bell: a socket path
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(address)
        listener.listen(1)
        conn.send("ready")
        sock = _Bell(listener.accept()[0])
        listener.close()
    try:
        while True:
            frames = sock.recv_multipart(copy=False)
            received = time.monotonic_ns()
            kind, rid = zmq_link.open_envelope(frames[0])
            if kind == zmq_link.SHUTDOWN:
                return
            body: list[Any] = list(frames[1:])
            if kind == zmq_link.ADD_TORCH:
                take = lambda fd, serial: released.append([TAKEN, fd, serial])  # noqa: E731
                body = receivers.from_torch_shm(body, take, os.getppid())  # the sender spawned this process
            elif kind == zmq_link.ADD_SHM:
                table = json.loads(zmq_link.frame_bytes(body[0]))
                body = body[1:]
                for index, *handle in table:
                    body[index] = maps.view(Handle.from_list(handle))
            msg = calls.decode(body, msg_type)  # the codec's native message: its adapter is not delivery
            done = time.monotonic_ns()
            digest = None
            if rid == CHECK_ID and msg_type is messages.EngineCoreRequest:  # what arrived, off the clock
                digest = request_digest(calls.from_native(msg, msg_type))
            del msg, body, frames  # the views die here: their blocks are released
            conn.send((received, done, released[:], digest))
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
    if transport_name not in TRANSPORTS:
        return Delivery(codec_name, transport_name, payload, "unsupported", f"not measured by micro: {transport_name}")
    if transport_name != "zmq" and not wirecodecs.sends_out_of_band(codec_name):
        return Delivery(codec_name, transport_name, payload, "unsupported", "no out-of-band frames for shm")
    try:
        native = calls.to_native(msg)
        calls.encode(native)
    except wirecodecs.EncodeError as exc:
        return Delivery(codec_name, transport_name, payload, "unsupported", str(exc)[:60])
    folder = tempfile.mkdtemp(prefix="wirebench-delivery-")
    address = f"{folder}/bell" if transport_name == "shm-bell" else f"ipc://{folder}/d"
    plain_shm = transport_name not in ("zmq", *_SENDERS)
    room = max(64 << 20, 4 * _payload_bytes(codec, msg))  # an arena's or a store's bytes
    arena: Arena | None = None
    sender: Any = None
    try:  # a start that fails (no shared memory, no child process) leaves nothing behind
        arena = Arena(room, prefault=True) if plain_shm else None
        sender, loop = _sender(transport_name, threshold, room), asyncio.new_event_loop()
        ctx_mp = mp.get_context("spawn")
        parent, child = ctx_mp.Pipe()
        proc = ctx_mp.Process(target=_receiver, args=(address, codec_name, type(msg).__name__, child), daemon=True)
        proc.start()
    except BaseException:
        if arena is not None:
            arena.close()
        if sender is not None:
            sender.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    ctx: zmq.Context = zmq.Context()
    sock: Any = ctx.socket(zmq.PUSH)
    try:
        if parent.recv() != "ready":
            raise RuntimeError("receiver did not start")
        if transport_name == "shm-bell":
            sock.close()
            sock = _Bell(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
            sock.sock.connect(address)
        else:
            sock.connect(address)
        if arena is not None and transport_name == "shm-inplace":
            native = calls.to_native(_place_in_arena(msg, arena))
        if transport_name == "torch-shm-inplace":
            native = calls.to_native(_place_in_torch_shm(msg, sender))
        stamps: list[tuple[int, int, int, int, int]] = []  # start, encoded, placed, received, done
        expected = request_digest(msg) if isinstance(msg, EngineCoreRequest) else None
        for i in range(WARMUP_SENDS + iterations):
            rid = CHECK_ID if i < WARMUP_SENDS else "d"
            start = time.monotonic_ns()
            frames = calls.encode(native)
            encoded = time.monotonic_ns()
            if sender is not None:
                message, _ = loop.run_until_complete(sender.message(rid, frames, native))
            else:
                message = _message(frames, arena, threshold, rid)
            placed = time.monotonic_ns()
            sock.send_multipart(message, copy=False)
            received, done, released, digest = parent.recv()
            stamps.append((start, encoded, placed, received, done))
            if rid == CHECK_ID and digest != expected:
                raise RuntimeError("the receiver decoded other bytes than were sent")
            if sender is not None:
                sender.released(released)
                if transport_name == "shm-store-miss":
                    sender.store.clear()
            if arena is not None:
                for _, block, gen in released:
                    arena.free(block, gen)
                if transport_name == "shm-inplace":  # its block went back with the release
                    native = calls.to_native(_place_in_arena(msg, arena))
        sock.send(bytes((zmq_link.SHUTDOWN,)))
        first = stamps[0]
        ns = np.array(stamps[WARMUP_SENDS:], dtype=np.int64)
        parts = np.diff(ns, axis=1) / 1e3  # encode, copy, notify, decode per send, µs
        total = (ns[:, -1] - ns[:, 0]) / 1e3
        p50s = [float(np.percentile(parts[:, i], 50)) for i in range(len(PARTS))]
        return Delivery(
            codec_name,
            transport_name,
            payload,
            "ok",
            "",
            float(np.percentile(total, 50)),
            float(np.percentile(total, 99)),
            len(total),
            (first[-1] - first[0]) / 1e3,
            *p50s,
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
        if sender is not None:
            sender.close()
        loop.close()
        shutil.rmtree(folder, ignore_errors=True)


def _sender(name: str, threshold: int, store_bytes: int) -> Any:
    """The serving loop's sender of a transport bench micro measures through it (None for the others)."""
    if name in ("torch-shm", "torch-shm-inplace"):
        return TorchShmSender(threshold)
    if name in ("shm-store", "shm-store-miss"):
        return StoreSender(MmStore(store_bytes), threshold)
    return None


def _place_in_torch_shm(msg: Any, sender: TorchShmSender) -> Any:
    """A copy of ``msg`` whose pixel tensor lives in a torch shared storage (a frontend's on torch-shm)."""
    import copy

    import torch

    out = copy.copy(msg)
    out.mm_inputs = [dict(item) if isinstance(item, dict) else item for item in msg.mm_inputs or []]
    for item in out.mm_inputs:
        if isinstance(item, dict) and isinstance(item.get("pixel_values"), torch.Tensor):
            src = item["pixel_values"]
            (dst,) = sender.tensors([tuple(src.shape)], src.dtype)
            dst.copy_(src)
            item["pixel_values"] = dst
    return out


def _payload_bytes(codec: Any, msg: Any) -> int:
    return zmq_link.frames_nbytes(codec.encode(msg))


def _message(frames: list[Any], arena: Arena | None, threshold: int, rid: str) -> list[Any]:
    if arena is None:
        return [zmq_link.envelope(zmq_link.ADD, rid), *frames]
    table, out = [], [frames[0]]
    for i, frame in enumerate(frames[1:], start=1):
        view = memoryview(frame).cast("B")
        if view.nbytes < threshold:
            out.append(frame)
            continue
        handle = arena.handle_of(view)
        if handle is None:
            block, gen, dst = arena.alloc(view.nbytes)
            copy_into(dst, view)
            handle = Handle(arena.name, block, view.nbytes, gen)
        table.append([i, *handle.to_list()])
        out.append(b"")
    if not table:
        return [zmq_link.envelope(zmq_link.ADD, rid), *frames]
    return [zmq_link.envelope(zmq_link.ADD_SHM, rid), json.dumps(table).encode(), *out]
