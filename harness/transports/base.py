"""What a transport is: how a request's big frames reach the engine apart from the ZeroMQ message.

Every request travels as a ZeroMQ message on the input socket (harness.wire.zmq_link). A transport
other than ``zmq`` takes the codec frames of at least ``threshold`` bytes out of that message and
hands them over another way (shared memory, a torch storage, CUDA memory); the message then carries
a table of handles in their place:

    [envelope(add_kind, request id), JSON rows [frame index, *handle], codec frame 0, ..., b"" per big frame]

A transport is a ``Transport`` subclass registered under its name (harness.transports.registry)
with four parts, each the transport's own:

- ``sender(settings)``, the frontend's half (a ``FrameSender``): builds that message, and holds what
  the big frames need until the engine says it may go;
- ``receiver(peer)``, the engine's half (a ``FrameReceiver``): turns the table back into the codec's
  frames, and tells the sender, by ``peer.release``, what it is done with; when the sender was
  killed, removes what it mapped (``peer_gone``);
- ``remove_leftovers(pid)``: what a process of this transport left on the machine when it was
  killed, removed by its peer or the next start;
- ``remove_stale()``: at start, what killed processes left whose peer is gone too.

Lifetime in one line: the sender holds, the receiver releases, the survivor cleans up. The engine
opens an out-of-band ADD only of the kind its own transport sends and only from the frontend that
spawned it (``check_sender``).
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import zmq

from harness.wire import zmq_link
from harness.wire.zmq_link import EngineAddresses

DEFAULT_THRESHOLD = 64 * 1024  # frames at least this big travel apart (bench serve --shm-threshold)
DEFAULT_ARENA_MIB = 256  # a sender's shared memory, where it has some (--shm-size)
DEFAULT_STORE_BYTES = 256 << 20  # shm-store's capacity (--mm-store-bytes)
COPY_IN_THREAD_BYTES = 1 << 20  # bigger copies leave the event loop

# bench micro's variants of a transport (a flag each: --in-place, ...), each a way of serving it that
# the serving loop takes or could take: a transport declares the ones it has (``Transport.variants``).
VARIANTS: dict[str, str] = {
    "in-place": "the payload's tensors built in the transport's memory in the first place, as --mm-payload "
    "tensor builds them: nothing is copied",
    "bell": "the small message sent as one Unix SOCK_SEQPACKET packet instead of through ZeroMQ: what a "
    "lighter notify would save (a measurement, not a serving path)",
    "store-miss": "the store forgets each frame after its send, so every send is a miss (copied)",
}

# The tag of a RELEASE entry saying a handle held until taken (``HeldUntilTaken``) is taken.
TAKEN = "torch"


class TransportError(RuntimeError):
    """A transport cannot serve a message: no room now, a handle that names nothing, memory reused early."""


class RefusedSender(ValueError):
    """An out-of-band ADD this engine does not open: not its transport's, or not from its frontend."""


@dataclass(frozen=True)
class SenderSettings:
    """What a sender is built with (bench serve's flags; bench micro's own sizes)."""

    threshold: int = DEFAULT_THRESHOLD
    arena_bytes: int = DEFAULT_ARENA_MIB << 20
    store_bytes: int = DEFAULT_STORE_BYTES
    prefault: bool = False  # fault the sender's shared memory in at once (bench micro: no first-touch costs)


@dataclass
class Peer:
    """The receiver's view of its sender: the one process whose memory it maps, the shared-memory segment
    it named at spawn (None: none), and where the receiver's RELEASE entries go."""

    pid: int
    segment: str | None = None
    release: Callable[[list[Any]], None] = field(default=lambda entry: None)


class FrameSender:
    """The frontend's half of a transport; used from the event loop. Most define ``place`` (one big frame
    handed over) and let ``message`` build the table; one that hands a request's frames over together
    (shm: all its blocks at once) defines ``message`` itself."""

    # The envelope kind of the out-of-band ADDs it builds: its transport's ``add_kind``.
    add_kind: ClassVar[int] = zmq_link.ADD
    threshold: int = DEFAULT_THRESHOLD

    @classmethod
    def from_settings(cls, settings: SenderSettings) -> FrameSender:
        """The sender bench serve's flags (or bench micro's sizes) ask for: by default one with the threshold."""
        return cls(settings.threshold)  # type: ignore[call-arg]  # a subclass with other arguments overrides this

    # Whether ``tensors`` builds a request's pixel tensors in the transport's memory (--mm-payload tensor).
    builds_in_place: ClassVar[bool] = False
    # The shared-memory segment this sender owns, if any: the one its engine maps, and removes when the
    # frontend was killed.
    segment: str | None = None

    async def message(self, rid: str, frames: Sequence[Any], request: Any = None) -> tuple[list[Any], list[Any]]:
        """The ZeroMQ message for a request's codec ``frames`` (``request``: the message they encode, for what
        its fields tell a sender) and what it holds for it (given back by ``unsent`` if never sent): each
        frame of at least ``threshold`` bytes goes to ``place``. Raises TransportError when it cannot
        serve the request now, holding nothing."""
        table: list[list[Any]] = []
        out: list[Any] = [frames[0]]
        held: list[Any] = []
        context = self.context(request)
        try:
            for i, frame in enumerate(frames[1:], start=1):
                view = flat(frame)
                row = await self.place(view, held, context) if view.nbytes >= self.threshold else None
                if row is None:
                    out.append(frame)
                else:
                    table.append([i, *row])
                    out.append(b"")
        except BaseException:
            self.unsent(held)
            raise
        return add_message(self.add_kind, rid, table, frames, out), held

    def context(self, request: Any) -> Any:
        """What ``place`` needs to know of the request, worked out once per message (by default: nothing)."""
        return None

    async def place(self, view: memoryview, held: list[Any], context: Any) -> list[Any] | None:
        """Hand one big frame over: the handle its table row carries after the frame's index, what it holds
        for it appended to ``held`` (``context``: this message's, from ``context``); None: it travels in
        the message after all."""
        raise NotImplementedError(f"{type(self).__name__} defines neither place nor message")

    def released(self, entries: Sequence[Sequence[Any]]) -> None:
        """The engine's RELEASE entries (what its receiver passed to ``Peer.release``)."""
        return None

    def unsent(self, held: Sequence[Any]) -> None:
        """A message ``message`` built was never sent: give back what it held."""
        return None

    def tensors(self, shapes: list[tuple[int, ...]], dtype: Any) -> list[Any]:
        """A request's empty pixel tensors in the transport's memory (only when ``builds_in_place``)."""
        raise NotImplementedError(f"{type(self).__name__} builds no tensors in place")

    def counts(self) -> dict[str, int] | None:
        """Counters for /metrics (shm-store's hits, misses, ...); None: none."""
        return None

    def forget(self) -> None:
        """Drop every frame held for reuse (bench micro's ``store-miss`` variant); a no-op where nothing is kept."""
        return None

    def close(self) -> None:
        """Free what the sender owns (its segment, its storages)."""
        return None


class FrameReceiver(ABC):
    """The engine's half of a transport; used from the engine's input thread."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    @abstractmethod
    def open(self, frames: list[Any]) -> list[Any]:
        """The codec frames of an out-of-band ADD's body (``frames[0]`` the table). Raises when a handle
        cannot be opened (TransportError, ValueError; the engine fails the request whatever it raises);
        what it opened is released all the same."""

    def peer_gone(self) -> None:
        """The sender was killed: remove what this receiver maps or was named (shm: the segments). What the
        dead process left otherwise is every transport's ``remove_leftovers``, which the engine calls too."""
        return None


class Transport:
    """One way of moving big frames; subclass, set the facts, and define the parts that differ."""

    name: ClassVar[str]
    # The envelope kind of this transport's out-of-band ADD (zmq_link.OUT_OF_BAND_ADDS); ADD for zmq.
    add_kind: ClassVar[int] = zmq_link.ADD
    needs_cuda: ClassVar[bool] = False
    # bench micro's variants this transport has (names in VARIANTS).
    variants: ClassVar[tuple[str, ...]] = ()
    # One line for --transport's help.
    summary: ClassVar[str] = ""
    # Its two halves (None: every frame stays in the message, and the engine takes plain ADDs only).
    sender_class: ClassVar[type[FrameSender] | None] = None
    receiver_class: ClassVar[type[FrameReceiver] | None] = None

    @property
    def out_of_band(self) -> bool:
        """Whether big frames leave the message (and so the codec must send them as frames of their own)."""
        return self.add_kind != zmq_link.ADD

    def sender(self, settings: SenderSettings) -> FrameSender | None:
        """The frontend's half, built for these settings."""
        return self.sender_class.from_settings(settings) if self.sender_class else None

    def receiver(self, peer: Peer) -> FrameReceiver | None:
        """The engine's half, for this peer."""
        return self.receiver_class(peer) if self.receiver_class else None

    def remove_leftovers(self, pid: int) -> list[str]:
        """Remove what process ``pid``, known to be gone, left behind; the names of what was removed."""
        return []

    def remove_stale(self) -> list[str]:
        """Remove what any gone process of this user left behind; the names of what was removed."""
        return []


# --- helpers a transport's halves share ------------------------------------------------------------


def flat(frame: Any) -> memoryview:
    """A frame as a flat byte view (a tensor's or array's buffer may be multi-dimensional or typed)."""
    view = memoryview(frame)
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


def address_of(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def copy_into(dst: memoryview, src: memoryview) -> None:
    """One copy of ``src``'s bytes into ``dst``: numpy's, which releases the GIL (a memoryview assignment
    holds it for the whole copy, ≈0.5–1 ms for a 12.6 MB frame)."""
    np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))


async def copy_frame(dst: Any, view: memoryview) -> None:
    """``view``'s bytes into ``dst``; a big copy on a worker thread, so the event loop runs meanwhile."""
    if view.nbytes >= COPY_IN_THREAD_BYTES:
        await asyncio.to_thread(copy_into, memoryview(dst), view)
    else:
        copy_into(memoryview(dst), view)


def add_message(kind: int, rid: str, table: list[list[Any]], frames: Sequence[Any], out: list[Any]) -> list[Any]:
    """A request's ADD as sent: the codec's ``frames`` plainly when none went apart (an empty ``table``), else
    ``kind`` with the JSON table of the frames that did and ``out`` (an empty frame in each one's place)."""
    if not table:
        return [zmq_link.envelope(zmq_link.ADD, rid), *frames]
    return [zmq_link.envelope(kind, rid), json.dumps(table).encode(), *out]


def handle_rows(frames: list[Any], what: str) -> tuple[list[Any], list[Any]]:
    """A message's table of rows [index, *handle] (checked: each names a codec frame) and its codec frames,
    the named ones still to be replaced; ``what`` names the transport in errors."""
    if not frames:
        raise ValueError(f"a {what} message without its table")
    rows = json.loads(zmq_link.frame_bytes(frames[0]))
    if not isinstance(rows, list) or not all(isinstance(row, list) and row for row in rows):
        raise ValueError(f"the {what} table is not a list of rows")
    body = list(frames[1:])
    for row in rows:
        if not (isinstance(row[0], int) and 1 <= row[0] < len(body)):
            raise ValueError(f"the {what} table names frame {row[0]!r} of {len(body)}")
    return rows, body


class HeldUntilTaken:
    """For senders whose handles name memory only the sender's reference keeps alive (a torch shared storage,
    a CUDA tensor): each buffer is kept until the receiver reports it taken (a RELEASE entry
    ``[TAKEN, fd or 0, serial]``), or until its message is known unsent."""

    def __init__(self) -> None:
        self._serial = 0  # numbers every handed-over buffer: a TAKEN entry names it by its serial
        self._held: dict[Hashable, Any] = {}

    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def _hold(self, key: Hashable, buffer: Any, held: list[Any]) -> None:
        """Keep ``buffer`` until it is taken; ``held``: the request's keys, for ``unsent``."""
        self._held[key] = buffer
        held.append(key)

    def released(self, entries: Sequence[Sequence[Any]]) -> None:
        for tag, fd, serial in entries:
            if tag == TAKEN:
                self._held.pop((int(fd), int(serial)), None)

    def unsent(self, held: Sequence[Any]) -> None:
        for key in held:
            self._held.pop(key, None)

    @property
    def held_count(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self._held.clear()


def check_sender(kind: int, envelope: Any, link: EngineAddresses, transport: Transport) -> None:
    """Refuse (RefusedSender) an out-of-band ADD of another kind than ``transport``'s (the one this engine
    serves), or from any process but the frontend that spawned it: its handles name memory this engine
    would map. Over ipc the kernel names each message's sending process; over tcp only
    CURVE's authenticated frontend connects."""
    if kind != transport.add_kind:
        raise RefusedSender(
            f"an out-of-band message of kind {kind:#x}, but this engine serves --transport {transport.name}"
        )
    if link.frontend_pid is None:
        raise RefusedSender("only an engine its frontend spawned maps the frontend's memory")
    if link.input.startswith("ipc://"):
        pid = zmq_link.sender_pid(envelope) if isinstance(envelope, zmq.Frame) else None
        if pid != link.frontend_pid:
            raise RefusedSender(f"sent by process {pid}, not by this engine's frontend ({link.frontend_pid})")
    elif not link.authenticated:  # refused at start (harness.transports.policy); never trusted here either
        raise RefusedSender("an unauthenticated tcp link cannot tell the frontend from any other process")
