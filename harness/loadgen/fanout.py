"""Where the load comes from: this process, N worker processes (``--workers``) or Ray actors (``--ray``).

The runner keeps warmup and the /metrics scrapes; this module only runs
the timed load and hands back one ``LoadOutcome`` whatever produced it,
plus the client-bottleneck guard's verdict on it.

--max-concurrency with several workers: the limit is shared out, each
worker enforcing its share (the shares add up to the limit, so the total
in flight never exceeds it). A request can then wait for a slot in its own
worker while another worker has one free, so under a binding limit the
dispatch lag can be a little higher than one process's. A limit below the
number of workers is refused; ``auto`` takes at most as many workers as
the limit.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Protocol

from harness.loadgen import guard
from harness.loadgen.client import RequestRecord
from harness.loadgen.workers import LoadOutcome, WorkerCount, auto_workers, is_local_url, split_limit
from harness.workloads.sample import SampleRequest


class FanoutSettings(Protocol):
    """The LoadSettings fields used here (runner.LoadSettings has them)."""

    @property
    def workers(self) -> WorkerCount: ...
    @property
    def ray(self) -> str | None: ...
    @property
    def request_timeout_s(self) -> float | None: ...
    @property
    def max_concurrency(self) -> int | None: ...
    @property
    def progress(self) -> bool | None: ...
    @property
    def progress_label(self) -> str: ...


def local_workers(workers: WorkerCount, url: str, max_concurrency: int | None) -> int:
    """Worker processes on this host; ``auto`` never exceeds --max-concurrency (each needs a slot)."""
    if workers != "auto":
        return workers
    n = auto_workers(local_server=is_local_url(url))
    return min(n, max_concurrency) if max_concurrency else n


def in_process(settings: FanoutSettings, url: str) -> bool:
    """True for today's single-process path (no --ray, one worker)."""
    return settings.ray is None and local_workers(settings.workers, url, settings.max_concurrency) == 1


def check_settings(workers: WorkerCount, ray: str | None, max_concurrency: int | None) -> None:
    """Refuse what cannot run, before anything is sent (ValueError with the flag's name)."""
    if ray is not None:
        from harness.loadgen.rayload import INSTALL_HINT

        if importlib.util.find_spec("ray") is None:  # importing it costs ~1 s; only ask whether it is there
            raise ValueError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}")
    if workers != "auto":  # auto adapts to the limit
        split_limit(max_concurrency, workers)


def single(records: list[RequestRecord], duration_s: float, interrupted: bool, loop_lag_s: list[float]) -> LoadOutcome:
    """The in-process run as a LoadOutcome."""
    return LoadOutcome(records, duration_s, interrupted, loop_lag_s, mode="in-process", workers=[])


async def run_fanout(
    url: str,
    chat: bool,
    workload: Sequence[SampleRequest],
    bodies: list[bytes],
    offsets: Sequence[float],
    settings: FanoutSettings,
) -> LoadOutcome:
    """The timed load from worker processes or Ray actors (raises workers.LoadWorkerError if they cannot start)."""
    records = [RequestRecord(i, s.prompt_len, s.expected_output_len, offsets[i]) for i, s in enumerate(workload)]
    if settings.ray is not None:
        from harness.loadgen.rayload import run_ray

        return await run_ray(
            url,
            chat,
            records,
            bodies,
            address=settings.ray,
            workers=settings.workers,
            timeout_s=settings.request_timeout_s,
            max_concurrency=settings.max_concurrency,
        )
    from harness.loadgen.pool import run_pool

    return await run_pool(
        url,
        chat,
        records,
        bodies,
        n_workers=local_workers(settings.workers, url, settings.max_concurrency),
        timeout_s=settings.request_timeout_s,
        max_concurrency=settings.max_concurrency,
        progress=settings.progress,
        progress_label=settings.progress_label,
    )


def health(
    load: LoadOutcome, request_rate: float, max_concurrency: int | None, server_behind_share: float | None = None
) -> guard.ClientHealth:
    """The guard's verdict on a load, however it was produced (``server_behind_share``: guard.assess)."""
    return guard.assess(
        load.records,
        load.loop_lag_s,
        request_rate=request_rate,
        max_concurrency=max_concurrency,
        mode=load.mode,
        workers=load.workers,
        barrier_spread_ms=load.barrier_spread_ms,
        barrier_uncertainty_ms=load.barrier_uncertainty_ms,
        server_behind_share=server_behind_share,
    )
