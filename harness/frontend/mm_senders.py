"""The frontend's side of the ``torch-shm``, ``shm-store`` and ``cuda-ipc`` transports.

Each sender turns a request's codec frames into the ZeroMQ message the engine expects, with the big
frames (at least ``threshold`` bytes) out of the message, and keeps what those frames need alive
until the engine's RELEASE says it may go. The same surface as ``ShmSender`` (``FrameSender``).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from harness.frontend.shm_sender import ShmSender, add_message, copy_frame
from harness.frontend.taken_holds import HeldUntilTaken
from harness.wire import mm_store, torch_shm, zmq_link
from harness.wire.mm_store import MmStore
from harness.wire.policy import LinkSettings
from harness.wire.shm import DEFAULT_THRESHOLD, Arena, address_of

HASH_IN_THREAD_BYTES = 1 << 20  # hashing bigger frames leaves the event loop (hashlib releases the GIL)


class FrameSender(Protocol):
    async def message(self, rid: str, frames: Sequence[Any], request: Any = None) -> tuple[list[Any], list[Any]]:
        """The ZeroMQ message for a request (``request``: the message the frames encode, for what its fields
        tell a sender), and what it holds (given back by ``unsent`` if never sent)."""
        ...

    def released(self, entries: Sequence[Sequence[Any]]) -> None:
        """The engine's RELEASE entries: [segment, block, generation] each."""
        ...

    def unsent(self, held: Sequence[Any]) -> None: ...

    def close(self) -> None: ...


def _flat(frame: Any) -> memoryview:
    view = memoryview(frame)
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


def _fault() -> str:
    return os.environ.get("WIREBENCH_FAULT", "")


def known_keys(request: Any) -> dict[int, tuple[int, bytes]]:
    """The store's keys of a request's pixel tensors, by their address: the image path hashed the decoded
    pixels already (``mm_hashes``), so a frame that is one of these tensors needs no hashing of its own."""
    out: dict[int, tuple[int, bytes]] = {}
    for item, mm_hash in zip(getattr(request, "mm_inputs", None) or [], getattr(request, "mm_hashes", None) or []):
        t: Any = item.get("pixel_values") if isinstance(item, dict) else None
        if mm_hash and hasattr(t, "data_ptr") and t.is_contiguous():
            out[t.data_ptr()] = (t.nbytes, mm_store.pixels_key(mm_hash, tuple(t.shape), str(t.dtype)))
    return out


class TorchShmSender(HeldUntilTaken):
    """torch-shm: each big frame in a torch shared storage, held until the engine reports it mapped
    (harness.wire.torch_shm has the lifetime rules). A pixel tensor built in one (``tensors``, with
    --mm-payload tensor) travels as it is; any other big frame is copied into a new one. Held by
    (fd, serial): alive, so its fd number names it, until the engine's TAKEN."""

    def __init__(self, threshold: int = DEFAULT_THRESHOLD) -> None:
        super().__init__()
        self.threshold = threshold
        # Tensors ``tensors`` built, by address: (bytes, a weak reference); gone with the tensor.
        self._built: dict[int, tuple[int, weakref.ref]] = {}
        self._fault_free_early = _fault() == torch_shm.FAULT_FREE_EARLY
        self.copied_bytes = 0
        self.zero_copy_bytes = 0

    def tensors(self, shapes: list[tuple[int, ...]], dtype: Any) -> list[Any]:
        """A request's empty pixel tensors, each in a torch shared storage of its own (images.TensorAlloc:
        the image thread calls it), so the frame that carries one needs no copy."""
        import torch

        itemsize = torch.empty((), dtype=dtype).element_size()
        out = []
        for shape in shapes:
            nbytes = int(np.prod(shape)) * itemsize
            t = torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(nbytes), 0, shape)  # type: ignore[call-overload]
            self._built[t.data_ptr()] = (nbytes, weakref.ref(t))
            weakref.finalize(t, self._built.pop, t.data_ptr(), None)
            out.append(t)
        return out

    def _built_storage(self, view: memoryview) -> Any:
        """The shared storage of a tensor ``tensors`` built, when ``view`` is exactly its bytes; else None."""
        if self._fault_free_early:  # the fault rewrites what it hands over: a copy, never the request's tensor
            return None
        entry = self._built.get(address_of(view))
        tensor = entry[1]() if entry is not None and entry[0] == view.nbytes else None
        return tensor.untyped_storage() if tensor is not None else None

    async def message(self, rid: str, frames: Sequence[Any], request: Any = None) -> tuple[list[Any], list[Any]]:
        table: list[list[int]] = []
        out: list[Any] = [frames[0]]
        held: list[Any] = []
        try:
            for i, frame in enumerate(frames[1:], start=1):
                view = _flat(frame)
                if view.nbytes < self.threshold:
                    out.append(frame)
                    continue
                serial = self._next_serial()
                storage = self._built_storage(view)
                if storage is not None:
                    handle = torch_shm.handle_of(storage, view.nbytes, serial)
                    self._hold((handle.fd, handle.serial), storage, held)
                    self.zero_copy_bytes += view.nbytes
                else:
                    storage, handle, array = torch_shm.share_copy(view, serial)
                    self._hold((handle.fd, handle.serial), storage, held)
                    await copy_frame(array, view)
                    self.copied_bytes += view.nbytes
                    if self._fault_free_early:  # the fault: the next request's bytes land in it first
                        array[:] = np.roll(array, 1) ^ 0x5A
                table.append([i, *handle.to_list()])
                out.append(b"")
        except BaseException:
            self.unsent(held)
            raise
        return add_message(zmq_link.ADD_TORCH, rid, table, frames, out), held


class StoreSender:
    """shm-store: big frames through a content-addressed store (harness.wire.mm_store); a frame the store
    holds already is named, not copied. The message is an ``ADD_SHM``: the engine views entries as it views
    arena blocks, and its RELEASE unpins them."""

    def __init__(self, store: MmStore, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.store = store
        self.threshold = threshold
        self._fault_rewrite = _fault() == mm_store.FAULT_REWRITE_PINNED
        self.copied_bytes = 0
        self.hashed_bytes = 0  # frames keyed by hashing them here (no key from the image path)

    async def message(self, rid: str, frames: Sequence[Any], request: Any = None) -> tuple[list[Any], list[Any]]:
        """``request``: its pixel tensors' keys come from the image path's hashes (``known_keys``); other big
        frames are hashed here."""
        table: list[list[Any]] = []
        out: list[Any] = [frames[0]]
        held: list[tuple[int, int]] = []
        store = self.store
        known = known_keys(request) if request is not None else {}
        try:
            for i, frame in enumerate(frames[1:], start=1):
                view = _flat(frame)
                if view.nbytes < self.threshold:
                    out.append(frame)
                    continue
                hint = known.get(address_of(view)) if known else None
                if hint is not None and hint[0] == view.nbytes:
                    key = hint[1]
                elif view.nbytes >= HASH_IN_THREAD_BYTES:
                    key = await asyncio.to_thread(mm_store.content_key, view)
                    self.hashed_bytes += view.nbytes
                else:
                    key = mm_store.content_key(view)
                    self.hashed_bytes += view.nbytes
                entry = store.lookup(key)
                if entry is not None:
                    held.append((entry.block, entry.generation))
                    await entry.ready.wait()  # another request may still be copying it in
                else:
                    made = store.insert(key, view.nbytes)
                    if made is None:  # only pinned entries left: the frame travels in the message
                        out.append(frame)
                        continue
                    entry, dst = made
                    held.append((entry.block, entry.generation))
                    try:
                        await copy_frame(dst, view)
                    except BaseException:
                        entry.ready.set()  # waiters go on; the discarded entry's handle fails its generation check
                        store.discard(key)
                        raise
                    entry.ready.set()
                    self.copied_bytes += view.nbytes
                if self._fault_rewrite:  # the fault: the pinned entry's slot handed to another frame
                    np.frombuffer(store.view(entry), dtype=np.uint8)[:] = 0x3C
                table.append([i, *store.handle(entry).to_list()])
                out.append(b"")
        except BaseException:
            self.unsent(held)
            raise
        return add_message(zmq_link.ADD_SHM, rid, table, frames, out), held

    def released(self, entries: Sequence[Sequence[Any]]) -> None:
        for segment, block, generation in entries:
            if segment == self.store.name:
                self.store.unpin(int(block), int(generation))

    def unsent(self, held: Sequence[Any]) -> None:
        for block, generation in held:
            self.store.unpin(block, generation)

    def counts(self) -> dict[str, int]:
        return dict(self.store.counts)

    def close(self) -> None:
        self.store.close()


def frame_sender(link: LinkSettings, shm_bytes: int, threshold: int) -> tuple[FrameSender | None, str | None]:
    """The sender of ``link``'s transport (None for zmq) and the shared-memory segment it owns, if any (a
    spawned engine whose frontend was killed removes it)."""
    if link.transport == "shm":
        arena = Arena(shm_bytes)
        return ShmSender(arena, threshold), arena.name
    if link.transport == "shm-store":
        store = MmStore(link.mm_store_bytes)
        return StoreSender(store, threshold), store.name
    if link.transport == "torch-shm":
        return TorchShmSender(threshold), None
    if link.transport == "cuda-ipc":
        from harness.frontend.cuda_sender import CudaIpcSender

        return CudaIpcSender(threshold), None
    return None, None
