"""Times every message SGLang's processes send each other, per message, in each process.

Every hop (TokenizerManager → Scheduler → DetokenizerManager → TokenizerManager) goes through
``sglang.srt.managers.io_struct``'s ``sock_send`` / ``sock_recv`` and their async forms, and the other
modules import them by name. So the hook waits for io_struct to be executed (an import hook on that one
module) and rebinds the four names in it before any importer binds them, to timed functions that do what
SGLang's do, in two steps each so encode and decode are timed apart from the socket:

- send: encode (``pickle.dumps`` at the highest protocol, what pyzmq's ``send_pyobj`` does, or io_struct's
  own ``msgpack_encode``), then ``socket.send``;
- receive: ``socket.recv``, then decode (``pickle.loads``, what ``recv_pyobj`` does, or io_struct's own
  ``msgpack_decode``).

Which of the two is read from io_struct's ``_USE_PICKLE_IPC`` at each call, as SGLang's own functions
do (SGLang sets it once at import from ``SGLANG_USE_PICKLE_IPC``). A call that raises (a non-blocking
receive with nothing waiting raises ``zmq.Again``) is not recorded. The records: :mod:`.records`.

An io_struct without the names the hook replaces and reads is refused at import with one line naming
what is missing, rather than serving untimed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import pickle
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

from harness.sglang_hook.records import RECV, SEND, UNWRAP, WRAP, Recorder, process_role

IO_STRUCT = "sglang.srt.managers.io_struct"
REPLACED = ("sock_send", "sock_recv", "async_sock_send", "async_sock_recv")
READ = ("_USE_PICKLE_IPC", "msgpack_encode", "msgpack_decode")
# In msgpack mode the fields msgspec cannot type (per-request time stats, customized info) are pickled into
# a PickleWrapper before the send and out of it after the receive, outside the four functions above; timed
# where io_struct has them, so msgpack's encode and decode include its nested pickles.
NESTED = ("wrap_as_pickle", "unwrap_from_pickle")


class LayoutError(ImportError):
    """SGLang's io_struct is not laid out as the hook knows it."""


class Spans:
    """One process's timed replacements for io_struct's four socket functions."""

    def __init__(self, io_struct: types.ModuleType, folder: str) -> None:
        self.io = io_struct
        self.folder = folder
        self.recorder: Recorder | None = None
        self.recorder_pid = -1
        self._opening = threading.Lock()  # two threads' first messages must not both make the file

    def _record(self, kind: str, message: Any, start: int, middle: int, end: int, size: int) -> None:
        if self.recorder_pid != os.getpid():  # first message of this process (or of a forked child)
            self._open()
        if self.recorder is not None:
            self.recorder.add((kind, message, start, middle, end, size))

    def _open(self) -> None:
        with self._opening:
            if self.recorder_pid != os.getpid():
                self.recorder = Recorder.open(self.folder, process_role(), self._meta())
                self.recorder_pid = os.getpid()

    def _meta(self) -> dict[str, Any]:
        try:
            from importlib.metadata import version

            sglang_version = version("sglang")
        except Exception:  # noqa: BLE001 - a version is only a label here
            sglang_version = None
        return {"ipc": "pickle" if self.io._USE_PICKLE_IPC else "msgpack", "sglang": sglang_version}

    def _encode(self, message: Any) -> bytes:
        if self.io._USE_PICKLE_IPC:
            return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        return self.io.msgpack_encode(message)

    def _decode(self, data: bytes) -> Any:
        if self.io._USE_PICKLE_IPC:
            return pickle.loads(data)  # SGLang's own peer, on the socket SGLang opened
        return self.io.msgpack_decode(data)

    def sock_send(self, socket: Any, obj: Any, flags: int = 0) -> None:
        start = time.monotonic_ns()
        data = self._encode(obj)
        encoded = time.monotonic_ns()
        socket.send(data, flags=flags)
        self._record(SEND, obj, start, encoded, time.monotonic_ns(), len(data))

    def sock_recv(self, socket: Any, flags: int = 0) -> Any:
        start = time.monotonic_ns()
        data = socket.recv(flags=flags)
        received = time.monotonic_ns()
        obj = self._decode(data)
        self._record(RECV, obj, start, received, time.monotonic_ns(), len(data))
        return obj

    async def async_sock_send(self, socket: Any, obj: Any, flags: int = 0) -> None:
        start = time.monotonic_ns()
        data = self._encode(obj)
        encoded = time.monotonic_ns()
        await socket.send(data, flags=flags)
        self._record(SEND, obj, start, encoded, time.monotonic_ns(), len(data))

    def nested(self, kind: str, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``original`` (io_struct's wrap or unwrap), timed when it pickles: msgpack mode, an object."""

        def timed(obj: Any) -> Any:
            if obj is None or self.io._USE_PICKLE_IPC:
                return original(obj)
            start = time.monotonic_ns()
            out = original(obj)
            end = time.monotonic_ns()
            self._record(kind, obj if kind == WRAP else out, start, start, end, 0)
            return out

        return timed

    async def async_sock_recv(self, socket: Any, flags: int = 0) -> Any:
        start = time.monotonic_ns()
        data = await socket.recv(flags=flags)
        received = time.monotonic_ns()
        obj = self._decode(data)
        self._record(RECV, obj, start, received, time.monotonic_ns(), len(data))
        return obj


def check_layout(io_struct: types.ModuleType) -> None:
    """Raise LayoutError, one line naming what is missing, unless io_struct has every name the hook uses."""
    missing = [name for name in REPLACED + READ if not hasattr(io_struct, name)]
    if missing:
        try:
            from importlib.metadata import version

            sglang_version = version("sglang")
        except Exception:  # noqa: BLE001 - a version is only a label here
            sglang_version = "?"
        why = (
            f"wirebench sglang hook: SGLang {sglang_version} is not laid out as the hook knows it: "
            f"{IO_STRUCT} lacks {', '.join(missing)}"
        )
        print(why, file=sys.stderr, flush=True)  # one line in SGLang's log, above its traceback
        raise LayoutError(why)


def instrument(io_struct: types.ModuleType, folder: str) -> Spans:
    """Rebind io_struct's four socket functions to timed ones writing to ``folder``."""
    check_layout(io_struct)
    spans = Spans(io_struct, folder)
    for name in REPLACED:
        setattr(io_struct, name, getattr(spans, name))
    for name, kind in zip(NESTED, (WRAP, UNWRAP), strict=True):
        if hasattr(io_struct, name):
            setattr(io_struct, name, spans.nested(kind, getattr(io_struct, name)))
    return spans


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after one module has executed, before anything else can import it."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], object]) -> None:
        self.name = name
        self.then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        run_module = loader.exec_module
        then = self.then

        def exec_then(module: types.ModuleType) -> None:
            run_module(module)
            then(module)

        loader.exec_module = exec_then  # type: ignore[method-assign]  # this spec's own loader only
        return spec


def install(folder: str) -> None:
    """Time io_struct's messages in this process when SGLang imports it (once)."""
    if any(isinstance(f, AfterImport) and f.name == IO_STRUCT for f in sys.meta_path):
        return
    loaded = sys.modules.get(IO_STRUCT)
    if loaded is not None:
        instrument(loaded, folder)  # too late for modules that bound the names already: only by hand
        return
    sys.meta_path.insert(0, AfterImport(IO_STRUCT, lambda module: instrument(module, folder)))
