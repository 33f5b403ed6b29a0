"""The engine's half of the request timelines (``harness.wire.spans``): points taken by its three threads.

The input thread records when a request's frames were received and decoded,
the busy loop when it was handed to the scheduler and in which steps it was
first scheduled and first sampled, the output thread when the batch carrying
its first token was encoded and sent. The output thread ships what is
complete in a ``SPANS`` message (JSON, outside the codec) at most every
``FLUSH_INTERVAL_S`` and whenever it is idle.

Memory is bounded: requests that never produce an output (aborted while
waiting) are dropped on abort and, past ``MAX_PENDING``, oldest first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import asdict
from typing import Any

from harness.engine.device_thread import DeviceStats
from harness.engine.step import SchedulerOutput
from harness.wire.spans import EnginePoints

FLUSH_INTERVAL_S = 0.05
MAX_PENDING = 100_000
MAX_STEPS = 10_000  # steps kept between flushes (a stalled flush must not grow without bound)


class EngineTimings:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, EnginePoints] = OrderedDict()  # no first output yet
        self._done: dict[str, EnginePoints] = {}
        self._batches: list[dict[str, Any]] = []
        self._steps: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        # The executor's device thread (harness.engine.device_thread), set once the engine core exists.
        self.device: DeviceStats | None = None

    # input thread
    def received(
        self, request_id: str, received_ns: int, decoded_ns: int, decode_cpu_ns: int, adapt_ns: int = 0
    ) -> None:
        with self._lock:
            self._pending[request_id] = EnginePoints(received_ns, decoded_ns, decode_cpu_ns, adapt_ns=adapt_ns)
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)

    # busy loop
    def added(self, request_id: str, now_ns: int) -> None:
        with self._lock:
            points = self._pending.get(request_id)
            if points is not None:
                points.added = now_ns

    def step(
        self,
        index: int,
        start_ns: int,
        end_ns: int,
        scheduled: SchedulerOutput | None,
        sampled_ids: list[str],
        device_span: tuple[int, int] | None = None,
    ) -> None:
        """One call of the engine's step: what it scheduled, and the requests sampled in what it returned
        (overlapped, the step before: ``harness.engine.overlap``).

        ``device_span``: the device thread's start and end of the step whose tokens it returned.
        """
        tokens = scheduled.total_num_tokens if scheduled is not None else 0
        new_ids = [nr.request_id for nr in scheduled.new_requests] if scheduled is not None else []
        with self._lock:
            for rid in new_ids:
                points = self._pending.get(rid)
                if points is not None and not points.first_scheduled:
                    points.first_scheduled = start_ns
            for rid in sampled_ids:
                points = self._pending.get(rid)
                if points is not None and not points.first_sampled:
                    points.first_sampled = end_ns
            if len(self._steps) < MAX_STEPS:
                record = {
                    "index": index,
                    "start": start_ns,
                    "end": end_ns,
                    "tokens": tokens,
                    "new": len(new_ids),
                    "sampled": len(sampled_ids),
                }
                if device_span is not None:
                    record["device_start"], record["device_end"] = device_span
                self._steps.append(record)

    def dropped(self, request_ids: list[str]) -> None:
        with self._lock:
            for rid in request_ids:
                self._pending.pop(rid, None)

    # output thread
    def batch_sent(self, batch: dict[str, Any], request_ids: list[str]) -> None:
        """A batch went out: it carries the first output of those of ``request_ids`` still pending."""
        if self.device is not None:  # the device thread's time so far, cumulative
            batch["device_busy"], batch["device_idle"] = self.device.busy_ns, self.device.idle_ns
        with self._lock:
            self._batches.append(batch)
            for rid in request_ids:
                points = self._pending.pop(rid, None)
                if points is not None:
                    points.first_output_seq = batch["seq"]
                    self._done[rid] = points

    def take(self, force: bool = False) -> dict[str, Any] | None:
        """What is ready to ship, when a flush is due (or forced); None when nothing is."""
        now = time.monotonic()
        with self._lock:
            if not (self._done or self._batches or self._steps):
                return None
            if not force and now - self._last_flush < FLUSH_INTERVAL_S:
                return None
            out = {
                "requests": {rid: asdict(p) for rid, p in self._done.items()},
                "batches": self._batches,
                "steps": self._steps,
            }
            self._done, self._batches, self._steps = {}, [], []
            self._last_flush = now
        return out
