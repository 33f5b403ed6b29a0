"""ZeroMQ plumbing between frontend and engine: addresses, envelopes, counters.

Two one-way PUSH/PULL channels, both bound by the engine:
  input:  frontend PUSH -> engine PULL   (requests, aborts, shutdown)
  output: engine PUSH  -> frontend PULL  (step outputs, ready, heartbeats)

Every message is ``[envelope, *codec frames]``. The envelope is one byte of
message kind, followed for ADD by the request id in UTF-8, so the engine can
answer a request whose body it cannot decode with an error for that id.
Ready and heartbeat messages carry JSON bytes, not codec frames: they are not
part of what is being measured.
"""

from __future__ import annotations

import ipaddress
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq

from harness.messages import CodecStats
from wirecodecs import Frame

# Envelope kinds (first byte of frame 0).
ADD = 0x00
ABORT = 0x01
SHUTDOWN = 0x02
OUTPUTS = 0x10
READY = 0x11
HEARTBEAT = 0x12

# The engine's output thread sends a heartbeat when it has been quiet this
# long; the frontend declares the engine dead after HEARTBEAT_TIMEOUT_S of silence.
HEARTBEAT_INTERVAL_S = 0.25
HEARTBEAT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class EngineAddresses:
    input: str
    output: str
    # Private directory of the ipc sockets, removed at shutdown (None for tcp).
    ipc_dir: str | None = None

    @classmethod
    def private_ipc(cls) -> EngineAddresses:
        # mkdtemp creates the directory with mode 0700: other users can't connect.
        path = tempfile.mkdtemp(prefix="wirebench-")
        return cls(f"ipc://{path}/input", f"ipc://{path}/output", path)

    @classmethod
    def tcp(cls, host: str, port: int) -> EngineAddresses:
        """Input on ``port``, output on ``port + 1``."""
        host_part = f"[{host}]" if ":" in host else host
        return cls(f"tcp://{host_part}:{port}", f"tcp://{host_part}:{port + 1}")

    def cleanup(self) -> None:
        if self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)


def is_loopback(address: str) -> bool:
    """True for ipc/inproc addresses and tcp to a loopback host."""
    parts = urlsplit(address)
    if parts.scheme in ("ipc", "inproc"):
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def frames_nbytes(frames: Sequence[Frame]) -> int:
    total = 0
    for frame in frames:
        total += frame.buffer.nbytes if isinstance(frame, zmq.Frame) else memoryview(frame).nbytes
    return total


class CodecCounters:
    """Cumulative codec timings of one process side, as a CodecStats snapshot.

    Updated from one thread per direction (encode from one, decode from
    another); plain int adds under the GIL are enough.
    """

    def __init__(self) -> None:
        self.stats = CodecStats()

    def add_encode(self, started_ns: int, frames: Sequence[Frame]) -> None:
        s = self.stats
        s.encode_ns += time.perf_counter_ns() - started_ns
        s.encode_count += 1
        s.encode_bytes += frames_nbytes(frames)
        s.encode_frames += len(frames)

    def add_decode(self, started_ns: int, frames: Sequence[Frame]) -> None:
        s = self.stats
        s.decode_ns += time.perf_counter_ns() - started_ns
        s.decode_count += 1
        s.decode_bytes += frames_nbytes(frames)
        s.decode_frames += len(frames)

    def snapshot(self) -> CodecStats:
        s = self.stats
        return CodecStats(
            s.decode_count,
            s.decode_ns,
            s.decode_bytes,
            s.decode_frames,
            s.encode_count,
            s.encode_ns,
            s.encode_bytes,
            s.encode_frames,
        )


def envelope(kind: int, request_id: str | None = None) -> bytes:
    head = bytes((kind,))
    return head + request_id.encode() if request_id else head


def open_envelope(frame: Frame) -> tuple[int, str | None]:
    """(kind, request id or None); raises ValueError on an empty or non-UTF-8 envelope."""
    raw = frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)
    if not raw:
        raise ValueError("empty envelope frame")
    return raw[0], (raw[1:].decode() if len(raw) > 1 else None)
