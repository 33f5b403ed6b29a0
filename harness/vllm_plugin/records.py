"""The plugin's timing records: written by each vLLM process, read back by ``bench run``.

One JSON Lines file a process, ``<folder>/<role>-<pid>.jsonl``, role ``api`` (vLLM's API server: it
encodes requests and decodes outputs) or ``engine`` (its EngineCore: decodes requests, encodes outputs).
The first line is ``["meta", {...}]`` (pid, role, codec, the host's clock id); then one array a message,
times in ns of CLOCK_MONOTONIC (one clock for both processes of a host); "cpu ns" is the thread's CPU
time over the call, null unless the process was asked to read it (``WIREBENCH_VLLM_CPU_TIME``):

  ["rq", external id, request id, start, end, cpu ns, bytes, frames]   API: a request encoded
  ["rd", external id, request id, start, end, cpu ns, bytes, frames]   engine: a request decoded
  ["oe", batch stamp, start, end, cpu ns, bytes, frames, [request ids]]  engine: an output batch encoded
  ["od", batch stamp, start, end, cpu ns, bytes, frames]               API: an output batch decoded
  ["ra", request id, added]     engine: the busy loop added a request to vLLM's scheduler (off the input queue)
  ["oq", batch stamp, queued]   engine: a step returned an output batch, which vLLM puts on the output queue
  ["refused", why]          the codec could not carry a message (vLLM answered its request 500), once a reason

The send follows the encode at once on the same thread, and the decode follows the receive, so
"sent" is the encode's end and "received" the decode's start. A batch is joined across the processes
by its stamp: the ``timestamp`` vLLM gives each ``EngineCoreOutputs`` (``time.monotonic()`` as a float),
which travels inside the message whatever the codec. "ra" and "oq" (``harness.vllm_plugin.queues``) are
joined to the engine's "rd" by request id and to its "oe" by stamp: the engine's input queue is a
request's "rd" end → its "ra", the output queue before encode a batch's "oq" → its "oe" start.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

REQUEST_ENCODE, REQUEST_DECODE, OUTPUT_ENCODE, OUTPUT_DECODE = "rq", "rd", "oe", "od"
REQUEST_ADDED, OUTPUT_QUEUED = "ra", "oq"
REFUSED = "refused"
FLUSH_S = 0.2
# A new file only (O_EXCL), never through a symbolic link (O_NOFOLLOW), closed in any child exec.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class Recorder:
    """Appends from the serializer's threads (a deque append: no lock, no I/O on the message path);
    a daemon thread writes them out every FLUSH_S, and once more at exit.

    The file is created new and owner-only, never through a link (a planted ``api-<pid>.jsonl`` symlink
    would otherwise get the records appended to its target). A file that cannot be made or written is
    said once on stderr and the records are dropped from then on: the messages go on untimed.
    """

    def __init__(self, folder: str, role: str, meta: dict[str, Any]) -> None:
        Path(folder).mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = Path(folder) / f"{role}-{os.getpid()}.jsonl"
        self.pending: collections.deque[tuple[Any, ...]] = collections.deque()
        fd = os.open(self.path, CREATE_FLAGS, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._lock = threading.Lock()  # the flusher thread and the exit hook
        self._write([["meta", {"pid": os.getpid(), "role": role, **meta}]])
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="wirebench-records", daemon=True).start()
        atexit.register(self.flush)

    @classmethod
    def open(cls, folder: str, role: str, meta: dict[str, Any]) -> Recorder | None:
        """A recorder, or None (said once) when its file cannot be made."""
        try:
            return cls(folder, role, meta)
        except OSError as exc:
            warn_once(f"cannot write timings in {folder}: {exc}; this process's messages go on untimed")
            return None

    def add(self, record: tuple[Any, ...]) -> None:
        self.pending.append(record)

    def flush(self) -> None:
        rows = []
        while self.pending:
            record = self.pending.popleft()
            try:
                rows.append(_row(record))
            except Exception as exc:  # a message laid out otherwise: that record lost, never the flushing
                warn_once(f"cannot write a {record[0]!r} record: {type(exc).__name__}: {exc}")
        if rows:
            self._write(rows)

    def _write(self, rows: list[Any]) -> None:
        with self._lock:
            if self._file.closed:
                return
            try:
                self._file.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
                self._file.flush()
            except OSError as exc:  # a full disk, a folder removed: the messages must not notice
                warn_once(f"cannot write timings to {self.path}: {exc}; this process's messages go on untimed")
                self.pending = collections.deque(maxlen=0)  # later appends are dropped at no cost
                self._stop.set()
                with contextlib.suppress(OSError):
                    self._file.close()

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self.flush()


class Recorders:
    """A process's recorder per role, made when the role's first message comes (``Recorder.open``); None
    when the records are off (no folder) or their file could not be made. The engine's output thread and
    its busy loop may both come first: a lock, so one file a role."""

    def __init__(self, folder: str | None, meta: dict[str, Any]) -> None:
        self.folder, self.meta = folder, meta
        self._made: dict[str, Recorder | None] = {}
        self._lock = threading.Lock()

    def get(self, role: str) -> Recorder | None:
        if self.folder is None:
            return None
        with self._lock:
            if role not in self._made:
                self._made[role] = Recorder.open(self.folder, role, self.meta)
            return self._made[role]


_warned = False


def warn_once(why: str) -> None:
    """A problem with the records, on stderr (vLLM's log) once a process."""
    global _warned
    if not _warned:
        _warned = True
        print(f"wirebench plugin: {why}", file=sys.stderr, flush=True)


def _row(record: tuple[Any, ...]) -> list[Any]:
    """A record as written (the module's docstring), its message's names read here, off the message path:
    the message path stores (kind, the message or a batch's stamp, start, end, cpu, bytes, frames), or
    (kind, the message, its time) for the queues."""
    kind, ref, *times = record
    if kind == REFUSED:
        return [kind, ref]
    if kind in (REQUEST_ENCODE, REQUEST_DECODE):
        return [kind, ref.external_req_id or ref.request_id, ref.request_id, *times]
    if kind == OUTPUT_ENCODE:
        return [kind, ref.timestamp, *times, [o.request_id for o in ref.outputs]]
    if kind == REQUEST_ADDED:  # vLLM's own Request, as its scheduler got it
        return [kind, ref.request_id, *times]
    if kind == OUTPUT_QUEUED:
        return [kind, ref.timestamp, *times]
    return [kind, ref, *times]


def read_rows(path: Path, offset: int = 0) -> tuple[list[list[Any]], int]:
    """The complete lines of ``path`` from byte ``offset``, and the offset after the last of them."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end
