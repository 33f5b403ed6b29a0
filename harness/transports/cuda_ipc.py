"""``cuda-ipc``: big frames handed over as CUDA tensors through CUDA IPC memory handles.

The sender copies a frame into a CUDA tensor and shares its storage (torch's ``_share_cuda_``: a
cudaIpcMemHandle, the allocation's size and offset, a reference-count file and an event); the message
carries those facts as plain data, a ``CudaHandle`` row of numbers and hex strings, and the receiver
rebuilds the tensor from them with torch's ``rebuild_cuda_tensor``, on the same device. Nothing is
unpickled: the receiver chooses every class itself (a uint8 tensor on an untyped storage), so a peer
can name memory, never code.

Lifetime: the sender holds the tensor until the receiver reports it taken; torch's own reference
counting keeps the memory until the receiver's tensor is gone too. Refused where there is no CUDA
device (harness.transports.policy). The engine copies the bytes back to host memory for the codec: this
transport shows what handing over GPU memory costs, the model here runs on the CPU anyway.
"""

from __future__ import annotations

import asyncio
from dataclasses import astuple, dataclass
from typing import Any

from harness.transports import TAKEN
from harness.transports.base import (
    FrameReceiver,
    FrameSender,
    HeldUntilTaken,
    Transport,
    TransportError,
    handle_rows,
)

ADD_CUDA = 0x05  # the envelope kind of an ADD whose table names CUDA IPC handles


class CudaIpcError(TransportError):
    """A cuda-ipc row that is not a handle of the expected shape and types."""


@dataclass(frozen=True)
class CudaHandle:
    """What the receiver needs to map a shared CUDA storage and view ``length`` bytes of it."""

    device: int
    memory: bytes  # the cudaIpcMemHandle of the allocation
    storage_bytes: int
    storage_offset: int  # of the storage within the allocation
    ref_counter: bytes  # the name of the sender's reference-count file
    ref_counter_offset: int
    event: bytes | None
    event_sync: bool
    tensor_offset: int  # in elements (bytes: a uint8 tensor) within the storage
    length: int

    def to_row(self) -> list[Any]:
        return [v.hex() if isinstance(v, bytes) else v for v in astuple(self)]

    @classmethod
    def from_row(cls, row: list[Any]) -> CudaHandle:
        """The handle a message's row names, every field checked for its type (CudaIpcError otherwise)."""
        kinds: tuple[type | tuple[type, ...], ...] = (int, str, int, int, str, int, (str, type(None)), bool, int, int)
        if not isinstance(row, list) or len(row) != len(kinds):
            raise CudaIpcError(f"a cuda-ipc handle is a row of {len(kinds)} values, got {row!r:.80}")
        for value, kind in zip(row, kinds, strict=True):
            wrong_bool = isinstance(value, bool) and kind is int
            if wrong_bool or not isinstance(value, kind) or (isinstance(value, int) and value < 0):
                raise CudaIpcError(f"bad cuda-ipc handle {row!r:.80}")
        try:
            fields = [bytes.fromhex(v) if isinstance(v, str) else v for v in row]
        except ValueError:
            raise CudaIpcError(f"bad hex in cuda-ipc handle {row!r:.80}") from None
        return cls(*fields)  # type: ignore[arg-type]  # each field's type was checked above


def share_cuda(view: memoryview) -> tuple[Any, CudaHandle]:
    """A CUDA copy of ``view``'s bytes and the handle that lets another process map it."""
    import torch

    tensor = torch.frombuffer(view, dtype=torch.uint8).to("cuda")
    torch.cuda.current_stream().synchronize()  # the receiver reads it on another stream
    device, memory, size, offset, counter, counter_offset, event, sync = tensor.untyped_storage()._share_cuda_()
    shared = (memory, int(size), int(offset), counter, int(counter_offset), event, bool(sync))
    handle = CudaHandle(int(device), *shared, int(tensor.storage_offset()), view.nbytes)
    return tensor, handle


def open_cuda_handle(handle: CudaHandle) -> memoryview:
    """The bytes of a CUDA tensor another process shared, copied to host memory."""
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    tensor = rebuild_cuda_tensor(
        torch.Tensor,
        (handle.length,),
        (1,),
        handle.tensor_offset,
        torch.UntypedStorage,
        torch.uint8,
        handle.device,
        handle.memory,
        handle.storage_bytes,
        handle.storage_offset,
        False,
        handle.ref_counter,
        handle.ref_counter_offset,
        handle.event,
        handle.event_sync,
    )
    return memoryview(tensor.cpu().numpy())


# --- the sender and the receiver -------------------------------------------------------------------


class CudaIpcSender(HeldUntilTaken, FrameSender):
    """Each big frame copied into a CUDA tensor, held as (0, serial) until the engine reports it taken."""

    add_kind = ADD_CUDA

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    async def place(self, view: memoryview, held: list[Any], context: Any) -> list[Any]:
        serial = self._next_serial()
        tensor, handle = await asyncio.to_thread(share_cuda, view)
        self._hold((0, serial), tensor, held)  # a CUDA handle has no fd: its TAKEN entry carries 0
        return [serial, *handle.to_row()]


class CudaIpcReceiver(FrameReceiver):
    """The engine's half: each row [index, serial, *handle] (``CudaHandle``: plain numbers and hex) becomes
    the CUDA tensor's bytes, copied to host memory for the codec; every serial is reported taken."""

    def open(self, frames: list[Any]) -> list[Any]:
        rows, body = handle_rows(frames, "cuda-ipc")
        try:
            handles = [(row[0], CudaHandle.from_row(row[2:])) for row in rows]
            for index, handle in handles:
                body[index] = open_cuda_handle(handle)
        finally:
            for row in rows:
                if len(row) > 1 and isinstance(row[1], int):
                    self.peer.release([TAKEN, 0, row[1]])
        return body


class CudaIpcTransport(Transport):
    name = "cuda-ipc"
    add_kind = ADD_CUDA
    needs_cuda = True
    summary = "through CUDA memory (needs a GPU)"
    sender_class = CudaIpcSender
    receiver_class = CudaIpcReceiver
