"""Delivery: encode, send, receive in another process, decode — until the receiver holds the message.

``bench micro --transport zmq,shm`` times, for each codec × transport × payload, what the serving
loop pays to move one request between its two processes, against one memcpy of the payload's bytes:

  sender     t0 → codec.encode → the transport's sender builds the message (its big frames copied
             into the transport's memory, or none when built there) → send_multipart(copy=False)
  receiver   recv_multipart(copy=False) → the transport's receiver opens its handles → codec.decode → t1

delivery = t1 − t0 on CLOCK_MONOTONIC (one clock for both processes on a host). Both halves are the
serving loop's own (harness.transports: the sender on an event loop, as in the frontend; the
receiver as in the engine), so a transport ``bench serve`` offers is measured here by the same
name, and one added by entry point is measured too. The receiver then drops the message (releasing
what its transport holds for it: the RELEASE entries return with the reply) and answers; one message
is in flight at a time, so no queueing enters the figure.

A transport's *variants* (``harness.transports.base.VARIANTS``, one flag each) are other ways of
serving it, measured beside the plain one: ``in-place`` builds the payload's tensors in the
transport's memory first (as ``--mm-payload tensor`` does), ``bell`` sends the small message as one
Unix SOCK_SEQPACKET packet instead of through ZeroMQ (four thread hand-overs fewer: what a lighter
notify would save; the serving loop does not use it), ``store-miss`` makes the store forget each
frame after its send (every send a miss, copied).

Each send is also cut into four parts (``PARTS``) by timestamps on the same clock, so the parts of
one send add up to its delivery exactly; each part is reported by its own p50 (p50s need not add
up to the total's p50).

The first ``WARMUP_SENDS`` sends are not in p50/p99: the first one pays one-time costs the serving
loop pays once per process — the receiver's lazy imports on its first decode (torch: ≈1 s on the
development VM, which made the p99 of a 50-send cell) and page faults of shared memory used for the
first time (≈10 ms for 12.6 MB). The first send's delivery is reported apart (``first_us``). On the
warm-up sends the receiver also digests what it decoded (``request_digest``: token ids and every
multimodal buffer), outside the clock, and a cell whose bytes did not arrive intact is an error,
not a figure. The shm arena is pre-faulted (``SenderSettings.prefault``): blocks are reused
first-fit one message at a time, so a serving arena's hot blocks are resident too.
"""

from __future__ import annotations

import asyncio
import copy
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
from harness.transports import FrameSender, Peer, SenderSettings, UnknownTransportError, get_transport
from harness.transports.base import DEFAULT_THRESHOLD, VARIANTS
from harness.wire import zmq_link
from harness.wire.integrity import request_digest
from harness.wire.messages import EngineCoreRequest

WARMUP_SENDS = 3  # untimed; the first of them is reported as first_us
CHECK_ID = "check"  # the request id of warm-up sends: the receiver digests what it decoded

# The parts of one send, in order; their one-line definitions are printed with the table.
PARTS: dict[str, str] = {
    "encode": "codec.encode in the sender",
    "copy": "the transport's sender: its copy of big frames into its memory and its handle table (zmq, in-place: "
    "the message's assembly only; torch-shm: a new shared storage per frame and the copy; shm-store: the hash, "
    "and on a miss the copy)",
    "notify": "send_multipart → recv_multipart returns in the receiver: ZeroMQ's hand-over (zmq: with its copies of "
    "the big frames; bell: the socket's) and the receiver's wake-up",
    "decode": "the transport's receiver opening its handles (views on shared memory, mapped storages) and "
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
    variant: str = ""  # a name in VARIANTS, or "" for the transport as bench serve serves it

    @property
    def parts_p50_us(self) -> dict[str, float]:
        return {name: getattr(self, f"{name}_p50_us") for name in PARTS}

    @property
    def label(self) -> str:
        """The transport as a table names it: ``shm``, ``shm in-place``."""
        return f"{self.transport} {self.variant}" if self.variant else self.transport


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


def _receiver(
    address: str, codec_name: str, msg_type_name: str, transport_name: str, segment: str | None, conn: Connection
) -> None:
    from harness.wire import messages

    msg_type = getattr(messages, msg_type_name)
    calls = wirecodecs.CodecCalls(wirecodecs.get_codec(codec_name))
    released: list[list[Any]] = []
    # The engine's half of the transport, as the engine builds it: the sender spawned this process.
    receiver = get_transport(transport_name).receiver(Peer(os.getppid(), segment, released.append))
    ctx: zmq.Context = zmq.Context()
    sock: Any
    if address.startswith("ipc://"):
        sock = ctx.socket(zmq.PULL)
        sock.bind(address)
        conn.send("ready")
    else:  # bell: a socket path
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
            if kind != zmq_link.ADD and receiver is not None:
                body = receiver.open(body)
            msg = calls.decode(body, msg_type)  # the codec's native message: its adapter is not delivery
            done = time.monotonic_ns()
            digest = None
            if rid == CHECK_ID and msg_type is messages.EngineCoreRequest:  # what arrived, off the clock
                digest = request_digest(calls.from_native(msg, msg_type))
            del msg, body, frames  # the views die here: what they hold is released
            conn.send((received, done, released[:], digest))
            released.clear()
    finally:
        sock.close(linger=0)
        ctx.term()


def _built_in_place(msg: Any, sender: FrameSender) -> Any:
    """A copy of ``msg`` whose pixel tensors live in the transport's memory (what a frontend serving
    ``--mm-payload tensor`` on it produces): their frames need no copy to travel."""
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


def _refusal(codec_name: str, transport_name: str, variant: str, msg: Any) -> str | None:
    """Why this cell cannot be measured (an ``unsupported`` row), or None."""
    transport = get_transport(transport_name)
    if variant and variant not in transport.variants:
        return f"{transport_name} has no variant {variant} (it has: {', '.join(transport.variants) or 'none'})"
    if transport.out_of_band and not wirecodecs.sends_out_of_band(codec_name):
        return f"no out-of-band frames for {transport_name}"
    if transport.needs_cuda:
        import torch

        if not torch.cuda.is_available():
            return f"{transport_name} needs a CUDA device"
    if variant == "in-place" and not getattr(msg, "mm_inputs", None):
        return "no tensors to build in place"
    return None


def measure(
    codec_name: str,
    transport_name: str,
    payload: str,
    msg: Any,
    *,
    iterations: int = 50,
    threshold: int = DEFAULT_THRESHOLD,
    variant: str = "",
) -> Delivery:
    """The delivery time of ``msg`` (p50/p99 µs over ``iterations`` one-at-a-time sends) over a transport
    ``bench serve`` offers, as served or by one of its variants (``VARIANTS``)."""
    calls = wirecodecs.CodecCalls(wirecodecs.get_codec(codec_name))  # the adapter (vllm's) runs outside the clock
    assert not variant or variant in VARIANTS, variant
    try:
        refusal = _refusal(codec_name, transport_name, variant, msg)
    except UnknownTransportError as exc:  # a registered transport that cannot be loaded
        return Delivery(codec_name, transport_name, payload, "error", str(exc)[:80], variant=variant)
    if refusal:
        return Delivery(codec_name, transport_name, payload, "unsupported", refusal, variant=variant)
    try:
        native = calls.to_native(msg)
        encoded_bytes = zmq_link.frames_nbytes(calls.encode(native))
    except wirecodecs.EncodeError as exc:
        return Delivery(codec_name, transport_name, payload, "unsupported", str(exc)[:60], variant=variant)
    folder = tempfile.mkdtemp(prefix="wirebench-delivery-")
    address = f"{folder}/bell" if variant == "bell" else f"ipc://{folder}/d"
    room = max(64 << 20, 4 * encoded_bytes)  # an arena's or a store's bytes
    sender: FrameSender | None = None
    try:  # a start that fails (no shared memory, no child process) leaves nothing behind
        settings = SenderSettings(threshold, arena_bytes=room, store_bytes=room, prefault=True)
        sender, loop = get_transport(transport_name).sender(settings), asyncio.new_event_loop()
        segment = sender.segment if sender is not None else None
        ctx_mp = mp.get_context("spawn")
        parent, child = ctx_mp.Pipe()
        args = (address, codec_name, type(msg).__name__, transport_name, segment, child)
        proc = ctx_mp.Process(target=_receiver, args=args, daemon=True)
        proc.start()
    except BaseException:
        if sender is not None:
            sender.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    ctx: zmq.Context = zmq.Context()
    sock: Any = ctx.socket(zmq.PUSH)
    try:
        if parent.recv() != "ready":
            raise RuntimeError("receiver did not start")
        if variant == "bell":
            sock.close()
            sock = _Bell(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
            sock.sock.connect(address)
        else:
            sock.connect(address)
        stamps: list[tuple[int, int, int, int, int]] = []  # start, encoded, placed, received, done
        expected = request_digest(msg) if isinstance(msg, EngineCoreRequest) else None

        async def sends() -> None:
            """Every send on one event loop, as the frontend's requests run: the sender's message is awaited
            (a plain call when it does not wait), its big copies go to a thread, as in serving."""
            request = native
            for i in range(WARMUP_SENDS + iterations):
                if variant == "in-place":  # a fresh request's tensors, built where they travel from (off the clock)
                    assert sender is not None
                    request = calls.to_native(_built_in_place(msg, sender))
                rid = CHECK_ID if i < WARMUP_SENDS else "d"
                start = time.monotonic_ns()
                frames = calls.encode(request)
                encoded = time.monotonic_ns()
                if sender is not None:
                    message, _ = await sender.message(rid, frames, request)
                else:
                    message = [zmq_link.envelope(zmq_link.ADD, rid), *frames]
                placed = time.monotonic_ns()
                sock.send_multipart(message, copy=False)
                received, done, released, digest = parent.recv()  # blocks the loop: nothing else runs on it
                stamps.append((start, encoded, placed, received, done))
                if rid == CHECK_ID and digest != expected:
                    raise RuntimeError("the receiver decoded other bytes than were sent")
                if sender is not None:
                    sender.released(released)
                    if variant == "store-miss":
                        sender.forget()

        loop.run_until_complete(sends())
        sock.send(bytes((zmq_link.SHUTDOWN,)))
        first = stamps[0]
        ns = np.array(stamps[WARMUP_SENDS:], dtype=np.int64)
        parts = np.diff(ns, axis=1) / 1e3  # encode, copy, notify, decode per send, µs
        total = (ns[:, -1] - ns[:, 0]) / 1e3
        p50s = {f"{name}_p50_us": float(np.percentile(parts[:, i], 50)) for i, name in enumerate(PARTS)}
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
            variant=variant,
            **p50s,
        )
    except Exception as exc:  # a measuring tool reports, it does not crash the table
        reason = f"{type(exc).__name__}: {exc}"[:80]
        return Delivery(codec_name, transport_name, payload, "error", reason, variant=variant)
    finally:
        sock.close(linger=1000)
        ctx.term()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
        if sender is not None:
            sender.close()
        loop.close()
        shutil.rmtree(folder, ignore_errors=True)
