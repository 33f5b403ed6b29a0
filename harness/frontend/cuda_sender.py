"""The frontend's side of ``cuda-ipc`` (harness.wire.cuda_ipc): big frames into CUDA tensors, held until taken."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from harness.frontend.shm_sender import add_message
from harness.wire import cuda_ipc, torch_shm, transport
from harness.wire.shm import DEFAULT_THRESHOLD


class CudaIpcSender:
    def __init__(self, threshold: int = DEFAULT_THRESHOLD) -> None:
        self.threshold = threshold
        self._serial = 0
        self._held: dict[int, Any] = {}  # serial → the CUDA tensor, until the engine reports it taken

    async def message(self, rid: str, frames: Sequence[Any], request: Any = None) -> tuple[list[Any], list[Any]]:
        table: list[list[Any]] = []
        out: list[Any] = [frames[0]]
        held: list[int] = []
        try:
            for i, frame in enumerate(frames[1:], start=1):
                view = memoryview(frame).cast("B")
                if view.nbytes < self.threshold:
                    out.append(frame)
                    continue
                self._serial += 1
                tensor, raw = await asyncio.to_thread(cuda_ipc.share_cuda, view)
                self._held[self._serial] = tensor
                held.append(self._serial)
                table.append([i, self._serial, raw.hex()])
                out.append(b"")
        except BaseException:
            self.unsent(held)
            raise
        return add_message(transport.ADD_CUDA, rid, table, frames, out), held

    def released(self, entries: Sequence[Sequence[Any]]) -> None:
        for segment, _fd, serial in entries:
            if segment == torch_shm.TAKEN:
                self._held.pop(int(serial), None)

    def unsent(self, held: Sequence[Any]) -> None:
        for serial in held:
            self._held.pop(serial, None)

    def close(self) -> None:
        self._held.clear()
