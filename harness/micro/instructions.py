"""Instructions per codec call, counted by valgrind's callgrind: a figure that repeats whatever else
the machine is doing, for CI gates on shared runners whose wall clock moves with the neighbours
(SQLite and iai-callgrind do the same).

Each count runs a child Python under ``valgrind --tool=callgrind --collect-atstart=no
--toggle-collect=functools_reduce``: the child builds the payload, warms the call up, then
runs ``functools.reduce`` over N calls. Only instructions executed inside that one C
function are collected, so interpreter start, imports and payload building are left out.
A second child runs the same loop over a call that does nothing; the difference over N
is the codec call's own count. Text and output payloads build without torch, so their
children never import it (under callgrind that import alone takes about a minute).

One count depends, by up to ±0.7%, on incidental interpreter state: a child that made a
few more classes before importing the codecs (as any unrelated code change does) counts
differently, because CPython's method cache is indexed by type version tags and name
addresses and its collisions move. Measured on msgspec-b64's text-550 decode: 12 such
shifts ranged over 0.9%, most within ±0.02% of one value. So each cell is counted under
``LAYOUT_SHIFTS`` (the child first makes that many throwaway classes) and the median kept;
a cell's children run at once. ``layouts(n)`` takes the first n of them (``bench
micro --layouts N``: fewer children, a count that may move by that spread, for a quick rehearsal
such as the tests').
"""

from __future__ import annotations

import functools
import gc
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

OPS = ("encode", "decode")
# "path": one message's whole trip in one thread: encode, its envelope and frames through a ZeroMQ
# inproc PUSH/PULL pair as the frontend sends them (copy=False), receive (copy=False), decode: the
# codec and the socket library's own work, without the kernel's (inproc has no I/O thread).
ALL_OPS = (*OPS, "path")
# Codecs whose import alone outlasts a child's 10 minutes under callgrind (vLLM imports most of itself).
UNCOUNTABLE = {"vllm": "its import alone takes over 10 minutes under callgrind"}
TOGGLE = "functools_reduce"  # the C function whose inside is counted (CPython's _functools.reduce)
DEFAULT_CALLS = 200
LAYOUT_SHIFTS = (3, 17, 41)  # throwaway classes made before the import, one count each: the median is kept
_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.M)


class CountError(RuntimeError):
    """Instructions could not be counted (no valgrind, the child failed)."""


class Unsupported(CountError):
    """The codec cannot carry the payload (msgspec and an image): a cell with no count, not a failure."""


UNSUPPORTED_EXIT = 3  # the child's exit code when the codec refuses the payload


@dataclass(frozen=True)
class InstructionCount:
    codec: str
    payload: str
    op: str  # encode | decode
    calls: int
    per_call: float  # instructions of one call, the empty loop's subtracted: the median over layouts
    per_layout: tuple[float, ...] = ()  # the count under each layout shift counted (LAYOUT_SHIFTS)


def valgrind() -> str | None:
    """The valgrind binary, or None (Debian: apt-get install -y valgrind)."""
    return shutil.which("valgrind")


def count_loop(codec: str, payload: str, op: str, calls: int, shift: int = 0) -> int:
    """Instructions collected inside the child's reduce over ``calls`` calls of ``op`` ('noop' for none)."""
    binary = valgrind()
    if binary is None:
        raise CountError("valgrind is not installed (Debian: apt-get install -y valgrind)")
    # Not /tmp/wirebench-*: that pattern names a server's ipc directories.
    with tempfile.TemporaryDirectory(prefix="callgrind-wb-") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            binary,
            "--tool=callgrind",
            "--collect-atstart=no",
            f"--toggle-collect={TOGGLE}",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "harness.micro.instructions",
            codec,
            payload,
            op,
            str(calls),
            str(shift),
        ]
        # A fixed hash seed: dict and set layouts (and so the instructions walking them) repeat. No
        # bytecode written: a child that compiled a module moves the layout of the counts beside it.
        env = {"PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode == UNSUPPORTED_EXIT:
            raise Unsupported(done.stdout.strip())
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise CountError(f"callgrind child failed ({done.returncode}): {' / '.join(tail)}")
        match = _TOTAL.search(out.read_text())
        if match is None:
            raise CountError("no total in callgrind's output")
        return int(match.group(1))


def layouts(n: int = len(LAYOUT_SHIFTS)) -> tuple[int, ...]:
    """The first ``n`` of LAYOUT_SHIFTS (all of them by default): each is one more child per cell."""
    if not 1 <= n <= len(LAYOUT_SHIFTS):
        raise ValueError(f"layouts must be 1 to {len(LAYOUT_SHIFTS)}, got {n}")
    return LAYOUT_SHIFTS[:n]


def count(
    codec: str,
    payload: str,
    op: str,
    calls: int = DEFAULT_CALLS,
    empty: int | None = None,
    shifts: Sequence[int] = LAYOUT_SHIFTS,
) -> InstructionCount:
    """One codec call's instructions: (the loop over ``calls`` calls − the same loop doing nothing) / calls,
    the median over ``shifts`` (one child each). ``empty``: the empty loop's count when already known
    (it depends on neither codec nor payload)."""
    if op not in ALL_OPS:
        raise ValueError(f"op must be one of {ALL_OPS}, got {op!r}")
    if not shifts:
        raise ValueError("at least one layout shift is needed")
    _compile_sources()
    with _children(len(shifts) + 1) as pool:
        return _count(pool, codec, payload, op, calls, _empty(pool, codec, payload, calls, empty), shifts)


def count_cells(
    codecs: Sequence[str],
    payloads: Sequence[str],
    calls: int = DEFAULT_CALLS,
    shifts: Sequence[int] = LAYOUT_SHIFTS,
    ops: Sequence[str] = OPS,
) -> Iterator[InstructionCount]:
    """Every codec × payload × op, the empty loop counted once (beside the first cell); a cell the codec
    cannot carry is skipped (its child fails with the codec's refusal: CountError names it)."""
    if unknown := [op for op in ops if op not in ALL_OPS]:
        raise ValueError(f"unknown op {', '.join(unknown)}: choose from {', '.join(ALL_OPS)}")
    if not shifts:
        raise ValueError("at least one layout shift is needed")
    _compile_sources()
    with _children(len(shifts) + 1) as pool:
        empty = _empty(pool, codecs[0], payloads[0], calls, None)
        for payload in payloads:
            for codec in codecs:
                for op in ops:
                    try:
                        yield _count(pool, codec, payload, op, calls, empty, shifts)
                    except Unsupported:
                        break  # the codec refuses this payload: no encode, no decode


# A cell's children (one a layout, and the empty loop beside the first cell) run at once: each counts
# only its own instructions, whatever runs beside it. concurrent.futures is imported in these functions,
# not at the top: the child imports this module, and what it imports moves its layout.


def _compile_sources() -> None:
    """Bytecode of wirebench's own modules, written once before any child runs, so every child loads
    them the same way. Without it, in a fresh checkout (or where PYTHONDONTWRITEBYTECODE is set) the
    children compiled the modules themselves, some from source and some from a sibling's bytecode,
    and one count moved 2.7% between two runs of the same code. A read-only checkout stays as it is
    (every child then compiles from source, the same way each time)."""
    import compileall

    import harness
    import wirecodecs

    for package in (harness, wirecodecs):
        compileall.compile_dir(str(Path(str(package.__file__)).parent), quiet=2)


def _children(n: int) -> ThreadPoolExecutor:
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=n, thread_name_prefix="callgrind")


def _empty(pool: ThreadPoolExecutor, codec: str, payload: str, calls: int, known: int | None) -> Future[int]:
    if known is not None:
        from concurrent.futures import Future

        done: Future[int] = Future()
        done.set_result(known)
        return done
    return pool.submit(count_loop, codec, payload, "noop", calls)


def _count(
    pool: ThreadPoolExecutor, codec: str, payload: str, op: str, calls: int, empty: Future[int], shifts: Sequence[int]
) -> InstructionCount:
    loops = [pool.submit(count_loop, codec, payload, op, calls, shift) for shift in shifts]
    try:
        nothing = empty.result()
    except Unsupported as exc:  # the empty loop's codec refuses its payload: no cell can be counted
        raise CountError(str(exc)) from exc
    per_layout = tuple((f.result() - nothing) / calls for f in loops)
    return InstructionCount(codec, payload, op, calls, statistics.median(per_layout), per_layout)


def valgrind_version() -> str:
    binary = valgrind()
    if binary is None:
        return ""
    return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()


def _child(codec_name: str, payload: str, op: str, calls: int, shift: int) -> None:
    """Runs under callgrind: everything before the reduce is not counted. ``shift`` throwaway classes
    (each given a version tag) move the interpreter's incidental layout before anything is imported."""
    shifted = [type(f"Shift{i}", (), {"tag": i}) for i in range(shift)]
    for cls in shifted:
        _ = cls.tag  # type: ignore[attr-defined]
    import wirecodecs
    from harness.micro.payloads import PAYLOADS
    from harness.wire.messages import EngineCoreOutputs, EngineCoreRequest

    codec = wirecodecs.get_codec(codec_name)
    msg = PAYLOADS[payload]()
    msg_type: Any = EngineCoreOutputs if isinstance(msg, EngineCoreOutputs) else EngineCoreRequest
    try:
        frames = codec.encode(msg)
    except wirecodecs.UnsupportedPayloadError as exc:
        print(f"{codec_name} cannot carry {payload}: {exc}")
        sys.exit(UNSUPPORTED_EXIT)
    calls_of = {
        "encode": lambda _acc, _i: codec.encode(msg),
        "decode": lambda _acc, _i: codec.decode(frames, msg_type),
        "noop": lambda _acc, _i: None,
    }
    # Only a path child imports pyzmq: what a child imports moves its layout, and so its counts.
    step = _path_call(codec, msg, msg_type) if op == "path" else calls_of[op]
    for i in range(5):  # warm up: caches, lazily built encoders, first allocations
        step(None, i)
        (calls_of["encode"] if op == "noop" else step)(None, i)
    gc.collect()
    gc.disable()  # a collection's cost lands on whichever call crosses the threshold: not the codec's
    functools.reduce(step, range(calls), None)


def _path_call(codec: Any, msg: Any, msg_type: Any) -> Any:
    """The "path" op's call: encode, send over an inproc pair as the frontend does, receive, decode."""
    import zmq

    from harness.wire import zmq_link

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("inproc://wirebench-path")
    push.connect("inproc://wirebench-path")
    is_request = msg_type.__name__ == "EngineCoreRequest"
    head = zmq_link.envelope(zmq_link.ADD, "r0") if is_request else zmq_link.output_envelope(0)

    def call(_acc: Any, _i: int) -> Any:
        push.send_multipart([head, *codec.encode(msg)], copy=False)
        frames = pull.recv_multipart(copy=False)
        zmq_link.open_envelope(frames[0])
        return codec.decode(frames[1:], msg_type)

    return call


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
