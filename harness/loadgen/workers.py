"""One load worker's job, and splitting a run's schedule across many workers.

When one asyncio process cannot keep up with the schedule, the precomputed schedule
and the pre-encoded bodies are dealt round-robin to N workers (so every
worker's slice spans the whole run at 1/N of the rate), each worker sends
its slice at the planned offsets from a start instant it shares with the
others, and returns its raw ``RequestRecord``s. The caller computes the
metrics once from all of them (``metrics.compute_metrics``): percentiles
come from raw samples, never from merged summaries.

The same ``drive`` runs in a spawned process (``pool``) and in a Ray actor
(``rayload``). Every duration it records (TTFT, latency, chunk times) is
taken on the worker's own clock, so clocks of different hosts never meet in
one figure.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp

from harness.loadgen.client import RequestRecord, send_request
from harness.loadgen.guard import WorkerReport, percentile_ms
from harness.loadgen.looplag import LoopLagProbe

WorkerCount = int | Literal["auto"]
# Most client processes `auto` starts on one host (see auto_workers).
AUTO_MAX_WORKERS = 8


class LoadWorkerError(Exception):
    """The load workers could not start (nothing was sent), or Ray is missing."""


@dataclass
class WorkerJob:
    """What one worker sends: its records (global indices, planned offsets set) and their bodies."""

    worker: int
    url: str
    chat: bool
    timeout_s: float | None
    max_concurrency: int | None
    records: list[RequestRecord]
    bodies: list[bytes]


@dataclass
class WorkerOutcome:
    """What a worker hands back: raw records and its own view of the run."""

    worker: int
    records: list[RequestRecord]
    # Seconds from the worker's origin to its last request's end.
    end_s: float
    # How late the worker woke at its origin (its first possible send), seconds.
    start_late_s: float
    # time.time() when it woke: compared across hosts only through measured clock offsets.
    start_wall: float
    loop_lag_s: list[float] = field(default_factory=list)
    interrupted: bool = False
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)


@dataclass
class LoadOutcome:
    """All workers' records merged in request order, and how the load was produced."""

    records: list[RequestRecord]
    duration_s: float
    interrupted: bool
    loop_lag_s: list[float]
    mode: str  # "in-process", "processes" or "ray"
    workers: list[WorkerReport]
    # How far apart the workers actually started (None for one worker).
    barrier_spread_ms: float | None = None
    # The measurement's own uncertainty (0 on one host: one monotonic clock).
    barrier_uncertainty_ms: float | None = None


def parse_workers(text: str) -> WorkerCount:
    """argparse type for --workers: a positive integer or 'auto'."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a worker count: {text!r} (use a positive integer or 'auto')") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--workers must be >= 1 or 'auto', got {text!r}")
    return value


def usable_cpus() -> int:
    """CPUs this process may run on (honours taskset and cpusets), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def auto_workers(cpus: int | None = None, *, local_server: bool = True) -> int:
    """``--workers auto`` on one host, from the usable CPUs; between 1 and AUTO_MAX_WORKERS.

    Server on this host (a loopback URL): half the CPUs, since the server
    needs as much CPU as the client to stream the same chunks, and client
    processes that take its cores slow it down (scripts/studies/client_capacity/
    on this 2-core VM: one process stayed within 2 % of the true TTFT up to
    60 req/s, two processes only up to 10 req/s). Server elsewhere: all CPUs
    but one, left to the parent and the OS.
    """
    n = usable_cpus() if cpus is None else cpus
    want = n // 2 if local_server else n - 1
    return max(1, min(AUTO_MAX_WORKERS, want))


def is_local_url(url: str) -> bool:
    """True when the URL's host is this machine: loopback (127.0.0.0/8, ::1, localhost) or its own name."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == socket.gethostname().lower()


def split_round_robin(n_requests: int, n_workers: int) -> list[list[int]]:
    """Request indices per worker: request i goes to worker i mod N."""
    return [list(range(w, n_requests, n_workers)) for w in range(n_workers)]


def split_limit(limit: int | None, n_workers: int) -> list[int | None]:
    """--max-concurrency shared out: the shares add up to the limit, each at least 1."""
    if limit is None:
        return [None] * n_workers
    if limit < n_workers:
        raise ValueError(
            f"--max-concurrency {limit} is below the number of load workers ({n_workers}): "
            "each worker needs at least one slot; lower --workers"
        )
    base, extra = divmod(limit, n_workers)
    return [base + (1 if w < extra else 0) for w in range(n_workers)]


def build_jobs(
    url: str,
    chat: bool,
    timeout_s: float | None,
    max_concurrency: int | None,
    records: Sequence[RequestRecord],
    bodies: Sequence[bytes],
    n_workers: int,
) -> list[WorkerJob]:
    slices = split_round_robin(len(records), n_workers)
    limits = split_limit(max_concurrency, n_workers)
    return [
        WorkerJob(w, url, chat, timeout_s, limits[w], [records[i] for i in idx], [bodies[i] for i in idx])
        for w, idx in enumerate(slices)
    ]


def new_session() -> aiohttp.ClientSession:
    # Unlimited connector, as the in-process runner: the client adds no hidden queue.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


async def send_on_schedule(
    records: Sequence[RequestRecord], origin: float, send: Callable[[RequestRecord], Coroutine[Any, Any, None]]
) -> bool:
    """Start ``send(rec)`` at ``origin`` (a perf_counter value) + each record's planned offset; wait for all.

    Returns whether the load was interrupted: cancelling the task that runs
    this stops it, unsent and unfinished requests become failed "cancelled"
    records, and the cancellation counts as handled (the partial outcome is
    the caller's to return). The in-process runner and every worker use it.
    """
    tasks: list[asyncio.Task[None]] = []
    try:
        for rec in records:
            delay = origin + rec.planned_send - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec.dispatched = time.perf_counter() - origin
            tasks.append(asyncio.create_task(send(rec)))
        await asyncio.gather(*tasks)
        return False
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for rec in records:
            if not rec.success and not rec.error:
                rec.error = "cancelled"
        uncancel_current_task()
        return True


def uncancel_current_task() -> None:
    """The cancellation (Ctrl-C) was handled here: what was measured is kept and returned."""
    current = asyncio.current_task()
    if current is not None:
        current.uncancel()


async def send_within(
    slots: asyncio.Semaphore | None,
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    rec: RequestRecord,
    *,
    origin: float,
    chat: bool,
    timeout_s: float | None,
) -> None:
    """One request, holding one of ``slots`` (--max-concurrency) while it runs, if there are slots."""
    if slots is None:
        await send_request(session, url, body, rec, origin=origin, chat=chat, timeout_s=timeout_s)
        return
    async with slots:
        await send_request(session, url, body, rec, origin=origin, chat=chat, timeout_s=timeout_s)


async def drive(
    session: aiohttp.ClientSession,
    job: WorkerJob,
    origin: float,
    on_done: Callable[[bool], None] | None = None,
) -> WorkerOutcome:
    """Wait for ``origin`` (a perf_counter value shared by the workers), then send the job's records.

    Cancelling the task that runs it stops the load (see send_on_schedule).
    The caller freezes its heap (harness.processes.heap.freeze_heap) before the barrier, so no collection
    delays the start; worker processes end after the run, so nothing unfreezes it.
    """
    records = job.records
    slots = asyncio.Semaphore(job.max_concurrency) if job.max_concurrency else None
    body_of = {rec.index: body for rec, body in zip(records, job.bodies, strict=True)}
    interrupted = False
    probe = LoopLagProbe.start()

    async def one(rec: RequestRecord) -> None:
        await send_within(
            slots, session, job.url, body_of[rec.index], rec, origin=origin, chat=job.chat, timeout_s=job.timeout_s
        )
        if on_done is not None:
            on_done(rec.success)

    woke = time.perf_counter()
    woke_wall = time.time()
    try:
        delay = origin - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        woke = time.perf_counter()
        woke_wall = time.time()
    except asyncio.CancelledError:  # stopped before the start: nothing was sent
        interrupted = True
        for rec in records:
            rec.error = "cancelled"
        uncancel_current_task()
    if not interrupted:
        interrupted = await send_on_schedule(records, origin, one)
    end = time.perf_counter() - origin
    return WorkerOutcome(
        worker=job.worker,
        records=records,
        end_s=end,
        start_late_s=woke - origin,
        start_wall=woke_wall,
        loop_lag_s=probe.stop(),
        interrupted=interrupted,
    )


def dead_worker_records(job: WorkerJob, reason: str) -> list[RequestRecord]:
    """A worker that never returned: every request of its slice counts as failed, saying why.

    Whether some were sent cannot be known; none is counted as a success.
    """
    out = []
    for rec in job.records:
        rec.success = False
        rec.error = f"load worker {job.worker} {reason}; its records were lost"
        out.append(rec)
    return out


def merge(
    n_requests: int,
    jobs: Sequence[WorkerJob],
    outcomes: dict[int, WorkerOutcome],
    failures: dict[int, str],
) -> list[RequestRecord]:
    """All records in request order: returned ones, and failed ones for workers in ``failures``."""
    merged: list[RequestRecord | None] = [None] * n_requests
    for job in jobs:
        got = outcomes.get(job.worker)
        recs = (
            got.records if got is not None else dead_worker_records(job, failures.get(job.worker, "returned nothing"))
        )
        for rec in recs:
            merged[rec.index] = rec
    missing = [i for i, r in enumerate(merged) if r is None]
    if missing:
        raise RuntimeError(f"records missing after merging the workers' results: {missing[:10]}")
    return [r for r in merged if r is not None]


def worker_report(job: WorkerJob, outcome: WorkerOutcome | None, error: str = "") -> WorkerReport:
    if outcome is None:
        return WorkerReport(worker=job.worker, requests=len(job.records), error=error or "returned nothing")
    return WorkerReport(
        worker=job.worker,
        requests=len(job.records),
        host=outcome.host,
        pid=outcome.pid,
        start_late_ms=outcome.start_late_s * 1000.0,
        loop_lag_p99_ms=percentile_ms(outcome.loop_lag_s, 99),
    )


def combine(
    n_requests: int,
    jobs: Sequence[WorkerJob],
    outcomes: dict[int, WorkerOutcome],
    failures: dict[int, str],
    *,
    mode: str,
    interrupted: bool,
    start_offsets_s: dict[int, float],
    uncertainty_ms: float,
) -> LoadOutcome:
    """One LoadOutcome from the workers' outcomes.

    ``start_offsets_s``: when each worker started, on one common time axis
    (as well as it can be known); their range is the barrier spread.
    """
    records = merge(n_requests, jobs, outcomes, failures)
    lag = [x for o in outcomes.values() for x in o.loop_lag_s]
    duration = max((o.end_s for o in outcomes.values()), default=0.0)
    starts = list(start_offsets_s.values())
    spread = (max(starts) - min(starts)) * 1000.0 if len(starts) > 1 else None
    return LoadOutcome(
        records=records,
        duration_s=duration,
        interrupted=interrupted or any(o.interrupted for o in outcomes.values()),
        loop_lag_s=lag,
        mode=mode,
        workers=[worker_report(j, outcomes.get(j.worker), failures.get(j.worker, "")) for j in jobs],
        barrier_spread_ms=spread,
        barrier_uncertainty_ms=uncertainty_ms if spread is not None else None,
    )
