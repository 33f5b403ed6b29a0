"""A process's timing records written as JSON Lines, off the message path: what the hooks wirebench puts
inside real servers (``harness.vllm_plugin``, ``harness.sglang_hook``) share.

A record is appended to a deque on the message path (no lock, no I/O); a daemon thread turns records into
rows and writes them every FLUSH_S, and once more at exit. The file, ``<folder>/<role>-<pid>.jsonl``, is
created new and owner-only in a folder made 0700, never through a symbolic link (a planted
``<role>-<pid>.jsonl`` symlink would otherwise get the records appended to its target). A file that cannot
be made or written is said once and the records are dropped from then on: the messages go on untimed.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

FLUSH_S = 0.2
# A new file only (O_EXCL), never through a symbolic link (O_NOFOLLOW), closed in any child exec.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class JsonlRecorder:
    """One process's record file. A hook subclasses it with its ``to_row`` (a record as written, its
    message's names read here, off the message path) and its ``warn`` (one line in the server's log)."""

    thread_name = "wirebench-records"

    @staticmethod
    def to_row(record: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    @staticmethod
    def warn(why: str) -> None:
        raise NotImplementedError

    def __init__(self, folder: str, role: str, meta: dict[str, Any]) -> None:
        Path(folder).mkdir(mode=0o700, parents=True, exist_ok=True)
        self.pid = os.getpid()
        self.path = Path(folder) / f"{role}-{self.pid}.jsonl"
        self.pending: collections.deque[tuple[Any, ...]] = collections.deque()
        fd = os.open(self.path, CREATE_FLAGS, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._lock = threading.Lock()  # the flusher thread and the exit hook
        self._write([["meta", {"pid": self.pid, "role": role, **meta}]])
        self._stop = threading.Event()
        threading.Thread(target=self._run, name=self.thread_name, daemon=True).start()
        atexit.register(self.flush)

    @classmethod
    def open(cls, folder: str, role: str, meta: dict[str, Any]) -> JsonlRecorder | None:
        """A recorder, or None (said once) when its file cannot be made."""
        try:
            return cls(folder, role, meta)
        except OSError as exc:
            cls.warn(f"cannot write timings in {folder}: {exc}; this process's messages go on untimed")
            return None

    def add(self, record: tuple[Any, ...]) -> None:
        self.pending.append(record)

    def flush(self) -> None:
        rows = []
        while self.pending:
            record = self.pending.popleft()
            try:
                rows.append(self.to_row(record))
            except Exception as exc:  # a message laid out otherwise: that record lost, never the flushing
                self.warn(f"cannot write a {record[0]!r} record: {type(exc).__name__}: {exc}")
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
                self.warn(f"cannot write timings to {self.path}: {exc}; this process's messages go on untimed")
                self.pending = collections.deque(maxlen=0)  # later appends are dropped at no cost
                self._stop.set()
                with contextlib.suppress(OSError):
                    self._file.close()

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self.flush()


def read_rows(path: Path, offset: int = 0) -> tuple[list[list[Any]], int]:
    """The complete lines of ``path`` from byte ``offset``, and the offset after the last of them."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end


class RecordFolder:
    """A folder of such files, one a process of one server, as the run reads it back: the files, where
    each ends (a cursor: the run's rows are the ones after), each file's meta line."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("*.jsonl")) if self.folder.is_dir() else []

    def cursor(self) -> dict[str, int]:
        """Where each file ends now: the run's rows are the ones after."""
        return {str(p): p.stat().st_size for p in self.files()}

    def metas(self) -> dict[Path, dict[str, Any]]:
        """Each file's meta line (``["meta", {...}]``, its first), by file; a file without one left out."""
        out = {}
        for path in self.files():
            with open(path, "rb") as f:
                first = json.loads(f.readline() or b"null")
            if isinstance(first, list) and first and first[0] == "meta":
                out[path] = first[1]
        return out

    def roles(self) -> dict[str, dict[str, Any]]:
        """The processes that wrote here: role → its meta line (pid, clock, the codec or IPC mode)."""
        return {meta["role"]: meta for meta in self.metas().values()}
