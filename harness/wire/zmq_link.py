"""ZeroMQ plumbing between frontend and engine: addresses, envelopes, counters.

Two one-way PUSH/PULL channels, both bound by the engine:
  input:  frontend PUSH -> engine PULL   (requests, aborts, shutdown)
  output: engine PUSH  -> frontend PULL  (step outputs, ready, heartbeats)

Every message is ``[envelope, *codec frames]``. The envelope is one byte of
message kind, followed for ADD by the request id in UTF-8, so the engine can
answer a request whose body it cannot decode with an error for that id, and
for OUTPUTS by the batch's sequence number (8 bytes, little endian), which
joins the two processes' timestamps of a batch (``harness.wire.spans``). Ready,
heartbeat and spans messages carry JSON bytes, not codec frames: they are not
part of what is being measured.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import zmq

from harness.wire.curve import CurveKeys
from harness.wire.messages import CodecStats
from wirecodecs import Frame

# Envelope kinds (first byte of frame 0).
ADD = 0x00
ABORT = 0x01
SHUTDOWN = 0x02
OUTPUTS = 0x10
READY = 0x11
HEARTBEAT = 0x12
SPANS = 0x13  # the engine's timestamps (harness.wire.spans), JSON
RELEASE = 0x14  # what the engine's transport receiver is done with, JSON (harness.transports)
# Flag on an ADD kind, plain or out-of-band: the message's last frame is the request's digest
# (--verify, harness.wire.integrity).
VERIFIED = 0x80

# The kinds of an ADD whose frame 1 is a JSON table of frames that travel apart: each transport but zmq
# takes one (harness.transports: shm 0x03, torch-shm 0x04, cuda-ipc 0x05), and its engine no other.
OUT_OF_BAND_ADDS = range(0x03, 0x10)


# The engine's output thread sends a heartbeat when it has been quiet this
# long; the frontend calls the engine stalled after STALL_TIMEOUT_S of silence
# (bench serve --engine-stall-timeout) and takes it back when it answers again.
HEARTBEAT_INTERVAL_S = 0.25
STALL_TIMEOUT_S = 2.0


IPC_PREFIX = "wirebench-"


@dataclass(frozen=True)
class EngineAddresses:
    input: str
    output: str
    # Private directory of the ipc sockets, removed at shutdown (None for tcp).
    ipc_dir: str | None = None
    # CURVE keys of an authenticated tcp link (harness.wire.curve); None: unauthenticated.
    curve: CurveKeys | None = None
    # The spawning frontend's shared-memory segment (its transport sender's, if any): the only one the
    # engine maps, and one a spawned engine whose frontend was killed removes, with the ipc directory.
    frontend_segment: str | None = None
    # The transport whose out-of-band ADDs the engine takes (any other kind is refused), and the pid of the
    # frontend that spawned it: the one process whose memory it maps (None: an engine started on its own,
    # which takes frames in the message only).
    transport: str = "zmq"
    frontend_pid: int | None = None

    @classmethod
    def private_ipc(cls) -> EngineAddresses:
        # mkdtemp creates the directory with mode 0700: other users can't connect.
        # The pid in its name lets a later start remove it if this process dies unclean.
        path = tempfile.mkdtemp(prefix=f"{IPC_PREFIX}{os.getpid()}-")
        return cls(f"ipc://{path}/input", f"ipc://{path}/output", path)

    @classmethod
    def tcp(cls, host: str, port: int, curve: CurveKeys | None = None) -> EngineAddresses:
        """Input on ``port``, output on ``port + 1``."""
        host_part = f"[{host}]" if ":" in host else host
        return cls(f"tcp://{host_part}:{port}", f"tcp://{host_part}:{port + 1}", curve=curve)

    @property
    def authenticated(self) -> bool:
        return self.curve is not None

    def cleanup(self) -> None:
        if self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)


def prepare_socket(sock: zmq.Socket, address: str) -> None:
    """Options every link socket needs: IPv6 for a bracketed tcp host (ZeroMQ has it off by default)."""
    if address.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)


def remove_stale_ipc_dirs() -> list[tuple[str, int]]:
    """Remove this user's ipc socket directories whose creating process is gone (killed: it could not clean
    up); (the directory, the dead process's pid) of each."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{IPC_PREFIX}*"):
        pid_text = path.name[len(IPC_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or not path.is_dir() or path.stat().st_uid != os.getuid():
            continue
        if not _pid_alive(int(pid_text)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append((str(path), int(pid_text)))
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


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


def sender_pid(frame: zmq.Frame) -> int | None:
    """The pid of the process that sent ``frame`` over an ipc link, as the kernel tells it, not as the
    message says: ZeroMQ's Peer-Address of a unix socket is ``host:uid:gid:pid`` (SO_PEERCRED). Only for
    ipc: over tcp the address is the peer's IP, which says nothing of its process."""
    try:
        address = frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):  # a frame without metadata (copied, or built here)
        return None
    parts = str(address).rsplit(":", 3)
    return int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else None


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

    def add_encode(self, clock: CodecClock, frames: Sequence[Frame], adapt_ns: int = 0) -> None:
        s = self.stats
        s.encode_adapt_ns += adapt_ns
        s.encode_ns += clock.wall_ns
        s.encode_cpu_ns += clock.cpu_ns
        s.encode_count += 1
        s.encode_bytes += frames_nbytes(frames)
        s.encode_frames += len(frames)

    def add_decode(self, clock: CodecClock, frames: Sequence[Frame], adapt_ns: int = 0) -> None:
        s = self.stats
        s.decode_adapt_ns += adapt_ns
        s.decode_ns += clock.wall_ns
        s.decode_cpu_ns += clock.cpu_ns
        s.decode_count += 1
        s.decode_bytes += frames_nbytes(frames)
        s.decode_frames += len(frames)

    def snapshot(self) -> CodecStats:
        return msgspec.structs.replace(self.stats)


class CodecClock:
    """Wall and CPU time of one codec call: ``start()`` before it, ``stop()`` after.

    Wall is CLOCK_MONOTONIC (``time.monotonic_ns``, one clock for both
    processes on a host, so spans can join); CPU is this thread's
    (``time.thread_time_ns``): the two differ by what the thread waited for.
    """

    __slots__ = ("start_ns", "end_ns", "cpu_start", "cpu_ns")

    def __init__(self) -> None:
        self.start_ns = self.end_ns = self.cpu_start = self.cpu_ns = 0

    def start(self) -> CodecClock:
        self.cpu_start = time.thread_time_ns()
        self.start_ns = time.monotonic_ns()
        return self

    def stop(self) -> CodecClock:
        self.end_ns = time.monotonic_ns()
        self.cpu_ns = time.thread_time_ns() - self.cpu_start
        return self

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns


def envelope(kind: int, request_id: str | None = None) -> bytes:
    head = bytes((kind,))
    return head + request_id.encode() if request_id else head


def output_envelope(seq: int, verified: bool = False) -> bytes:
    return bytes((OUTPUTS | (VERIFIED if verified else 0),)) + seq.to_bytes(8, "little")


def frame_bytes(frame: Frame) -> bytes:
    """A received frame's bytes, whether ZeroMQ handed a Frame (copy=False) or a buffer."""
    return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)


def output_seq(frame: Frame) -> int:
    """The batch sequence number of an OUTPUTS envelope (-1 when it carries none)."""
    raw = frame_bytes(frame)
    return int.from_bytes(raw[1:9], "little") if len(raw) == 9 else -1


def open_envelope(frame: Frame) -> tuple[int, str | None]:
    """(kind, request id or None); raises ValueError on an empty or non-UTF-8 envelope.

    A VERIFIED flag stays on the kind (test it with ``& VERIFIED``)."""
    raw = frame_bytes(frame)
    if not raw:
        raise ValueError("empty envelope frame")
    if raw[0] & ~VERIFIED in (OUTPUTS, RELEASE):
        return raw[0], None
    return raw[0], (raw[1:].decode() if len(raw) > 1 else None)
