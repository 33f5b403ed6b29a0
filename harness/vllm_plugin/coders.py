"""The timed serializers the plugin puts in place of vLLM's ``MsgpackEncoder`` and ``MsgpackDecoder``.

Each wraps vLLM's own coder (built with the same arguments, tensor IPC included) and handles the two
messages under test, ``EngineCoreRequest`` and ``EngineCoreOutputs``, with the chosen wirebench codec,
or with vLLM's coder when the codec is ``vllm``; anything else (aborts, utility calls, the
coordinator's messages) goes to vLLM's coder untouched and untimed. A handled message costs the
codec call plus two wall-clock reads and a deque append (``records.Recorder``); what to write is
built later, on the recorder's thread. The thread's CPU time is read too only when asked
(``cpu_time``): that clock is a system call (~0.4 µs a read here, two a message), the wall clock is not.
Where the messages are timed, so are the engine's two queues (``harness.vllm_plugin.queues``), into the
same records.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from harness.vllm_plugin import OWN_CODEC
from harness.vllm_plugin.records import (
    OUTPUT_DECODE,
    OUTPUT_ENCODE,
    REFUSED,
    REQUEST_DECODE,
    REQUEST_ENCODE,
    Recorder,
    Recorders,
    warn_once,
)

_wall = time.monotonic_ns  # a module global: one lookup less a call on the message path

_installed: str | None = None
MAX_REASONS = 8  # distinct refusals a process reports


def _nbytes(frames: Sequence[Any]) -> int:
    """The frames' bytes: ``len`` of bytes, bytearrays and received zmq.Frames; a memoryview (vLLM's
    out-of-band buffers) may hold wider items."""
    if len(frames) == 1 and type(frames[0]) is not memoryview:
        return len(frames[0])  # a message with no out-of-band buffers: the common case, kept short
    total = 0
    for frame in frames:
        total += frame.nbytes if type(frame) is memoryview else len(frame)
    return total


def install(codec_name: str, folder: str | None, cpu_time: bool = False, ipc_only: bool = False) -> None:
    """Rebind vLLM's serializer names in the modules that build them (once a process). A vLLM laid out
    otherwise than the plugin knows (``harness.vllm_plugin.layout``), or a codec that unpickles peer data
    without vLLM's own opt-in, ends the process with one line (SystemExit): a server that quietly kept
    vLLM's serializer would be measured under the wrong name. ``ipc_only``: every engine-link socket
    these modules open must be a local ipc one."""
    global _installed
    if _installed is not None:
        if _installed != codec_name:
            raise RuntimeError(f"wirebench plugin: codec {_installed!r} already in place, asked for {codec_name!r}")
        return
    from harness.vllm_plugin.layout import problem_line

    unknown_layout = problem_line()  # before anything is rebound: never a plain vLLM under the codec's name
    if unknown_layout is not None:
        raise SystemExit(unknown_layout)
    import vllm.v1.engine.core as core
    import vllm.v1.engine.core_client as core_client
    from vllm import envs

    from harness.wire.hook_policy import VLLM_OPT_IN, hook_refusal

    opted_in = bool(envs.VLLM_ALLOW_INSECURE_SERIALIZATION)
    refusal = hook_refusal(codec_name, opted_in, VLLM_OPT_IN)
    if refusal is not None:
        raise SystemExit(f"wirebench plugin: {refusal}")
    link = {"opt_in": opted_in, "ipc_only": ipc_only}
    recorders = Recorders(folder, process_meta(codec_name, cpu_time, link))
    encoder, decoder = timed_coders(codec_name, folder, cpu_time, link, recorders)
    for module in (core, core_client):
        setattr(module, "MsgpackEncoder", encoder)  # noqa: B010  # the name vLLM builds its coders by
        setattr(module, "MsgpackDecoder", decoder)  # noqa: B010
        if ipc_only:
            setattr(module, "make_zmq_socket", _local_sockets_only(module.make_zmq_socket, codec_name))  # noqa: B010
    if folder is not None:  # the engine's queues are timed only where its messages are
        from harness.vllm_plugin.queues import hook_engine_queues

        hook_engine_queues(core.EngineCoreProc, partial(recorders.get, "engine"))
    _installed = codec_name
    if folder is not None:
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError as exc:  # the messages go on untimed: said once, here at the start
            warn_once(f"cannot write timings in {folder}: {exc}; this process's messages go on untimed")


def _local_sockets_only(make: Callable[..., Any], codec_name: str) -> Callable[..., Any]:
    """vLLM's socket maker, refusing any address that is not a local ipc one (the module rebinds it)."""
    from harness.wire.hook_policy import link_refusal

    def make_local_socket(ctx: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        refusal = link_refusal(codec_name, path)
        if refusal is not None:
            raise RuntimeError(f"wirebench plugin: {refusal}")
        return make(ctx, path, *args, **kwargs)

    return make_local_socket


def process_meta(codec_name: str, cpu_time: bool, link: dict[str, bool] | None) -> dict[str, Any]:
    """What each process's records say of it first (``harness.vllm_plugin.records``)."""
    from harness.wire.spans import host_clock_id

    return {"codec": codec_name, "clock": host_clock_id(), "cpu_time": cpu_time, **(link or {})}


def timed_coders(
    codec_name: str,
    folder: str | None,
    cpu_time: bool = False,
    link: dict[str, bool] | None = None,
    recorders: Recorders | None = None,
) -> tuple[type, type]:
    """The encoder and decoder classes to put in place of vLLM's. With ``cpu_time`` each timed call's
    thread CPU time is recorded too; without, its CPU field is null. ``link``: how the engine link was
    allowed (vLLM's opt-in seen, sockets held to ipc), written in each process's records. ``recorders``:
    the process's, shared with what else it times (the engine's queues); by default its own."""
    from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    from wirecodecs import CodecError, UnsupportedPayloadError, get_codec

    swap = codec_name != OWN_CODEC
    if swap:
        get_codec(codec_name)  # an unknown name fails here, in the log, before any request
    cpu_clock = time.thread_time_ns if cpu_time else None
    # Each role's recorder is made when it first handles a message (its role known by then).
    recorder = (recorders or Recorders(folder, process_meta(codec_name, cpu_time, link))).get

    refused: set[str] = set()

    def refuse(why: str, role: str) -> None:
        """A message the codec cannot carry: on stderr (vLLM's log) and in the records, once a reason (the
        first few reasons: one that names a message's details must not log every request)."""
        if why in refused or len(refused) >= MAX_REASONS:
            return
        refused.add(why)
        print(f"wirebench plugin: {why}", file=sys.stderr, flush=True)
        rec = recorder(role)
        if rec is not None:
            rec.add((REFUSED, why))

    class TimedEncoder:
        """vLLM's encoder; EngineCoreRequest (API side) and EngineCoreOutputs (engine side) through the codec."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._vllm = MsgpackEncoder(*args, **kwargs)
            self._codec = get_codec(codec_name) if swap else None
            # The recorder of this side's messages, looked up at the first one: an encoder of requests is
            # the API server's, one of outputs the engine's.
            self._rec: Recorder | None = None

        def encode(self, obj: Any, buf: bytearray | None = None) -> Sequence[Any]:
            kind = type(obj)
            # A utility call's result rides in EngineCoreOutputs with no outputs: vLLM's own traffic
            # (any Python value, which only vLLM's coder carries), not the path under test.
            if kind is not EngineCoreRequest and (kind is not EngineCoreOutputs or obj.utility_output is not None):
                return self._vllm.encode(obj) if buf is None else self._vllm.encode_into(obj, buf)
            cpu0 = cpu_clock() if cpu_clock else 0
            start = _wall()
            frames: Sequence[Any]
            if self._codec is not None:
                try:
                    frames = self._codec.encode(obj)
                except Exception as exc:
                    # vLLM answers the request 500 with an empty message: say why where bench run reads it.
                    why = str(exc) if isinstance(exc, UnsupportedPayloadError) else f"{type(exc).__name__}: {exc}"
                    refuse(why, "api" if kind is EngineCoreRequest else "engine")
                    raise
            else:
                frames = self._vllm.encode(obj) if buf is None else self._vllm.encode_into(obj, buf)
            end = _wall()
            cpu = cpu_clock() - cpu0 if cpu_clock else None
            rec = self._rec
            if rec is None:
                rec = self._rec = recorder("api" if kind is EngineCoreRequest else "engine")
                if rec is None:
                    return frames
            # The message itself rides along: what to write of it is read on the recorder's thread.
            code = REQUEST_ENCODE if kind is EngineCoreRequest else OUTPUT_ENCODE
            rec.add((code, obj, start, end, cpu, _nbytes(frames), len(frames)))
            return frames

        encode_into = encode  # vLLM's output thread reuses a buffer: the codec under test writes its own

    class TimedDecoder:
        """vLLM's decoder; a decoder of EngineCoreRequest (engine) or EngineCoreOutputs (API) through the codec."""

        def __init__(self, t: Any = None, *args: Any, **kwargs: Any) -> None:
            self._vllm = MsgpackDecoder(t, *args, **kwargs)
            self._type = t
            handled = t is EngineCoreRequest or t is EngineCoreOutputs
            self._codec = get_codec(codec_name) if swap and handled else None
            self._role = ("engine" if t is EngineCoreRequest else "api") if handled else None
            self._code = REQUEST_DECODE if t is EngineCoreRequest else OUTPUT_DECODE
            self._rec: Recorder | None = None

        def decode(self, bufs: Any) -> Any:
            if self._role is None:
                return self._vllm.decode(bufs)
            frames = (
                bufs if type(bufs) is list else [bufs] if isinstance(bufs, (bytes, bytearray, memoryview)) else bufs
            )
            cpu0 = cpu_clock() if cpu_clock else 0
            start = _wall()
            if self._codec is None:
                obj = self._vllm.decode(bufs)
            else:
                try:
                    obj = self._codec.decode(frames, self._type)
                except CodecError:  # a utility result, which the other side sent with vLLM's coder
                    return self._vllm.decode(bufs)
            end = _wall()
            cpu = cpu_clock() - cpu0 if cpu_clock else None
            if self._code is OUTPUT_DECODE and obj.utility_output is not None:
                return obj  # vLLM's own traffic (the encoder's note), untimed
            rec = self._rec
            if rec is None:
                rec = self._rec = recorder(self._role)
                if rec is None:
                    return obj
            # An output batch is named by its stamp alone: the API server's output handling goes on with it.
            ref = obj if self._code is REQUEST_DECODE else obj.timestamp
            rec.add((self._code, ref, start, end, cpu, _nbytes(frames), len(frames)))
            return obj

    return TimedEncoder, TimedDecoder
