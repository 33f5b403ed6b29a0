"""cuda-ipc without a GPU: the sender's holding by serial, the handle's row read back field by field;
the receiver's mapping needs a CUDA device (tests/test_e2e_mm_transports.py, where one is lent)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from harness.transports import TAKEN, cuda_ipc


def test_cuda_ipc_holds_each_tensor_by_serial_until_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda-ipc's holding without a GPU: ``share_cuda`` stands in (a CPU tensor, made-up handle bytes);
    its TAKEN entries carry fd 0, so a tensor is held under (0, its serial)."""

    def share_on_cpu(view: memoryview) -> tuple[torch.Tensor, cuda_ipc.CudaHandle]:
        handle = cuda_ipc.CudaHandle(0, b"h", view.nbytes, 0, b"c", 0, None, False, 0, view.nbytes)
        return torch.frombuffer(bytearray(view), dtype=torch.uint8), handle

    monkeypatch.setattr(cuda_ipc, "share_cuda", share_on_cpu)
    sender = cuda_ipc.CudaIpcSender(threshold=1024)
    frames = [b"body", np.zeros(5000, np.uint8), b"small", np.ones(2000, np.uint8)]
    message, held = asyncio.run(sender.message("r", frames))
    assert message[0][0] == cuda_ipc.ADD_CUDA
    rows = json.loads(message[1])
    assert [row[:3] for row in rows] == [[1, 1, 0], [3, 2, 0]] and sender.held_count == 2
    assert [cuda_ipc.CudaHandle.from_row(row[2:]).length for row in rows] == [5000, 2000]
    sender.released([["arena", 0, 1], [TAKEN, 0, 1]])  # another segment's entry frees nothing
    assert sender.held_count == 1
    sender.unsent(held)
    assert sender.held_count == 0
