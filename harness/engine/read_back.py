"""A launched step's sampled ids on their way to the host, without holding up the next step.

With one step of overlap the device thread launches step N+1 while step N may still run. On
CUDA, step N's ids are copied into pinned host memory on a side stream once its kernels are done
(an event marks the copy); the device thread goes straight on to launch N+1, and whoever needs
N's ids waits for that event alone, not for the stream, which by then runs N+1: the engine thread
for the scheduler's update, or step N+1 itself when a penalized row's token history holds N's
placeholder. Events on the stream time each step: busy from before its first kernel to after
its last (a host sync inside the step, for logprobs or a penalty history, counts as busy), idle
from the end of one step to the start of the next (the wait for the copy before included): gaps
the host cannot see.

On the CPU every op has finished when it returns, so a step reads its ids at once (the loop in
series, and overlap on the CPU); ``deferred`` set there hands them over later all the same, so
the tests run this hand-off without a GPU.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from harness.engine.device_thread import DeviceStats, Pending

log = logging.getLogger("wirebench.engine")


@dataclass
class StepMarks:
    """CUDA events around a launched step's kernels (timed), and the end of the step before it."""

    start: Any
    previous_end: Any  # None for the first step, or one after a pause (not ``continuous``)
    end: Any = None


class ReadBack:
    """Each launched step's ids, on the host once copied; the GPU's busy and idle time from events."""

    def __init__(self, device: torch.device, side_stream: bool | None = None) -> None:
        """``side_stream``: copy and time on CUDA streams (default: where the device is CUDA)."""
        cuda = device.type == "cuda" if side_stream is None else side_stream
        self.device = device
        self.deferred = cuda  # tests set it on the CPU
        self._stream = torch.cuda.Stream(device) if cuda else None
        # The GPU's own time, from the events (CUDA only; written by whichever thread waits first).
        self.gpu = DeviceStats()
        self._stats_lock = threading.Lock()
        self._last_end: Any = None  # the last launched step's end event (device thread only)

    @property
    def timed(self) -> bool:
        """The GPU's time comes from events on its stream."""
        return self._stream is not None

    def begin(self, continuous: bool) -> StepMarks | None:
        """Before a launched step's first kernel (device thread): mark its start on the stream."""
        if self._stream is None:
            return None
        current = torch.cuda.current_stream(self.device)
        # The copy before may still read a buffer this step rewrites (a graph's static output).
        current.wait_stream(self._stream)
        start = torch.cuda.Event(enable_timing=True)
        start.record(current)
        return StepMarks(start, self._last_end if continuous else None)

    def end(self, marks: StepMarks | None) -> None:
        """After a launched step's last kernel (device thread)."""
        if marks is None:
            return
        marks.end = torch.cuda.Event(enable_timing=True)
        marks.end.record(torch.cuda.current_stream(self.device))
        self._last_end = marks.end

    def ids(self, tokens: Tensor, marks: StepMarks | None, read: Callable[[Tensor], np.ndarray]) -> Pending[np.ndarray]:
        """``tokens`` [n] (on the device) on the host: copied on the side stream after the step's
        kernels, waited for by whoever needs them. ``read``: the plain read, where nothing is
        asynchronous."""
        if self._stream is None:  # the CPU: the values are there now
            picked = read(tokens)
            return Pending(lambda: picked)
        self.end(marks)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self._stream)
        tokens.record_stream(self._stream)  # not reused by the allocator before the copy is done

        def on_host() -> np.ndarray:
            copied.synchronize()  # waits for this step's copy, not for the stream
            if marks is not None:
                try:
                    self.time(marks)
                except RuntimeError as exc:  # a figure lost, never the step's tokens
                    log.warning("could not time a step on the GPU: %s", exc)
            return host.numpy()

        return Pending(on_host)

    def time(self, marks: StepMarks) -> None:
        """Add a finished step's busy time, and its gap after the step before it, to ``gpu``."""
        if marks.end is None:
            return
        busy_ms = marks.start.elapsed_time(marks.end)
        gap_ms = marks.previous_end.elapsed_time(marks.start) if marks.previous_end is not None else None
        with self._stats_lock:
            stats = self.gpu
            stats.steps += 1
            stats.busy_ns += int(busy_ms * 1e6)
            if gap_ms is not None:
                stats.idle_ns += max(0, int(gap_ms * 1e6))
                stats.gaps += 1
