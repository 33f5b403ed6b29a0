"""The engine's device thread: one worker that runs launched steps in order, as a GPU stream does.

A step is launched with the work that yields its outputs (the sampled ids); its outputs are known
to the device only until the host waits on its handle. Two kinds of step:

- modelled (the ``sim`` executor): launched with its modelled duration. The device starts it when
  it is launched or when the one before it ends, whichever is later; start and end follow that
  modelled timeline, not the thread's wake-ups: a thread late for the GIL publishes late, but does
  not stretch the GPU's time.
- measured (the ``torch`` executor with one step of overlap): no duration; the step's forward and
  sampling run on this thread, start and end are the clock's when they begin and end. The gap
  between steps is then the host's time the device waited for: what the overlap did not hide.
  On CUDA a step's work returns once its kernels are queued, its outputs ``Pending`` until the
  copy of its ids lands (the handle's span then ends when the host has them); the GPU's busy and
  idle time then comes from events on its stream (``harness.engine.read_back``).

Idle time counts the gap between the end of one step and the start of the next only where the
engine had work throughout (``continuous`` at launch): a gap because no request was there is the
load's, not the host's.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

# An idle device thread exits after this long; the next launch starts a new one.
IDLE_EXIT_S = 1.0


def sleep_until_ns(deadline_ns: int) -> None:
    """Sleep until ``monotonic_ns() >= deadline_ns``: coarse sleep, then ``sleep(0)`` that yields the GIL."""
    while True:
        remaining = deadline_ns - time.monotonic_ns()
        if remaining <= 0:
            return
        if remaining > 1_000_000:
            time.sleep((remaining - 800_000) / 1e9)
        else:
            time.sleep(0)


@dataclass
class DeviceStats:
    """What the device did, cumulative (ns): read by other threads, written by the device's."""

    steps: int = 0
    busy_ns: int = 0
    # Gaps between the end of a step and the start of the next while the engine had work.
    idle_ns: int = 0
    gaps: int = 0
    # How late the thread published results after the modelled end (the sim's own cost, not the GPU's).
    late_ns: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Pending(Generic[T]):
    """A launched step's outputs still on their way back from the device (``harness.engine.read_back``):
    made once, by whichever thread waits for them first; later waits get the same value or error."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make: Callable[[], T] | None = make
        self._lock = threading.Lock()
        self._value: T | None = None
        self._error: BaseException | None = None

    def wait(self) -> T:
        with self._lock:
            if self._make is not None:
                make, self._make = self._make, None
                try:
                    self._value = make()
                except BaseException as exc:  # kept for every waiter, not lost on the first
                    self._error = exc
            if self._error is not None:
                raise self._error
            assert self._value is not None
            return self._value


class StepHandle(Generic[T]):
    """One launched step: ``wait()`` blocks until the device has run it and returns its outputs."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: T | Pending[T] | None = None
        self._error: BaseException | None = None
        self.start_ns = 0  # the modelled GPU's start and end of the step
        self.end_ns = 0

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> T:
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        if isinstance(self._result, Pending):  # launched, its outputs still on their way back
            self._result = self._result.wait()
            # The step's span then ends when its outputs reached the host, not when it was queued.
            self.end_ns = max(self.end_ns, time.monotonic_ns())
        return self._result

    def _finish(self, result: T | Pending[T] | None, error: BaseException | None, start_ns: int, end_ns: int) -> None:
        self._result, self._error = result, error
        self.start_ns, self.end_ns = start_ns, end_ns
        self._done.set()


@dataclass
class _Job(Generic[T]):
    launched_ns: int
    duration_ns: int  # modelled; -1: measured, set when the step ends
    work: Callable[[], T | Pending[T]]
    continuous: bool
    handle: StepHandle[T] = field(default_factory=StepHandle)


_live: weakref.WeakSet[DeviceThread] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """Let idle device threads end before the interpreter does: a daemon thread that has run torch
    ops and is still alive while the runtime is torn down aborts the process."""
    for device in list(_live):
        device.stop()


class DeviceThread:
    """A FIFO of launched steps run by one thread, for their modelled time or as long as they take."""

    def __init__(self) -> None:
        _live.add(self)
        self.stats = DeviceStats()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: stop when idle
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._end_ns = 0  # modelled end of the last step (device thread only)

    def launch(
        self,
        duration_s: float | None,
        work: Callable[[], T | Pending[T]],
        continuous: bool,
        launched_ns: int | None = None,
    ) -> StepHandle[T]:
        """Queue a step; ``duration_s``: its modelled time, None to measure it; ``continuous``: the
        engine had work since the previous step ended; ``launched_ns``: when the host began
        launching it (default: now)."""
        launched = time.monotonic_ns() if launched_ns is None else launched_ns
        duration = -1 if duration_s is None else max(0, int(duration_s * 1e9))
        job: _Job[T] = _Job(launched, duration, work, continuous)
        with self._lock:
            self._jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="device", daemon=True)
                self._thread.start()
        return job.handle

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread once the steps queued before this call have run (waits up to ``timeout_s``)."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._jobs.put(None)
        thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                job = None
            if job is None:  # idle, or asked to stop
                with self._lock:
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            self._step(job)

    def _step(self, job: _Job) -> None:
        measured = job.duration_ns < 0
        start = time.monotonic_ns() if measured else max(job.launched_ns, self._end_ns)
        result, error = None, None
        try:
            result = job.work()  # the step's outputs: the host learns them only through the handle
        except BaseException as exc:  # handed to the host's wait(), never lost on this thread
            error = exc
        if measured:
            end = time.monotonic_ns()
            job.duration_ns = end - start
        else:
            end = start + job.duration_ns
            sleep_until_ns(end)
        stats = self.stats
        if job.continuous and self._end_ns:
            stats.idle_ns += start - self._end_ns
            stats.gaps += 1
        stats.busy_ns += job.duration_ns
        stats.steps += 1
        stats.late_ns += max(0, time.monotonic_ns() - end)
        self._end_ns = end
        job.handle._finish(result, error, start, end)
