"""``--ray [ADDRESS]``: the same load worker (``workers.drive``) as Ray actors, for load from many hosts.

Ray is an optional extra (``pip install 'wirebench[distributed]'``), imported
only here and only when asked for. Every node needs wirebench installed in
the Python that Ray runs (e.g. the same container image).

Starting together without trusting clocks. Wall clocks of two hosts differ
(NTP keeps them within milliseconds at best), so no instant of one host is
ever sent to another:

1. each actor is created with its slice of the schedule (records and
   pre-encoded bodies) and answers ``ready()``; the driver waits for all;
2. the driver measures each actor's clock offset to its own (time.time()),
   NTP-style: the round trip with the smallest delay over CLOCK_PINGS pings
   gives offset = actor time − midpoint, known to ± half that round trip;
3. the driver calls ``run(START_DELAY_S)`` on every actor at once; each
   starts at the moment it received the call + START_DELAY_S, on its own
   monotonic clock.

Every duration in a record (TTFT, latency, chunk times) is measured on one
host, and planned/actual send offsets are relative to that worker's own
start, so skew never enters the metrics. What skew and dispatch jitter can
do is make the workers start at slightly different instants: each reports
the wall time it started, the driver maps it onto its own clock through the
measured offset, and the report gives the range (the barrier spread) with
its uncertainty (twice the largest half round trip).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from harness.loadgen.client import RequestRecord
from harness.loadgen.workers import (
    LoadOutcome,
    LoadWorkerError,
    WorkerCount,
    WorkerJob,
    WorkerOutcome,
    build_jobs,
    combine,
    drive,
    new_session,
    uncancel_current_task,
)
from harness.processes.heap import freeze_heap

INSTALL_HINT = "pip install 'wirebench[distributed]'"
START_DELAY_S = 0.25
CLOCK_PINGS = 5
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
ACTOR_CPUS = 1.0


def import_ray() -> Any:
    """The ray module, or LoadWorkerError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise LoadWorkerError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


class LoadActor:
    """One load worker on a Ray node (wrapped with ray.remote at run time).

    An async actor: Ray runs its methods on one event loop in the actor
    process, so the load runs there and stop() can cancel it while run() waits.
    """

    def __init__(self, job: WorkerJob) -> None:
        self.job = job
        self._task: asyncio.Task[WorkerOutcome] | None = None
        self._stopped = False

    async def ready(self) -> tuple[str, int]:
        freeze_heap()  # as benchmark_serving does; before the barrier: a collection now cannot delay the start
        return socket.gethostname(), os.getpid()

    async def clock(self) -> float:
        return time.time()

    async def run(self, delay_s: float) -> WorkerOutcome:
        origin = time.perf_counter() + delay_s  # receipt + delay, on this host's clock
        async with new_session() as session:
            self._task = asyncio.ensure_future(drive(session, self.job, origin))
            if self._stopped:
                self._task.cancel()
            return await self._task

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()


def connect(address: str) -> bool:
    """ray.init unless already connected; True when this call connected (so it disconnects after)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    # "" keeps ray.init's own default: RAY_ADDRESS, else a cluster started on this host, else a new local one.
    ray.init(address=address or None)
    return True


def resolve_count(workers: WorkerCount) -> int:
    """``auto`` under Ray: one actor per alive node."""
    if workers != "auto":
        return workers
    ray = import_ray()
    return max(1, sum(1 for node in ray.nodes() if node.get("Alive")))


async def _clock_offset(actor: Any) -> tuple[float, float]:
    """(offset of the actor's clock to ours, ± uncertainty) in seconds, best of CLOCK_PINGS."""
    best: tuple[float, float] | None = None
    for _ in range(CLOCK_PINGS):
        t0 = time.time()
        theirs = await actor.clock.remote()
        t1 = time.time()
        half = (t1 - t0) / 2
        if best is None or half < best[1]:
            best = (theirs - (t0 + half), half)
    assert best is not None
    return best


async def run_ray(
    url: str,
    chat: bool,
    records: list[RequestRecord],
    bodies: list[bytes],
    *,
    address: str,
    workers: WorkerCount,
    timeout_s: float | None,
    max_concurrency: int | None,
) -> LoadOutcome:
    """Run the load from Ray actors; records come back in request order."""
    ray = import_ray()
    connected_here = connect(address)
    actors: list[Any] = []
    try:
        n = resolve_count(workers)
        if workers == "auto" and max_concurrency:
            n = min(n, max_concurrency)  # auto adapts to the limit: each actor needs a slot
        try:
            jobs = build_jobs(url, chat, timeout_s, max_concurrency, records, bodies, n)
        except ValueError as exc:
            raise LoadWorkerError(str(exc)) from None
        remote_cls = ray.remote(LoadActor).options(num_cpus=ACTOR_CPUS, max_concurrency=3, scheduling_strategy="SPREAD")
        actors = [remote_cls.remote(job) for job in jobs]
        try:
            await asyncio.wait_for(asyncio.gather(*(a.ready.remote() for a in actors)), READY_TIMEOUT_S)
        except TimeoutError:
            raise LoadWorkerError(
                f"{n} Ray load actor(s) of {ACTOR_CPUS:g} CPU each were not ready within {READY_TIMEOUT_S:g} s "
                f"(cluster resources: {ray.cluster_resources()}); nothing was sent"
            ) from None
        offsets = [await _clock_offset(a) for a in actors]
        runs = [a.run.remote(START_DELAY_S) for a in actors]
        outcomes, failures, interrupted = await _collect(ray, actors, runs)
    finally:
        for actor in actors:
            ray.kill(actor)
        if connected_here:
            ray.shutdown()
    starts = {w: o.start_wall - offsets[w][0] for w, o in outcomes.items()}
    uncertainty = 2 * max((offsets[w][1] for w in outcomes), default=0.0)
    return combine(
        len(records),
        jobs,
        outcomes,
        failures,
        mode="ray",
        interrupted=interrupted,
        start_offsets_s=starts,
        uncertainty_ms=uncertainty * 1000.0,
    )


async def _collect(
    ray: Any, actors: Sequence[Any], runs: Sequence[Any]
) -> tuple[dict[int, WorkerOutcome], dict[int, str], bool]:
    """Await every actor's outcome; on cancellation, stop them and still collect."""
    futures = [asyncio.ensure_future(_outcome(ref)) for ref in runs]
    interrupted = False
    try:
        await asyncio.wait(futures)
    except asyncio.CancelledError:  # Ctrl-C: stop the actors, keep what they return
        interrupted = True
        for actor in actors:
            actor.stop.remote()
        await asyncio.wait(futures, timeout=STOP_TIMEOUT_S)
        uncancel_current_task()
    outcomes: dict[int, WorkerOutcome] = {}
    failures: dict[int, str] = {}
    for w, fut in enumerate(futures):
        if not fut.done():
            fut.cancel()
            failures[w] = f"(Ray actor) did not return within {STOP_TIMEOUT_S:g} s after stop"
            continue
        outcome, error = fut.result()
        if outcome is not None:
            outcomes[w] = outcome
        else:
            failures[w] = f"(Ray actor) failed: {error}"
    return outcomes, failures, interrupted


async def _outcome(ref: Any) -> tuple[WorkerOutcome | None, str]:
    try:
        return await ref, ""
    except Exception as exc:  # RayActorError, RayTaskError: the slice counts as failed
        # A RayTaskError's text is the remote traceback: its last line names the error.
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return None, f"{type(exc).__name__}: {lines[-1].strip() if lines else ''}"[:300]
