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

import sys
import threading
from typing import Any, cast

from harness.processes.jsonl_records import JsonlRecorder

REQUEST_ENCODE, REQUEST_DECODE, OUTPUT_ENCODE, OUTPUT_DECODE = "rq", "rd", "oe", "od"
REQUEST_ADDED, OUTPUT_QUEUED = "ra", "oq"
REFUSED = "refused"


class Recorder(JsonlRecorder):
    """The plugin's record file in a vLLM process (``harness.processes.jsonl_records``: a deque append on
    the message path, written by a daemon thread, created new, owner-only, never through a link)."""

    @staticmethod
    def to_row(record: tuple[Any, ...]) -> list[Any]:
        return _row(record)

    @staticmethod
    def warn(why: str) -> None:
        warn_once(why)

    @classmethod
    def open(cls, folder: str, role: str, meta: dict[str, Any]) -> Recorder | None:
        return cast("Recorder | None", super().open(folder, role, meta))


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
