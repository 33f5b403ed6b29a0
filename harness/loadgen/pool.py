"""``--workers N`` on one host: the schedule split across N spawned client processes.

One duplex pipe per worker carries a small protocol:

  child  -> ("ready",)                session open, imports done
  parent -> ("go", origin)            origin: a time.monotonic() value START_DELAY_S ahead
  child  -> ("progress", ok, failed)  at most every PROGRESS_INTERVAL_S
  parent -> ("stop",)                 Ctrl-C: cancel, return what there is
  child  -> ("done", WorkerOutcome)

The shared start: the parent waits until every worker is ready, then sends
all of them one instant on the monotonic clock. On Linux ``time.monotonic``
and ``time.perf_counter`` both read CLOCK_MONOTONIC, one system-wide clock,
so every worker's records share one time axis, as a single process's do
(the child still converts through its own clocks, so a platform where
perf_counter differs gets it right too).

A pipe that reaches EOF before "done" means the worker died: its slice is
counted as failed, saying so. Children ignore SIGINT: Ctrl-C reaches the
whole process group, and the parent alone decides to stop, so the records
of every live worker come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from harness.loadgen.client import RequestRecord
from harness.loadgen.progress import Progress
from harness.loadgen.workers import (
    LoadOutcome,
    LoadWorkerError,
    WorkerJob,
    WorkerOutcome,
    build_jobs,
    combine,
    drive,
    new_session,
    uncancel_current_task,
)
from harness.processes.heap import freeze_heap

# Between the last "ready" and the start: enough for every child to get "go".
START_DELAY_S = 0.05
READY_TIMEOUT_S = 120.0
# After "stop": how long a worker may take to hand back its records.
STOP_TIMEOUT_S = 15.0
PROGRESS_INTERVAL_S = 0.25


class _Inbox:
    """Messages of one pipe as an asyncio queue; ("eof", reason) when it closes."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._open = True
        self._loop.add_reader(conn.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            msg = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.close()
            msg = ("eof", type(exc).__name__)
        self.queue.put_nowait(msg)

    async def get(self, timeout: float | None = None) -> tuple[Any, ...]:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return ("timeout",)

    def send(self, *msg: Any) -> None:
        if self._open:
            with contextlib.suppress(OSError):  # a dead child: its EOF says the rest
                self.conn.send(msg)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._loop.remove_reader(self.conn.fileno())


# ------------------------------------------------------------------ child


def _child_main(job: WorkerJob, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(_child(job, conn))
    finally:
        conn.close()


def _perf_counter_of(monotonic_t: float) -> float:
    return time.perf_counter() + (monotonic_t - time.monotonic())


async def _child(job: WorkerJob, conn: Connection) -> None:
    inbox = _Inbox(conn)
    async with new_session() as session:
        freeze_heap()  # as benchmark_serving does; before "ready": a collection now cannot delay the shared start
        inbox.send("ready")
        msg = await inbox.get()
        if msg[0] != "go":
            return  # stopped (or the parent is gone) before the start: nothing was sent
        origin = _perf_counter_of(msg[1])
        counts = [0, 0]

        def on_done(ok: bool) -> None:
            counts[0 if ok else 1] += 1

        async def report_progress() -> None:
            while True:
                await asyncio.sleep(PROGRESS_INTERVAL_S)
                inbox.send("progress", *counts)

        load = asyncio.create_task(drive(session, job, origin, on_done))
        reporter = asyncio.create_task(report_progress())
        stop = asyncio.create_task(inbox.get())
        await asyncio.wait({load, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not load.done():
            load.cancel()
        outcome = await load
        reporter.cancel()
        stop.cancel()
        inbox.send("progress", *counts)
        inbox.send("done", outcome)


# ----------------------------------------------------------------- parent


async def run_pool(
    url: str,
    chat: bool,
    records: list[RequestRecord],
    bodies: list[bytes],
    *,
    n_workers: int,
    timeout_s: float | None,
    max_concurrency: int | None,
    progress: bool | None,
    progress_label: str = "requests",
) -> LoadOutcome:
    """Run the load from ``n_workers`` spawned processes; records come back in request order."""
    jobs = build_jobs(url, chat, timeout_s, max_concurrency, records, bodies, n_workers)
    ctx = mp.get_context("spawn")  # fork would copy the parent's loop and sockets
    procs: list[Any] = []
    inboxes: list[_Inbox] = []
    try:
        for job in jobs:
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_child_main, args=(job, child_conn), name=f"wirebench-load-{job.worker}")
            proc.daemon = True
            proc.start()
            child_conn.close()  # so the parent sees EOF when the child dies
            procs.append(proc)
            inboxes.append(_Inbox(parent_conn))
        await _wait_ready(inboxes, procs)
        origin = time.monotonic() + START_DELAY_S
        for inbox in inboxes:
            inbox.send("go", origin)
        outcomes, failures, interrupted = await _gather(
            inboxes, procs, Progress(len(records), enabled=progress, label=progress_label)
        )
    finally:
        for inbox in inboxes:
            inbox.close()
            inbox.conn.close()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    # One host, one clock: each worker's start is its lateness after the shared origin.
    starts = {w: o.start_late_s for w, o in outcomes.items()}
    return combine(
        len(records),
        jobs,
        outcomes,
        failures,
        mode="processes",
        interrupted=interrupted,
        start_offsets_s=starts,
        uncertainty_ms=0.0,
    )


async def _wait_ready(inboxes: list[_Inbox], procs: list[Any]) -> None:
    try:
        answers = await asyncio.gather(*(inbox.get(READY_TIMEOUT_S) for inbox in inboxes))
    except asyncio.CancelledError:
        for inbox in inboxes:
            inbox.send("stop")
        raise
    for w, msg in enumerate(answers):
        if msg[0] != "ready":
            for inbox in inboxes:
                inbox.send("stop")
            what = "did not report ready in time" if msg[0] == "timeout" else "exited"
            procs[w].join(timeout=1)
            raise LoadWorkerError(
                f"load worker {w} {what} (exit code {procs[w].exitcode}; its traceback, if any, is above); nothing "
                "was sent. A script that runs the load with workers needs `if __name__ == '__main__':` (spawn)"
            )


async def _gather(
    inboxes: list[_Inbox], procs: list[Any], progress: Progress
) -> tuple[dict[int, WorkerOutcome], dict[int, str], bool]:
    """Collect every worker's outcome; on cancellation, tell them to stop and still collect."""
    outcomes: dict[int, WorkerOutcome] = {}
    failures: dict[int, str] = {}
    seen = [[0, 0] for _ in inboxes]
    interrupted = False
    deadline: float | None = None

    async def next_message(w: int) -> tuple[int, tuple[Any, ...]]:
        return w, await inboxes[w].get()

    pending = {asyncio.ensure_future(next_message(w)) for w in range(len(inboxes))}
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            # asyncio.wait never cancels what it waits on, so no message is lost here.
            done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # Ctrl-C: stop the workers, keep collecting
            interrupted = True
            deadline = time.monotonic() + STOP_TIMEOUT_S
            for w in _open(inboxes, outcomes, failures):
                inboxes[w].send("stop")
            uncancel_current_task()  # handled: the partial result is returned
            continue
        if not done:  # the stop deadline passed
            for fut in pending:
                fut.cancel()
            for w in _open(inboxes, outcomes, failures):
                procs[w].kill()
                failures[w] = f"(pid {procs[w].pid}) did not return within {STOP_TIMEOUT_S:g} s after stop"
            break
        for fut in done:
            w, msg = fut.result()
            if msg[0] == "progress":
                ok, failed = msg[1], msg[2]
                for _ in range(ok - seen[w][0]):
                    progress.update(True)
                for _ in range(failed - seen[w][1]):
                    progress.update(False)
                seen[w] = [ok, failed]
                pending.add(asyncio.ensure_future(next_message(w)))
            elif msg[0] == "done":
                outcomes[w] = msg[1]
            else:  # eof: the worker died before handing back its records
                procs[w].join(timeout=1)
                failures[w] = f"(pid {procs[w].pid}) died (exit code {procs[w].exitcode})"
    progress.close()
    return outcomes, failures, interrupted


def _open(inboxes: list[_Inbox], outcomes: dict[int, WorkerOutcome], failures: dict[int, str]) -> list[int]:
    return [w for w in range(len(inboxes)) if w not in outcomes and w not in failures]
