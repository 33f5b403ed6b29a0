"""``torch-shm``: big frames handed over as torch shared-memory storages (the file-descriptor strategy).

The sender copies each big frame into a fresh ``torch.UntypedStorage._new_shared`` storage (what
``tensor.share_memory_()`` allocates) under torch.multiprocessing's ``file_descriptor`` sharing
strategy: the storage is a POSIX shared-memory object that torch unlinks the moment it is created,
so it has no name in ``/dev/shm`` and lives exactly as long as some process holds its file
descriptor or a mapping of it. The message carries a handle (sender pid, fd number, length, inode,
serial); the receiver opens ``/proc/<pid>/fd/<fd>``, which yields the same memory object, checks its
inode, and maps it with ``UntypedStorage._new_shared_fd_cpu`` (what torch's ``rebuild_storage_fd``
does after receiving the fd from multiprocessing's resource sharer). Opening through ``/proc``
avoids the resource sharer's extra listener socket and temporary directory, which a SIGKILL would
leave behind, and needs no pickle on the link.

Lifetime (who frees, and when):

- The sender holds the storage (and so its fd number) from the copy until the receiver reports it
  has mapped it (a TAKEN entry in a RELEASE message), or until the message is known unsent; then
  it drops its reference. Dropping earlier would let the fd number name another request's storage.
- The receiver's mapping keeps the memory alive for as long as the decoded tensors view it; the
  object disappears with the last mapping or fd, so a killed process leaves nothing behind.
- A receiver that cannot open the handle still reports it taken: the sender frees it either way.
- One window leaves a name behind: torch creates ``/dev/shm/torch_<pid>_<n>_<m>``, fallocates it (about
  2 ms for 12.6 MB here) and only then unlinks it, so a process SIGKILLed in between leaves the file.
  The survivor removes a dead peer's (``remove_leftovers``: the engine its frontend's, the frontend its
  engine's), and the next start those of any wirebench process that left an ipc directory behind.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.transports.base import (
    DEFAULT_THRESHOLD,
    TAKEN,
    FrameReceiver,
    FrameSender,
    HeldUntilTaken,
    Transport,
    TransportError,
    address_of,
    copy_frame,
    handle_rows,
)

ADD_TORCH = 0x04  # the envelope kind of an ADD whose table names torch shared storages
# Tests only: the sender rewrites each storage after handing it over, as if it were freed into a pool and
# the next request's bytes landed in it before the receiver read it. Never set in normal use.
FAULT_FREE_EARLY = "torch-shm-free-early"


class TorchShmError(TransportError):
    """A torch-shm handle cannot be opened (its sender is gone, or the fd names another object)."""


@dataclass(frozen=True)
class TorchHandle:
    pid: int
    fd: int
    length: int
    inode: int
    serial: int

    def to_list(self) -> list[int]:
        return [self.pid, self.fd, self.length, self.inode, self.serial]

    @classmethod
    def from_list(cls, raw: list[Any]) -> TorchHandle:
        if len(raw) != 5 or not all(isinstance(v, int) and v >= 0 for v in raw):
            raise TorchShmError(f"bad torch-shm handle {raw!r}")
        return cls(*raw)


def share_copy(view: memoryview, serial: int) -> tuple[Any, TorchHandle, np.ndarray]:
    """A shared storage holding ``view``'s bytes once copied: (storage, its handle, a writable array on it).
    The copy is the caller's (``copy_into`` on the array), so it may run off the event loop."""
    import torch

    nbytes = view.nbytes
    storage = torch.UntypedStorage._new_shared(nbytes)
    array = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    return storage, handle_of(storage, nbytes, serial), array


def handle_of(storage: Any, length: int, serial: int) -> TorchHandle:
    """The handle of a shared storage built elsewhere (a pixel tensor made in one): its first ``length`` bytes."""
    fd, _ = storage._share_fd_cpu_()
    return TorchHandle(os.getpid(), fd, length, os.fstat(fd).st_ino, serial)


def open_handle(handle: TorchHandle) -> memoryview:
    """The receiver's view on a handle's storage; the mapping lives as long as the view (and what views it)."""
    import torch

    try:
        fd = os.open(f"/proc/{handle.pid}/fd/{handle.fd}", os.O_RDWR)
    except OSError as exc:
        raise TorchShmError(f"torch-shm storage {handle.fd} of process {handle.pid} is gone ({exc.strerror})") from None
    try:
        stat = os.fstat(fd)
        if stat.st_ino != handle.inode or stat.st_size < handle.length:
            raise TorchShmError(
                f"fd {handle.fd} of process {handle.pid} names another object than the message's: freed early"
            )
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, handle.length)  # type: ignore[attr-defined]
    finally:
        os.close(fd)  # the storage holds its own duplicate
    array = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()  # keeps the storage alive
    return memoryview(array)  # type: ignore[arg-type]  # an ndarray is a buffer


def file_prefix(pid: int) -> str:
    """How torch names the shared-memory files process ``pid`` creates."""
    return f"torch_{pid}_"


def remove_leftovers(pid: int, shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Remove torch's shared-memory files named for ``pid``, a process known to be gone, that are this
    user's: what it left when killed between creating a storage and unlinking its name."""
    removed = []
    for path in shm_dir.glob(f"{file_prefix(pid)}*"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_uid == os.getuid():
                path.unlink()
                removed.append(path.name)
    return removed


# --- the sender -----------------------------------------------------------------------------------


class TorchShmSender(HeldUntilTaken, FrameSender):
    """torch-shm: each big frame in a torch shared storage, held until the engine reports it mapped
    (this module's docstring has the lifetime rules). A pixel tensor built in one (``tensors``, with
    --mm-payload tensor) travels as it is; any other big frame is copied into a new one. Held by
    (fd, serial): alive, so its fd number names it, until the engine's TAKEN."""

    builds_in_place = True
    add_kind = ADD_TORCH

    def __init__(self, threshold: int = DEFAULT_THRESHOLD) -> None:
        super().__init__()
        self.threshold = threshold
        # Tensors ``tensors`` built, by address: (bytes, a weak reference); gone with the tensor.
        self._built: dict[int, tuple[int, weakref.ref]] = {}
        self._fault_free_early = os.environ.get("WIREBENCH_FAULT") == FAULT_FREE_EARLY
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

    async def place(self, view: memoryview, held: list[Any], context: Any) -> list[Any]:
        serial = self._next_serial()
        storage = self._built_storage(view)
        if storage is not None:
            handle = handle_of(storage, view.nbytes, serial)
            self._hold((handle.fd, handle.serial), storage, held)
            self.zero_copy_bytes += view.nbytes
        else:
            storage, handle, array = share_copy(view, serial)
            self._hold((handle.fd, handle.serial), storage, held)
            await copy_frame(array, view)
            self.copied_bytes += view.nbytes
            if self._fault_free_early:  # the fault: the next request's bytes land in it first
                array[:] = np.roll(array, 1) ^ 0x5A
        return handle.to_list()


class TorchShmReceiver(FrameReceiver):
    """The engine's half: each row [index, pid, fd, length, inode, serial] becomes a view on the sender's
    storage; a handle into any process but the peer's is refused, none of the message opened. Every
    handle is reported taken (``[TAKEN, fd, serial]``) once mapped, or once it failed to map."""

    def open(self, frames: list[Any]) -> list[Any]:
        rows, body = handle_rows(frames, "torch-shm")
        handles: list[TorchHandle] = []
        try:
            for row in rows:  # one by one: a bad row still leaves the ones before it reported taken
                handles.append(TorchHandle.from_list(row[1:]))
            strangers = {h.pid for h in handles} - {self.peer.pid}
            if strangers:
                raise TorchShmError(
                    f"a torch-shm handle names process {min(strangers)}, not the sender ({self.peer.pid})"
                )
            for row, handle in zip(rows, handles, strict=True):
                body[row[0]] = open_handle(handle)
        finally:
            for handle in handles:
                self.peer.release([TAKEN, handle.fd, handle.serial])
        return body


class TorchShmTransport(Transport):
    name = "torch-shm"
    add_kind = ADD_TORCH
    variants = ("in-place",)
    summary = "through torch shared storages, one per frame"

    sender_class = TorchShmSender
    receiver_class = TorchShmReceiver

    def remove_leftovers(self, pid: int) -> list[str]:
        return remove_leftovers(pid)
