"""``shm``: big frames through one shared-memory arena the frontend owns, viewed in place by the engine.

The sender (the frontend) owns one POSIX shared-memory segment: an *arena* of ``--shm-size`` MiB
under ``/dev/shm``, created with mode 0600. A frame is copied into a block of the arena once (or not
at all when the frontend built it there, ``Arena.tensor``), and the ZeroMQ message carries a small
handle instead: (segment, offset, length, generation). The receiver maps the segment once and hands
the codec a view on the block, so tensors are built on the shared memory itself, without a copy.

Reuse: every block the receiver viewed is released when the last object that views it is gone
(``weakref.finalize`` on the view's owner: the decoded tensors/images keep it alive); the receiver
sends RELEASE entries ``[segment, block, generation]`` back and the sender frees the blocks. Memory
is bounded by the arena: when it is full the sender waits for releases (``ALLOC_TIMEOUT_S``), then
fails the request with a clear error. Every block starts with its generation number, checked by the
receiver against the handle, so a block reused too early is caught, not read.

Lifetime: the sender unlinks its segment when it stops; a receiver whose sender died unlinks the
segments it mapped and the one its sender named at spawn; and any start removes segments whose
creating process is gone (``remove_stale_segments``). The ``shm-store`` transport
(harness.transports.shm_store) keeps its store in an arena too and shares this receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import mmap
import os
import secrets
import struct
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.transports.base import (
    DEFAULT_THRESHOLD,
    FrameReceiver,
    FrameSender,
    Peer,
    SenderSettings,
    Transport,
    TransportError,
    add_message,
    address_of,
    copy_frame,
    flat,
    handle_rows,
)

ADD_SHM = 0x03  # the envelope kind of an ADD whose table names arena blocks (shm and shm-store)
ALLOC_TIMEOUT_S = 10.0  # a full arena makes a request wait this long for releases, then fail
# Tests only: WIREBENCH_FAULT=swap-shm-buffers makes the receiver hand each request the previous one's
# buffer, the race --verify exists to catch. Never set in normal use.
FAULT_SWAP = "swap-shm-buffers"

SHM_DIR = Path("/dev/shm")
PREFIX = "wirebench-"
ALIGN = 64
HEADER = 16  # generation (u64) + length (u64) before each block's data
_HEADER = struct.Struct("<QQ")  # a block's generation and length, read and written without numpy's overhead
# Linux ≥ 5.14 faults a whole range in with one call; Python 3.11's mmap module does not name it yet.
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
PAGE = mmap.PAGESIZE


class ShmError(TransportError):
    """The shared-memory transport cannot serve a message (arena full, bad handle, reused block)."""


@dataclass(frozen=True)
class Handle:
    """Where a frame's bytes are: in ``segment`` at ``offset`` (after the block header), ``length`` bytes."""

    segment: str
    offset: int
    length: int
    generation: int

    def to_list(self) -> list[Any]:
        return [self.segment, self.offset, self.length, self.generation]

    @classmethod
    def from_list(cls, raw: list[Any]) -> Handle:
        segment, offset, length, generation = raw
        if not (isinstance(segment, str) and segment.startswith(PREFIX) and "/" not in segment):
            raise ShmError(f"bad segment name {segment!r}")
        return cls(segment, int(offset), int(length), int(generation))


def _round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def segment_name() -> str:
    # The pid lets a later start tell a dead owner's segment from a live one's.
    return f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"


class Arena:
    """The sender's segment and a first-fit allocator over it (thread-safe: image threads allocate too)."""

    def __init__(self, size_bytes: int, name: str | None = None, prefault: bool = False) -> None:
        self.name = name or segment_name()
        self.size = size_bytes
        fd = os.open(SHM_DIR / self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size_bytes)
            self._mm = mmap.mmap(fd, size_bytes)
        finally:
            os.close(fd)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._mm))
        self._free: list[tuple[int, int]] = [(0, size_bytes)]  # (offset, size), sorted by offset
        self._used: dict[int, tuple[int, int]] = {}  # block offset → (size, generation)
        self._generation = 0
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)
        self._unsent: set[tuple[int, int]] = set()  # blocks built by tensor() and not yet sent
        self.peak_used = 0
        if prefault:
            self.prefault(0, size_bytes)

    def prefault(self, offset: int, nbytes: int) -> None:
        """Back ``[offset, offset + nbytes)`` with pages now, so a later copy into it takes no page faults.

        A fresh tmpfs page costs a fault, an allocation and zeroing on its first write (≈10 ms for a
        12.6 MB frame on the development VM, 20× the copy itself). It stays resident, so the pages count
        in this process's RSS from now on: only for arenas whose size is what they will use."""
        start = offset // PAGE * PAGE
        end = min(self.size, offset + nbytes)
        if end <= start:
            return
        try:
            self._mm.madvise(MADV_POPULATE_WRITE, start, end - start)
        except (OSError, ValueError):  # older kernels: write one byte per page ourselves
            pages = np.frombuffer(self._mm, dtype=np.uint8, count=end - start, offset=start)[::PAGE]
            pages += 0  # a ufunc stores every element; `pages[:] = pages` is skipped as a no-op copy

    # --- allocation ----------------------------------------------------------------------------
    def alloc(self, nbytes: int, timeout_s: float = 0.0) -> tuple[int, int, memoryview]:
        """A block for ``nbytes``: (block offset, generation, writable view of its data); waits for room."""
        return self.alloc_many([nbytes], timeout_s)[0]

    def alloc_many(self, sizes: Sequence[int], timeout_s: float = 0.0) -> list[tuple[int, int, memoryview]]:
        """Blocks for every size, all at once or none: a request never holds some of its blocks while it
        waits for the rest (six requests each holding part of what they need would wait on each other)."""
        needs = [_round_up(HEADER + n) for n in sizes]
        if sum(needs) > self.size:
            raise ShmError(
                f"a request's {len(sizes)} buffer(s) of {sum(sizes)} bytes do not fit the "
                f"{self.size >> 20} MiB arena (--shm-size)"
            )
        deadline = time.monotonic() + timeout_s
        with self._released:
            while (blocks := self._take_all(needs)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ShmError(self._full_message(sum(needs)))
                self._released.wait(left)
            out = []
            for block, need, nbytes in zip(blocks, needs, sizes, strict=True):
                self._generation += 1
                self._used[block] = (need, self._generation)
                out.append((block, self._generation, nbytes))
            self.peak_used = max(self.peak_used, sum(size for size, _ in self._used.values()))
        views = []
        for block, gen, nbytes in out:
            _HEADER.pack_into(self._mm, block, gen, nbytes)
            views.append((block, gen, memoryview(self._mm)[block + HEADER : block + HEADER + nbytes]))
        return views

    def _take_all(self, needs: Sequence[int]) -> list[int] | None:
        """Every block, or none (what was taken goes back); called with the lock held."""
        taken: list[tuple[int, int]] = []
        for need in needs:
            block = self._take(need)
            if block is None:
                for offset, size in taken:
                    self._insert_free(offset, size)
                return None
            taken.append((block, need))
        return [block for block, _ in taken]

    def _full_message(self, wanted: int) -> str:
        used = sum(size for size, _ in self._used.values())
        built = sum(self._used[b][0] for b, g in self._unsent if b in self._used)
        return (
            f"the shared-memory arena is full: {wanted >> 10} KiB wanted, {used >> 20} of {self.size >> 20} MiB "
            f"held, {(used - built) >> 20} MiB by buffers sent and not yet released by the engine, "
            f"{built >> 20} MiB by requests this frontend is still preparing; raise --shm-size"
        )

    def _take(self, need: int) -> int | None:
        for i, (offset, size) in enumerate(self._free):
            if size >= need:
                if size == need:
                    del self._free[i]
                else:
                    self._free[i] = (offset + need, size - need)
                return offset
        return None

    def free(self, block: int, generation: int) -> None:
        """Give a block back (a RELEASE from the receiver, or a message never sent); stale pairs are ignored."""
        with self._released:
            entry = self._used.get(block)
            if entry is None or entry[1] != generation:
                return
            size, _ = self._used.pop(block)
            self._insert_free(block, size)
            self._released.notify_all()

    def _insert_free(self, offset: int, size: int) -> None:
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < offset:
            i += 1
        free.insert(i, (offset, size))
        # Merge with the neighbours, so a full arena can serve a big buffer again.
        if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
            free[i] = (free[i][0], free[i][1] + free[i + 1][1])
            del free[i + 1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            del free[i]

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(size for size, _ in self._used.values())

    # --- frames that already live here ---------------------------------------------------------
    def tensors(self, shapes: Sequence[tuple[int, ...]], dtype: Any, timeout_s: float = 0.0) -> list[Any]:
        """Torch tensors whose storage is arena blocks, taken all at once (``alloc_many``): a frame encoded
        from one needs no copy to travel."""
        import torch

        itemsize = torch.empty((), dtype=dtype).element_size()
        sizes = [int(np.prod(shape)) * itemsize for shape in shapes]
        out = []
        for shape, nbytes, (block, gen, view) in zip(shapes, sizes, self.alloc_many(sizes, timeout_s), strict=True):
            t = torch.frombuffer(view, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)
            # Until it is handed to the transport, the block belongs to the tensor: freed with it if never sent.
            with self._lock:
                self._unsent.add((block, gen))
            weakref.finalize(t, self._free_unsent, block, gen)
            out.append(t)
        return out

    def tensor(self, shape: tuple[int, ...], dtype: Any, timeout_s: float = 0.0) -> Any:
        """One tensor in the arena (``tensors``)."""
        return self.tensors([shape], dtype, timeout_s)[0]

    def handle_of(self, frame: Any) -> Handle | None:
        """The handle of a frame that is exactly an arena block's data (built by ``tensor``); None otherwise."""
        view = memoryview(frame)
        if view.nbytes == 0 or not view.contiguous:
            return None
        block = address_of(view) - self._base - HEADER
        with self._lock:
            entry = self._used.get(block)
            if entry is None or (block, entry[1]) not in self._unsent:
                return None
            size, gen = entry
            if HEADER + view.nbytes > size:
                return None
            self._unsent.discard((block, gen))  # sent: the receiver's RELEASE frees it from now on
        return Handle(self.name, block, view.nbytes, gen)

    def _free_unsent(self, block: int, gen: int) -> None:
        with self._lock:
            unsent = (block, gen) in self._unsent
            self._unsent.discard((block, gen))
        if unsent:
            self.free(block, gen)

    def close(self) -> None:
        """Unmap and unlink the segment (the receiver keeps its own mapping until it drops it)."""
        with contextlib.suppress(BufferError):
            self._mm.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SHM_DIR / self.name)


# --- the receiver's maps -------------------------------------------------------------------------


class Mappings:
    """The receiver's maps of senders' segments, and views whose release is reported when they die."""

    def __init__(self, on_release: Callable[[str, int, int], None]) -> None:
        self._maps: dict[str, mmap.mmap] = {}
        self._on_release = on_release

    def view(self, handle: Handle) -> memoryview:
        """A view on the handle's bytes, checked against the block's header; released when nothing uses it."""
        mm = self._map(handle.segment)
        block, n = handle.offset, handle.length
        if block < 0 or block + HEADER + n > len(mm):
            raise ShmError(f"handle outside segment {handle.segment}: [{block}, {block + HEADER + n})")
        gen, length = _HEADER.unpack_from(mm, block)
        if gen != handle.generation or length != n:
            raise ShmError(
                f"shared-memory block {block} of {handle.segment} holds generation {gen} ({length} "
                f"bytes), the message expected {handle.generation} ({n}): reused before it was released"
            )
        owner = np.frombuffer(mm, dtype=np.uint8, count=n, offset=block + HEADER)
        weakref.finalize(owner, self._on_release, handle.segment, block, handle.generation)
        return memoryview(owner)  # type: ignore[arg-type]  # an ndarray is a buffer

    def _map(self, name: str) -> mmap.mmap:
        mm = self._maps.get(name)
        if mm is None:
            try:
                fd = os.open(SHM_DIR / name, os.O_RDWR)
            except FileNotFoundError:
                raise ShmError(f"shared-memory segment {name} is gone (its sender stopped)") from None
            try:
                mm = self._maps[name] = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        return mm

    def unlink_all(self) -> None:
        """For a receiver whose sender died: remove the segments it can no longer clean up itself."""
        for name in list(self._maps):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(SHM_DIR / name)


def unlink_segment(name: str) -> None:
    """Remove a segment by name (gone already: nothing to do); a name with a path in it is refused."""
    if "/" in name or not name.startswith(PREFIX):
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SHM_DIR / name)


def remove_stale_segments() -> list[str]:
    """Remove this user's wirebench segments whose creating process is gone."""
    removed: list[str] = []
    if not SHM_DIR.is_dir():
        return removed
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        pid_text = path.name[len(PREFIX) :].split("-", 1)[0]
        try:
            mine = path.stat().st_uid == os.getuid()
        except FileNotFoundError:
            continue
        if not pid_text.isdigit() or not mine:
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
        except PermissionError:
            pass
    return removed


# --- the sender -----------------------------------------------------------------------------------


class ShmSender(FrameSender):
    """The frontend's half: every big frame in an arena block (none copied when built there), its handle in
    the message's table; blocks come back with the engine's RELEASE."""

    builds_in_place = True
    add_kind = ADD_SHM

    def __init__(self, arena: Arena, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.arena = arena
        self.segment = arena.name
        self.threshold = threshold
        self._room = asyncio.Event()  # set whenever a RELEASE frees blocks
        self.copied_bytes = 0
        self.zero_copy_bytes = 0

    @classmethod
    def from_settings(cls, settings: SenderSettings) -> ShmSender:
        return cls(Arena(settings.arena_bytes, prefault=settings.prefault), settings.threshold)

    async def message(self, rid: str, frames: Sequence[Any], request: Any = None) -> tuple[list[Any], list[Handle]]:
        """The ZeroMQ message for a request, and the blocks it holds (to give back if it is never sent).
        The frames that must be copied get their blocks all at once (``Arena.alloc_many``)."""
        table: list[list[Any]] = []
        out: list[Any] = [frames[0]]
        held: list[Handle] = []
        to_copy: list[tuple[int, memoryview]] = []  # (index in out, frame)
        try:
            for i, frame in enumerate(frames[1:], start=1):
                view = flat(frame)
                if view.nbytes < self.threshold:
                    out.append(frame)
                    continue
                handle = self.arena.handle_of(view)
                if handle is None:
                    to_copy.append((i, view))
                    table.append([i])  # its handle once the blocks are taken
                else:
                    self.zero_copy_bytes += view.nbytes
                    held.append(handle)
                    table.append([i, *handle.to_list()])
                out.append(b"")
            if to_copy:
                blocks = await self._alloc_many([v.nbytes for _, v in to_copy])
                by_index = {}
                for (i, view), (block, gen, dst) in zip(to_copy, blocks, strict=True):
                    handle = Handle(self.arena.name, block, view.nbytes, gen)
                    held.append(handle)
                    by_index[i] = handle
                    await self._copy(view, dst)
                table = [row if len(row) > 1 else [row[0], *by_index[row[0]].to_list()] for row in table]
        except BaseException:
            self.unsent(held)
            raise
        return add_message(ADD_SHM, rid, table, frames, out), held

    async def _copy(self, view: memoryview, dst: memoryview) -> None:
        await copy_frame(dst, view)
        self.copied_bytes += view.nbytes

    async def _alloc_many(self, sizes: list[int]) -> list[tuple[int, int, memoryview]]:
        """Blocks for every size at once, waiting on the event loop (not blocking it) while the arena is full."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ALLOC_TIMEOUT_S
        while True:
            try:
                return self.arena.alloc_many(sizes)
            except ShmError:
                left = deadline - loop.time()
                if left <= 0 or sum(sizes) + 64 * len(sizes) > self.arena.size:
                    raise
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), left)

    def tensors(self, shapes: list[tuple[int, ...]], dtype: Any) -> list[Any]:
        """A request's empty tensors in the arena, all at once (images.TensorAlloc); runs in the image
        thread, may wait for room (never holding part of what it needs)."""
        return self.arena.tensors(shapes, dtype, timeout_s=ALLOC_TIMEOUT_S)

    def released(self, entries: Sequence[Sequence[Any]]) -> None:
        """The engine's RELEASE: [segment, block, generation] per block it no longer views."""
        for segment, block, generation in entries:
            if segment == self.arena.name:
                self.arena.free(int(block), int(generation))
        self._room.set()

    def unsent(self, held: Sequence[Handle]) -> None:
        for h in held:
            self.arena.free(h.offset, h.generation)
        self._room.set()

    def close(self) -> None:
        self.arena.close()


class ShmReceiver(FrameReceiver):
    """The engine's half: each row [index, segment, block, length, generation] becomes a view on the
    sender's arena, checked against the segment the sender named at spawn and the block's header."""

    def __init__(self, peer: Peer) -> None:
        super().__init__(peer)
        self.mappings = Mappings(on_release=lambda segment, block, gen: peer.release([segment, block, gen]))
        self._fault_swap = os.environ.get("WIREBENCH_FAULT") == FAULT_SWAP
        self._previous: Handle | None = None

    def open(self, frames: list[Any]) -> list[Any]:
        rows, body = handle_rows(frames, "shared-memory")
        for index, *raw in rows:
            handle = Handle.from_list(raw)
            if handle.segment != self.peer.segment:
                raise ShmError(f"segment {handle.segment} is not the one this engine's frontend named at spawn")
            if self._fault_swap:  # a deliberately broken transport, for tests
                handle, self._previous = self._previous or handle, handle
                if handle.length != self._previous.length:
                    handle = self._previous
            body[index] = self.mappings.view(handle)
        return body

    def peer_gone(self) -> None:
        self.mappings.unlink_all()
        if self.peer.segment:
            unlink_segment(self.peer.segment)


class ShmTransport(Transport):
    name = "shm"
    add_kind = ADD_SHM
    variants = ("in-place", "bell")
    summary = (
        "frames of at least --shm-threshold bytes through a shared-memory arena the frontend owns, "
        "handles through the socket"
    )

    sender_class = ShmSender
    receiver_class = ShmReceiver

    def remove_stale(self) -> list[str]:
        return remove_stale_segments()
