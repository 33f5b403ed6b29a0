"""The frontend's half of the request timelines, joined with the engine's (``harness.wire.spans``).

The app and the engine client stamp each request's ``FrontPoints`` as it goes;
the engine's points arrive in SPANS messages a little later. ``Timelines``
joins the two by request id (and output batches by sequence number), keeps
the joined ones in bounded rings for ``GET /v1/wirebench/spans`` and the
trace file, and feeds the Prometheus histograms of /metrics.

Everything here runs on the event loop: no locks. Memory is bounded by the
rings and by dropping halves that never find their other half after
``STALE_S`` (a request aborted before the engine saw it, spans switched off).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from harness.server_metrics import prometheus
from harness.wire.spans import CPU_SPANS, REQUEST_SPANS, BatchPoints, EnginePoints, FrontPoints, RequestTimeline

KEEP_REQUESTS = 100_000
KEEP_BATCHES = 200_000
KEEP_STEPS = 200_000
STALE_S = 60.0
LOOP_LAG_PERIOD_S = 0.01
KEEP_LAG_SAMPLES = 100_000


class Ring:
    """A bounded list with a running index, so a reader can ask for what came after index i."""

    def __init__(self, maxlen: int) -> None:
        self._items: deque[Any] = deque(maxlen=maxlen)
        self.next_index = 0

    def append(self, item: Any) -> None:
        self._items.append(item)
        self.next_index += 1

    def since(self, index: int) -> Iterator[Any]:
        first = self.next_index - len(self._items)
        for i, item in enumerate(self._items, first):
            if i >= index:
                yield item

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)


class Timelines:
    def __init__(self, enabled: bool = True) -> None:
        # False when the engine records no spans or its clock is not ours (another host).
        self.enabled = enabled
        self.unavailable = "" if enabled else "not recorded"
        self._front: dict[str, tuple[float, FrontPoints]] = {}  # in flight, or waiting for the engine's half
        self._front_done: set[str] = set()
        self._engine: dict[str, tuple[float, EnginePoints]] = {}
        self._batch_front: dict[int, tuple[float, int, int, int, int]] = {}  # seq → (t, received, decoded, cpu, adapt)
        self._batch_engine: dict[int, tuple[float, dict[str, Any]]] = {}
        self._batches: dict[int, BatchPoints] = {}  # complete, by seq, for joining first batches
        self.requests = Ring(KEEP_REQUESTS)
        self.batches = Ring(KEEP_BATCHES)
        self.steps = Ring(KEEP_STEPS)
        self.loop_lag = Ring(KEEP_LAG_SAMPLES)
        self.hist_ipc = prometheus.Histogram(prometheus.IPC_SECONDS)
        self.hist_cpu = prometheus.Histogram(prometheus.CODEC_CPU_SECONDS)
        self.hist_first_token = prometheus.Histogram(prometheus.FIRST_TOKEN_IPC_SECONDS)
        self.hist_loop_lag = prometheus.Histogram(prometheus.LOOP_LAG_SECONDS)

    def disable(self, why: str) -> None:
        self.enabled, self.unavailable = False, why

    # --- the frontend's points ----------------------------------------------------------
    def track(self, request_id: str, points: FrontPoints) -> None:
        if self.enabled:
            self._front[request_id] = (time.monotonic(), points)

    def front_points(self, request_id: str) -> FrontPoints | None:
        entry = self._front.get(request_id)
        return entry[1] if entry else None

    def front_finished(self, request_id: str) -> None:
        """The request's frontend part is over (first chunk written, or it ended): join when the engine's is in."""
        if request_id in self._front:
            self._front_done.add(request_id)
            self._try_join(request_id)

    def batch_received(
        self, seq: int, received_ns: int, decoded_ns: int, decode_cpu_ns: int, adapt_ns: int = 0
    ) -> None:
        if self.enabled and seq >= 0:
            self._batch_front[seq] = (time.monotonic(), received_ns, decoded_ns, decode_cpu_ns, adapt_ns)
            self._try_batch(seq)

    # --- the engine's points ---------------------------------------------------------------
    def engine_spans(self, msg: dict[str, Any]) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        for record in msg.get("batches") or ():
            seq = int(record.get("seq", -1))
            self._batch_engine[seq] = (now, record)
            self._try_batch(seq)
        for step in msg.get("steps") or ():
            self.steps.append(step)
        for rid, fields in (msg.get("requests") or {}).items():
            self._engine[rid] = (now, EnginePoints(**fields))
            self._try_join(rid)
        self._drop_stale(now)

    # --- joining -------------------------------------------------------------------------------
    def _try_batch(self, seq: int) -> None:
        front, engine = self._batch_front.get(seq), self._batch_engine.get(seq)
        if front is None or engine is None:
            return
        del self._batch_front[seq], self._batch_engine[seq]
        _, received, decoded, cpu, adapt = front
        fields = {k: v for k, v in engine[1].items() if k in BatchPoints.__dataclass_fields__}
        batch = BatchPoints(**fields, received=received, decoded=decoded, decode_cpu=cpu, front_adapt=adapt)
        self._batches[seq] = batch
        while len(self._batches) > KEEP_BATCHES:
            del self._batches[next(iter(self._batches))]
        self.batches.append(batch)
        spans = batch.spans_us()
        for what in ("encode", "wire", "decode"):
            self.hist_ipc.observe(spans[what] / 1e6, direction="output", span=what)
        for what in ("encode", "decode"):
            self.hist_cpu.observe(spans[f"{what}_cpu"] / 1e6, direction="output", op=what)
        # A request whose first output came in this batch may have been waiting for it.
        for rid in [r for r, (_, e) in self._engine.items() if e.first_output_seq == seq]:
            self._try_join(rid)

    def _try_join(self, rid: str) -> None:
        if rid not in self._front_done or rid not in self._engine:
            return
        engine = self._engine[rid][1]
        batch = self._batches.get(engine.first_output_seq)
        if batch is None and engine.first_output_seq >= 0 and engine.first_output_seq in self._batch_engine:
            return  # its batch's engine half is here, the frontend half not yet: wait
        del self._engine[rid]
        self._front_done.discard(rid)
        _, front = self._front.pop(rid)
        if not front.first_sse_written:
            return  # it ended before its first chunk (error, abort): no first-token path to show
        timeline = RequestTimeline(rid, front, engine, batch)
        self.requests.append(timeline)
        spans = timeline.spans_us()
        for direction, what in REQUEST_SPANS:
            value = spans[f"{direction}.{what}"]
            if direction == "request" or what == "queue":  # output encode/wire/decode are per batch above
                self.hist_ipc.observe(value / 1e6, direction=direction, span=what)
        for direction, op in CPU_SPANS:
            if direction == "request":
                self.hist_cpu.observe(spans[f"request.{op}_cpu"] / 1e6, direction="request", op=op)
        if math.isfinite(spans["ipc"]):
            self.hist_first_token.observe(spans["ipc"] / 1e6)

    def _drop_stale(self, now: float) -> None:
        tables: tuple[dict[Any, tuple[Any, ...]], ...] = (
            self._front,
            self._engine,
            self._batch_front,
            self._batch_engine,
        )
        for table in tables:
            for key in [k for k, entry in table.items() if now - entry[0] > STALE_S]:
                del table[key]
        self._front_done &= self._front.keys()

    # --- the event loop's lag --------------------------------------------------------------
    async def watch_loop_lag(self) -> None:
        """Forever: sleep LOOP_LAG_PERIOD_S and record how late the loop woke us (the lag every callback sees)."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(LOOP_LAG_PERIOD_S)
            lag = max(0.0, loop.time() - start - LOOP_LAG_PERIOD_S)
            self.loop_lag.append(lag)
            self.hist_loop_lag.observe(lag)

    # --- reading -------------------------------------------------------------------------------
    def snapshot(self, since_request: int = 0, since_batch: int = 0, since_lag: int = 0) -> dict[str, Any]:
        """What ``GET /v1/wirebench/spans`` returns: joined timelines and batches after the cursors."""
        lags = [x * 1000.0 for x in self.loop_lag.since(since_lag)]
        return {
            "available": self.enabled,
            "unavailable": self.unavailable or None,
            "cursor": {
                "request": self.requests.next_index,
                "batch": self.batches.next_index,
                "lag": self.loop_lag.next_index,
            },
            "requests": [t.to_dict() for t in self.requests.since(since_request)],
            "batches": [{**vars(b), "spans_us": b.spans_us()} for b in self.batches.since(since_batch)],
            "loop_lag_ms": _lag_summary(lags),
        }

    def histograms(self) -> list[prometheus.Histogram]:
        return [self.hist_ipc, self.hist_cpu, self.hist_first_token, self.hist_loop_lag]


def _lag_summary(lags_ms: list[float]) -> dict[str, float]:
    if not lags_ms:
        return {"samples": 0}
    ordered = sorted(lags_ms)
    return {
        "samples": len(ordered),
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max": ordered[-1],
    }
