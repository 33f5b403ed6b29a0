"""The frontend's side of ``cuda-ipc`` (harness.wire.cuda_ipc): big frames into CUDA tensors, held until taken."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from harness.frontend.shm_sender import add_message
from harness.frontend.taken_holds import HeldUntilTaken
from harness.wire import cuda_ipc, zmq_link
from harness.wire.shm import DEFAULT_THRESHOLD


class CudaIpcSender(HeldUntilTaken):
    """Each big frame copied into a CUDA tensor, held as (0, serial) until the engine reports it taken."""

    def __init__(self, threshold: int = DEFAULT_THRESHOLD) -> None:
        super().__init__()
        self.threshold = threshold

    async def message(self, rid: str, frames: Sequence[Any], request: Any = None) -> tuple[list[Any], list[Any]]:
        table: list[list[Any]] = []
        out: list[Any] = [frames[0]]
        held: list[Any] = []
        try:
            for i, frame in enumerate(frames[1:], start=1):
                view = memoryview(frame).cast("B")
                if view.nbytes < self.threshold:
                    out.append(frame)
                    continue
                serial = self._next_serial()
                tensor, handle = await asyncio.to_thread(cuda_ipc.share_cuda, view)
                self._hold((0, serial), tensor, held)  # a CUDA handle has no fd: its TAKEN entry carries 0
                table.append([i, serial, *handle.to_row()])
                out.append(b"")
        except BaseException:
            self.unsent(held)
            raise
        return add_message(zmq_link.ADD_CUDA, rid, table, frames, out), held
