"""torch-shm's sender and receiver in one process: built-in-place tensors travel without a copy, others are
copied once; the receiver maps the same memory; the sender drops a storage once it is reported taken
(as cuda-ipc's sender drops its tensors: the holding they share is harness.transports.base.HeldUntilTaken)."""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import torch

from harness.transports import Peer
from harness.transports.torch_shm import ADD_TORCH, TorchShmReceiver, TorchShmSender


def send(sender: TorchShmSender, frame: object) -> list:
    message, _ = asyncio.run(sender.message("r", [b"body", frame]))
    return message


def receive(message: list) -> tuple[memoryview, list]:
    taken: list = []
    body = TorchShmReceiver(Peer(os.getpid(), release=taken.append)).open(message[1:])
    return body[1], taken


def test_a_tensor_built_in_shared_memory_travels_without_a_copy_and_is_dropped_once_taken():
    sender = TorchShmSender(threshold=1024)
    (pixels,) = sender.tensors([(1, 3, 32, 32)], torch.float16)
    pixels.copy_(torch.rand(1, 3, 32, 32).half())
    message = send(sender, pixels.numpy())
    assert message[0][0] == ADD_TORCH and sender.zero_copy_bytes == pixels.nbytes
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
