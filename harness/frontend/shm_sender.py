"""The frontend's side of the shm transport: big frames into its arena, handles on the socket.

``message`` turns a request's codec frames into the ZeroMQ message the engine
expects for ``ADD_SHM``: ``[envelope, table, frame 0, placeholders...]`` where
the table (JSON) lists, for every frame of at least ``threshold`` bytes, its
index and its handle in the arena (``harness.wire.shm``). A frame already built in
the arena (a pixel tensor made there by ``tensor``) travels with no copy;
others are copied into a block once, in a worker thread when large. Blocks
come back when the engine's RELEASE says it no longer views them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from harness.wire import zmq_link
from harness.wire.shm import DEFAULT_THRESHOLD, Arena, Handle, ShmError, copy_into

COPY_IN_THREAD_BYTES = 1 << 20  # bigger copies leave the event loop
ALLOC_TIMEOUT_S = 10.0


class ShmSender:
    def __init__(self, arena: Arena, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.arena = arena
        self.threshold = threshold
        self._room = asyncio.Event()  # set whenever a RELEASE frees blocks
        self.copied_bytes = 0
        self.zero_copy_bytes = 0

    async def message(self, rid: str, frames: Sequence[Any], request: Any = None) -> tuple[list[Any], list[Handle]]:
        """The ZeroMQ message for a request, and the blocks it holds (to give back if it is never sent).
        The frames that must be copied get their blocks all at once (``Arena.alloc_many``)."""
        table: list[list[Any]] = []
        out: list[Any] = [frames[0]]
        held: list[Handle] = []
        to_copy: list[tuple[int, memoryview]] = []  # (index in out, frame)
        try:
            for i, frame in enumerate(frames[1:], start=1):
                view = memoryview(frame).cast("B") if memoryview(frame).ndim != 1 else memoryview(frame)
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
        return add_message(zmq_link.ADD_SHM, rid, table, frames, out), held

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


async def copy_frame(dst: Any, view: memoryview) -> None:
    """``view``'s bytes into ``dst``; a big copy on a worker thread (numpy's copy releases the GIL, so
    the event loop runs meanwhile)."""
    if view.nbytes >= COPY_IN_THREAD_BYTES:
        await asyncio.to_thread(copy_into, memoryview(dst), view)
    else:
        copy_into(memoryview(dst), view)


def add_message(kind: int, rid: str, table: list[list[Any]], frames: Sequence[Any], out: list[Any]) -> list[Any]:
    """A request's ADD as sent: the codec's ``frames`` plainly when none went apart (an empty
    ``table``), else ``kind`` with the JSON table of the frames that did and ``out`` (an empty frame
    in each one's place)."""
    if not table:
        return [zmq_link.envelope(zmq_link.ADD, rid), *frames]
    return [zmq_link.envelope(kind, rid), json.dumps(table).encode(), *out]
