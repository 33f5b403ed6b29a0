"""The engine's side of the out-of-band transports: who may send an ADD whose big frames travel apart,
and a message's table of handles → codec frames.

Frame 0 of the body is a JSON table, one row per big frame: its index in the body and its handle. An
engine maps memory only for the transport it serves and only of the frontend that spawned it
(``check_sender``): over ipc the kernel names each message's sending process, over tcp only CURVE's
authenticated frontend connects. Every handle of an accepted message is reported taken
(``taken(fd or 0, serial)``) once it is mapped, or once it failed to map: either way its sender may
drop what it held for it (harness.wire.torch_shm's lifetime rules).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import zmq

from harness.wire import zmq_link
from harness.wire.cuda_ipc import CudaHandle
from harness.wire.torch_shm import TorchHandle, TorchShmError, open_handle
from harness.wire.zmq_link import EngineAddresses

Taken = Callable[[int, int], None]
_KIND_NAMES = {zmq_link.ADD_SHM: "shm", zmq_link.ADD_TORCH: "torch-shm", zmq_link.ADD_CUDA: "cuda-ipc"}


class RefusedSender(ValueError):
    """An out-of-band ADD this engine does not open: not its transport's, or not from its frontend."""


def check_sender(kind: int, envelope: Any, link: EngineAddresses) -> None:
    """Refuse (RefusedSender) an out-of-band ADD of a kind this engine's transport does not send, or from
    any process but the frontend that spawned it: its handles name memory this engine would map."""
    if zmq_link.OUT_OF_BAND_KIND.get(link.transport) != kind:
        raise RefusedSender(
            f"a {_KIND_NAMES.get(kind, hex(kind))} message, but this engine serves --transport {link.transport}"
        )
    if link.frontend_pid is None:
        raise RefusedSender("only an engine its frontend spawned maps the frontend's memory")
    if link.input.startswith("ipc://"):
        pid = zmq_link.sender_pid(envelope) if isinstance(envelope, zmq.Frame) else None
        if pid != link.frontend_pid:
            raise RefusedSender(f"sent by process {pid}, not by this engine's frontend ({link.frontend_pid})")
    elif not link.authenticated:  # refused at start (harness.wire.policy); never trusted here either
        raise RefusedSender("an unauthenticated tcp link cannot tell the frontend from any other process")


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


def from_torch_shm(frames: list[Any], taken: Taken, owner: int) -> list[Any]:
    """Each row [index, pid, fd, length, inode, serial] becomes a view on the sender's storage; a handle
    into any process but ``owner`` (the sender the link names) is refused, none of the message opened."""
    rows, body = table(frames)
    handles = [TorchHandle.from_list(row[1:]) for row in rows]
    try:
        strangers = {h.pid for h in handles} - {owner}
        if strangers:
            raise TorchShmError(f"a torch-shm handle names process {min(strangers)}, not the sender ({owner})")
        for row, handle in zip(rows, handles, strict=True):
            body[row[0]] = open_handle(handle)
    finally:
        for handle in handles:
            taken(handle.fd, handle.serial)
    return body


def from_cuda_ipc(frames: list[Any], taken: Taken) -> list[Any]:
    """Each row [index, serial, *handle] (harness.wire.cuda_ipc.CudaHandle: plain numbers and hex) becomes
    the CUDA tensor's bytes, copied to host memory for the codec."""
    from harness.wire.cuda_ipc import open_cuda_handle

    rows, body = table(frames, "cuda-ipc")
    try:
        handles = [(row[0], CudaHandle.from_row(row[2:])) for row in rows]
        for index, handle in handles:
            body[index] = open_cuda_handle(handle)
    finally:
        for row in rows:
            if len(row) > 1 and isinstance(row[1], int):
                taken(0, row[1])
    return body
