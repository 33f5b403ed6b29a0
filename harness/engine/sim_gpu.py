"""The ``sim`` executor's modelled GPU: one worker thread that runs launched steps in order.

A step is launched with its modelled duration and the work that yields its outputs (the sampled
ids). The device starts a step when the step is launched or when the one before it ends, whichever
is later, as a GPU stream does; the step's outputs are known to the device only until the host
waits on its handle. Start and end follow that modelled timeline, not the thread's wake-ups: a
thread late for the GIL publishes late, but does not stretch the GPU's time.

Idle time counts the gap between the end of one step and the start of the next only where the
engine had work throughout (``continuous`` at launch): a gap because no request was there is the
load's, not the host's.
"""

from __future__ import annotations

import queue
import threading
import time
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
    """What the modelled GPU did, cumulative (ns): read by other threads, written by the device's."""

    steps: int = 0
    busy_ns: int = 0
    # Gaps between the end of a step and the start of the next while the engine had work.
    idle_ns: int = 0
    gaps: int = 0
    # How late the thread published results after the modelled end (the sim's own cost, not the GPU's).
    late_ns: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class StepHandle(Generic[T]):
    """One launched step: ``wait()`` blocks until the device has run it and returns its outputs."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: T | None = None
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
        return self._result

    def _finish(self, result: T | None, error: BaseException | None, start_ns: int, end_ns: int) -> None:
        self._result, self._error = result, error
        self.start_ns, self.end_ns = start_ns, end_ns
        self._done.set()


@dataclass
class _Job(Generic[T]):
    launched_ns: int
    duration_ns: int
    work: Callable[[], T]
    continuous: bool
    handle: StepHandle[T] = field(default_factory=StepHandle)


class SimDevice:
    """A FIFO of launched steps run by one thread for their modelled time."""

    def __init__(self) -> None:
        self.stats = DeviceStats()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._end_ns = 0  # modelled end of the last step (device thread only)

    def launch(
        self, duration_s: float, work: Callable[[], T], continuous: bool, launched_ns: int | None = None
    ) -> StepHandle[T]:
        """Queue a step; ``continuous``: the engine had work since the previous step ended;
        ``launched_ns``: when the host began launching it (default: now)."""
        launched = time.monotonic_ns() if launched_ns is None else launched_ns
        job: _Job[T] = _Job(launched, max(0, int(duration_s * 1e9)), work, continuous)
        with self._lock:
            self._jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sim-gpu", daemon=True)
                self._thread.start()
        return job.handle

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            self._step(job)

    def _step(self, job: _Job) -> None:
        start = max(job.launched_ns, self._end_ns)
        end = start + job.duration_ns
        result, error = None, None
        try:
            result = job.work()  # the step's outputs: the host learns them only through the handle
        except BaseException as exc:  # handed to the host's wait(), never lost on this thread
            error = exc
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
