"""torch-shm's sender and receiver in one process: built-in-place tensors travel without a copy, others are
copied once; the receiver maps the same memory; the sender drops a storage once it is reported taken
(as cuda-ipc's sender drops its tensors: the holding they share is harness.frontend.taken_holds)."""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import pytest
import torch

from harness.engine import receivers
from harness.frontend.mm_senders import TorchShmSender
from harness.wire import zmq_link
from harness.wire.torch_shm import TAKEN


def send(sender: TorchShmSender, frame: object) -> list:
    message, _ = asyncio.run(sender.message("r", [b"body", frame]))
    return message


def receive(message: list) -> tuple[memoryview, list]:
    taken: list = []
    body = receivers.from_torch_shm(message[1:], lambda fd, serial: taken.append([TAKEN, fd, serial]), os.getpid())
    return body[1], taken


def test_a_tensor_built_in_shared_memory_travels_without_a_copy_and_is_dropped_once_taken():
    sender = TorchShmSender(threshold=1024)
    (pixels,) = sender.tensors([(1, 3, 32, 32)], torch.float16)
    pixels.copy_(torch.rand(1, 3, 32, 32).half())
    message = send(sender, pixels.numpy())
    assert message[0][0] == zmq_link.ADD_TORCH and sender.zero_copy_bytes == pixels.nbytes
    assert sender.copied_bytes == 0 and sender.held_count == 1
    view, taken = receive(message)
    assert bytes(view) == pixels.numpy().tobytes()
    pixels[0, 0, 0, 0] = 7.0  # one memory: the receiver sees the sender's writes
    assert np.frombuffer(view, dtype=np.float16)[0] == 7.0
    sender.released(taken)
    assert sender.held_count == 0


def test_any_other_big_frame_is_copied_into_a_storage_of_its_own():
    sender = TorchShmSender(threshold=1024)
    frame = np.arange(5000, dtype=np.uint8)
    message = send(sender, frame)
    (row,) = json.loads(message[1])
    assert row[0] == 1 and sender.copied_bytes == 5000 and sender.zero_copy_bytes == 0
    view, taken = receive(message)
    assert bytes(view) == frame.tobytes()
    sender.released(taken)
    assert sender.held_count == 0


def test_cuda_ipc_holds_each_tensor_by_serial_until_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda-ipc's holding without a GPU: ``share_cuda`` stands in (a CPU tensor, made-up handle bytes);
    its TAKEN entries carry fd 0, so a tensor is held under (0, its serial)."""
    from harness.frontend.cuda_sender import CudaIpcSender
    from harness.wire import cuda_ipc

    def share_on_cpu(view: memoryview) -> tuple[torch.Tensor, cuda_ipc.CudaHandle]:
        handle = cuda_ipc.CudaHandle(0, b"h", view.nbytes, 0, b"c", 0, None, False, 0, view.nbytes)
        return torch.frombuffer(bytearray(view), dtype=torch.uint8), handle

    monkeypatch.setattr(cuda_ipc, "share_cuda", share_on_cpu)
    sender = CudaIpcSender(threshold=1024)
    frames = [b"body", np.zeros(5000, np.uint8), b"small", np.ones(2000, np.uint8)]
    message, held = asyncio.run(sender.message("r", frames))
    assert message[0][0] == zmq_link.ADD_CUDA
    rows = json.loads(message[1])
    assert [row[:3] for row in rows] == [[1, 1, 0], [3, 2, 0]] and sender.held_count == 2
    assert [cuda_ipc.CudaHandle.from_row(row[2:]).length for row in rows] == [5000, 2000]
    sender.released([["arena", 0, 1], [TAKEN, 0, 1]])  # another segment's entry frees nothing
    assert sender.held_count == 1
    sender.unsent(held)
    assert sender.held_count == 0
