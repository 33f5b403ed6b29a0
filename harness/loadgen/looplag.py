"""Event-loop lag: how late asyncio wakes a task that asked to sleep a fixed time.

A client whose event loop is busy (parsing SSE, starting requests, GC)
reads every chunk late, and that lateness lands in TTFT and ITL as if the
server had caused it. A small task sleeps ``interval_s`` over and over and
keeps each overshoot; the client-bottleneck guard (``guard``) judges the
p99. The baseline overshoot is up to ~1 ms, not 0: the selector rounds its
timeout up to whole milliseconds (epoll takes ms).
"""

from __future__ import annotations

import asyncio
import time

DEFAULT_INTERVAL_S = 0.010


class LoopLagProbe:
    """Start in a running loop; ``stop()`` returns the overshoots in seconds."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def start(cls, interval_s: float = DEFAULT_INTERVAL_S) -> LoopLagProbe:
        probe = cls(interval_s)
        probe._task = asyncio.get_running_loop().create_task(probe._run(), name="loop-lag-probe")
        return probe

    async def _run(self) -> None:
        interval = self.interval_s
        append = self.samples.append
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(interval)
            append(max(0.0, time.perf_counter() - t0 - interval))

    def stop(self) -> list[float]:
        # Cancelling is enough: the task holds nothing; a sample in progress is dropped.
        if self._task is not None:
            self._task.cancel()
            self._task = None
        return self.samples
