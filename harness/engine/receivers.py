"""The engine's side of the torch-shm and cuda-ipc transports: a message's table of handles → codec frames.

Frame 0 of the body is a JSON table, one row per big frame: its index in the body and its handle.
Every handle is reported taken (``taken(fd or 0, serial)``) once it is mapped, or once it failed to
map: either way its sender may drop what it held for it (harness.wire.torch_shm's lifetime rules).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import zmq

from harness.wire.torch_shm import TorchHandle, open_handle

Taken = Callable[[int, int], None]


def table(frames: list[Any], what: str = "out-of-band") -> tuple[list[Any], list[Any]]:
    """A message's table of rows [index, *handle] (checked: each names a codec frame) and its codec
    frames, the named ones still to be replaced; ``what`` names the transport in errors."""
    rows = json.loads(frames[0].bytes if isinstance(frames[0], zmq.Frame) else frames[0])
    if not isinstance(rows, list) or not all(isinstance(row, list) and row for row in rows):
        raise ValueError(f"the {what} table is not a list of rows")
    body = list(frames[1:])
    for row in rows:
        if not (isinstance(row[0], int) and 1 <= row[0] < len(body)):
            raise ValueError(f"the {what} table names frame {row[0]!r} of {len(body)}")
    return rows, body


def from_torch_shm(frames: list[Any], taken: Taken) -> list[Any]:
    """Each row [index, pid, fd, length, inode, serial] becomes a view on the sender's storage."""
    rows, body = table(frames)
    handles = [TorchHandle.from_list(row[1:]) for row in rows]
    try:
        for row, handle in zip(rows, handles, strict=True):
            body[row[0]] = open_handle(handle)
    finally:
        for handle in handles:
            taken(handle.fd, handle.serial)
    return body


def from_cuda_ipc(frames: list[Any], taken: Taken) -> list[Any]:
    """Each row [index, serial, pickled handle (hex)] becomes the CUDA tensor's bytes, copied to host memory
    for the codec. The pickle is torch's CUDA IPC reduction, from our own frontend over a private link."""
    from harness.wire.cuda_ipc import open_cuda_handle

    rows, body = table(frames)
    try:
        for index, _serial, raw in rows:
            body[index] = open_cuda_handle(bytes.fromhex(raw))
    finally:
        for row in rows:
            taken(0, int(row[1]))
    return body
