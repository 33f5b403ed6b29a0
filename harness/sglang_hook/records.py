"""The SGLang hook's timing records: one JSON Lines file a process, ``<folder>/<role>-<pid>.jsonl``.

Role is the process as SGLang titles it: ``tokenizer`` (the HTTP server and its TokenizerManager, the
process SGLang was started as), ``scheduler``, ``detokenizer`` (``sglang::scheduler``, ... with the
prefix dropped). The first line is ``["meta", {...}]`` (pid, role, ipc ``pickle`` or ``msgpack``, the
SGLang version, the clock); then one array a message, times in ns of CLOCK_MONOTONIC (one clock for
every process of a host):

  ["send", message type, request ids, start, encoded, end, bytes]   encode (start→encoded), then the
                                                                    ZeroMQ send (encoded→end)
  ["recv", message type, request ids, start, received, end, bytes]  the receive (start→received: it
                                                                    includes the wait for a blocking
                                                                    one), then decode (received→end)
  ["wrap", object type, null, start, start, end, 0]                 in msgpack mode, a field pickled
  ["unwrap", object type, null, start, start, end, 0]               into (out of) a PickleWrapper:
                                                                    part of the encode of the process's
                                                                    next send (the decode of its recv)

Request ids are the message's ``rid`` (a string, or a list in a batch) or ``rids``, null when it has
neither. Joined across processes by request id and message type, a message's wire time is the
receiver's ``received`` minus the sender's ``encoded``.

The file is created new (O_EXCL), owner-only, never through a symbolic link (O_NOFOLLOW), in a folder
made 0700, as harness/vllm_plugin/records.py makes its own. Records are appended to a deque on the
message path; a daemon thread writes them every FLUSH_S and once more at exit. A file that cannot be made
or written is said once on stderr and the messages go on untimed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any, cast

from harness.processes.jsonl_records import JsonlRecorder, read_rows

SEND, RECV = "send", "recv"
WRAP, UNWRAP = "wrap", "unwrap"  # the nested pickles of msgpack mode, timed apart from the socket calls
TITLE_PREFIX = "sglang::"
# The process SGLang was started as keeps its command line as its title.
MAIN_ROLE = "tokenizer"


def process_role() -> str:
    """This process's role from the title SGLang gives its subprocesses (``sglang::scheduler``, ...)."""
    try:
        import setproctitle

        title = setproctitle.getproctitle()
    except ImportError:
        title = ""
    if title.startswith(TITLE_PREFIX):
        return "".join(c if c.isalnum() or c in "_-" else "_" for c in title[len(TITLE_PREFIX) :])
    return MAIN_ROLE


class Recorder(JsonlRecorder):
    """The hook's record file in an SGLang process (``harness.processes.jsonl_records``)."""

    thread_name = "wirebench-sglang-records"

    @staticmethod
    def to_row(record: tuple[Any, ...]) -> list[Any]:
        return row(record)

    @staticmethod
    def warn(why: str) -> None:
        warn_once(why)

    def __init__(self, folder: str, role: str, meta: dict[str, Any]) -> None:
        super().__init__(folder, role, {"clock": "CLOCK_MONOTONIC", **meta})

    @classmethod
    def open(cls, folder: str, role: str, meta: dict[str, Any]) -> Recorder | None:
        return cast("Recorder | None", super().open(folder, role, meta))


def request_ids(message: Any) -> str | list[str] | None:
    """The request id(s) a message carries: ``rid`` (one, or a list in a batch), else ``rids``."""
    for name in ("rid", "rids"):
        value = getattr(message, name, None)
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple)):
            return [str(v) for v in value]
    return None


def row(record: tuple[Any, ...]) -> list[Any]:
    """A record as written; the message's names are read here, off the message path, which stores
    (kind, the message, start, middle, end, bytes)."""
    kind, message, *times = record
    return [kind, type(message).__name__, request_ids(message), *times]


_warned = False


def warn_once(why: str) -> None:
    """A problem with the records, on stderr (SGLang's log) once a process."""
    global _warned
    if not _warned:
        _warned = True
        print(f"wirebench sglang hook: {why}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Hop:
    """One message type between two processes, for one request: medians over its messages, in µs."""

    message: str
    sender: str
    receiver: str
    messages: int
    encode_us: float
    wire_us: float
    decode_us: float
    bytes: float


def read_folder(folder: Path) -> dict[str, list[list[Any]]]:
    """Each process's message rows (its meta line left out), by role."""
    found: dict[str, list[list[Any]]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        rows, _ = read_rows(path)
        if rows and rows[0][0] == "meta":
            found.setdefault(rows[0][1]["role"], []).extend(rows[1:])
    return found


def carries(row: list[Any], rid: str) -> bool:
    ids = row[2]
    return ids == rid or (isinstance(ids, list) and rid in ids)


def hops(folder: Path, rid: str) -> list[Hop]:
    """Every hop request ``rid`` took: each sent message paired with its receipt in the other process, in
    order (SGLang's links are ZeroMQ PUSH/PULL, which keep it); wire = received - encoded."""
    by_role = read_folder(folder)
    result = []
    for sender, rows in by_role.items():
        for message in dict.fromkeys(r[1] for r in rows if r[0] == SEND and carries(r, rid)):
            sends = [r for r in rows if r[0] == SEND and r[1] == message and carries(r, rid)]
            for receiver, theirs in by_role.items():
                recvs = [r for r in theirs if r[0] == RECV and r[1] == message and carries(r, rid)]
                if receiver == sender or not recvs:
                    continue
                pairs = list(zip(sends, recvs))
                result.append(
                    Hop(
                        message,
                        sender,
                        receiver,
                        len(pairs),
                        median([(s[4] - s[3]) / 1e3 for s, _ in pairs]),
                        median([(r[4] - s[4]) / 1e3 for s, r in pairs]),
                        median([(r[5] - r[4]) / 1e3 for _, r in pairs]),
                        median([s[6] for s, _ in pairs]),
                    )
                )
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.sglang_hook.records DIR RID``: the hops of one request, medians in µs."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m harness.sglang_hook.records DIR RID", file=sys.stderr)
        return 2
    found = hops(Path(args[0]), args[1])
    if not found:
        print(f"no message of request {args[1]} in {args[0]}", file=sys.stderr)
        return 1
    print(f"{'message':28} {'from → to':26} {'n':>3} {'encode':>8} {'wire':>9} {'decode':>8} {'bytes':>7}")
    for hop in found:
        route = f"{hop.sender} → {hop.receiver}"
        print(
            f"{hop.message:28} {route:26} {hop.messages:3d} {hop.encode_us:8.1f} {hop.wire_us:9.1f} "
            f"{hop.decode_us:8.1f} {hop.bytes:7.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
