"""``run_benchmark``: warm up, scrape /metrics, replay the workload, compute.

Everything that can be prepared is prepared before the clock starts: the
arrival schedule and every request body, serialized to bytes (images are
already data URLs in the workload). One aiohttp session with an unlimited
connector is shared by all requests, so the client adds no hidden queue;
--max-concurrency is the only limit and its wait shows up as schedule lag.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from harness import prom, runs_on
from harness.loadgen import fanout, guard, ipc
from harness.loadgen import metrics as M
from harness.loadgen.arrivals import plan_arrivals
from harness.loadgen.client import ENDPOINTS, RequestRecord, build_payload, encode_payload, is_chat, send_request
from harness.loadgen.looplag import LoopLagProbe
from harness.loadgen.progress import Progress
from harness.loadgen.serverstats import CodecFigures, codec_figures, codec_name, scrape_metrics
from harness.loadgen.workers import (
    LoadWorkerError,
    WorkerCount,
    send_on_schedule,
    send_within,
    uncancel_current_task,
)
from harness.spans import IpcBudget
from harness.workloads.sample import SampleRequest

DEFAULT_REQUEST_TIMEOUT_S = 600.0
# Wait before a /metrics scrape of a wirebench server: the engine's codec
# counters arrive with its idle heartbeat (sent after 0.25 s without outputs),
# so a scrape right after the last request would miss the engine's share.
SCRAPE_SETTLE_S = 0.6


class BenchmarkError(Exception):
    """The benchmark cannot run as asked (bad settings, warmup failed).

    ``records`` holds the failed warmup requests when that is the reason.
    """

    def __init__(self, message: str, records: list[RequestRecord] | None = None) -> None:
        super().__init__(message)
        self.records = records or []


@dataclass(frozen=True)
class LoadSettings:
    """The load flags, validated; built from an argparse namespace."""

    endpoint: str = "/v1/completions"
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int | None = 0
    max_concurrency: int | None = None
    selected_metrics: tuple[str, ...] = M.DEFAULT_PERCENTILE_METRICS
    percentiles: tuple[float, ...] = M.DEFAULT_PERCENTILES
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    warmup_requests: int = 0
    request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S
    continuous_usage: bool = True
    progress: bool | None = None  # None: when stderr is a TTY
    progress_label: str = "requests"  # bench run names the arm and round here
    # Client processes (or "auto"), and the Ray address ("" = ray.init's default; None = no Ray): see fanout.
    workers: WorkerCount = 1
    ray: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadSettings:
        """Read the flags of add_load_arguments; a missing attribute takes its default."""
        d = cls()

        def get(name: str, default: Any) -> Any:
            value = getattr(args, name, None)
            return default if value is None else value

        goodput = getattr(args, "goodput", None) or []
        timeout = get("request_timeout", d.request_timeout_s)
        max_conc = getattr(args, "max_concurrency", None)
        if max_conc is not None and max_conc < 1:
            raise BenchmarkError(f"--max-concurrency must be >= 1, got {max_conc}")
        endpoint = get("endpoint", d.endpoint)  # validated by check_endpoint
        warmup = int(get("warmup_requests", 0))
        if warmup < 0:
            raise BenchmarkError(f"--warmup-requests must be >= 0, got {warmup}")
        if getattr(args, "no_progress", False):
            progress: bool | None = False
        elif getattr(args, "progress", False):
            progress = True
        else:
            progress = None
        try:
            metrics_sel = get("percentile_metrics", ",".join(d.selected_metrics))
            pcts = get("metric_percentiles", "99")
            fanout.check_settings(get("workers", d.workers), getattr(args, "ray", None), max_conc)
            return cls(
                endpoint=endpoint,
                request_rate=float(get("request_rate", d.request_rate)),
                burstiness=float(get("burstiness", d.burstiness)),
                seed=getattr(args, "seed", d.seed),
                max_concurrency=max_conc,
                selected_metrics=M.parse_percentile_metrics(metrics_sel)
                if isinstance(metrics_sel, str)
                else tuple(metrics_sel),
                percentiles=M.parse_percentiles(pcts) if isinstance(pcts, str) else tuple(float(p) for p in pcts),
                goodput_slos_ms=M.parse_goodput(goodput) if not isinstance(goodput, dict) else dict(goodput),
                warmup_requests=warmup,
                request_timeout_s=float(timeout) if timeout and timeout > 0 else None,
                continuous_usage=not getattr(args, "no_continuous_usage", False),
                progress=progress,
                progress_label=str(get("progress_label", d.progress_label)),
                workers=get("workers", d.workers),
                ray=getattr(args, "ray", None),
            )
        except ValueError as exc:
            raise BenchmarkError(str(exc)) from None


@dataclass
class BenchmarkResult:
    """One run: its settings, per-request records, figures and codec costs."""

    metrics: M.BenchmarkMetrics
    records: list[RequestRecord]
    settings: LoadSettings
    base_url: str
    model: str
    # The server's codec (from /metrics codec_info), None for other servers.
    codec: str | None
    # "image" when any request carries images, else "text".
    payload_kind: str
    num_prompts: int
    started_at: datetime
    interrupted: bool = False
    warmup_failed: int = 0
    codec_figures: CodecFigures | None = None
    # The client-bottleneck guard's verdict (guard.py); None for results built by hand.
    client_health: guard.ClientHealth | None = None
    # Where IPC time went (harness.loadgen.ipc); None for a server without request timelines.
    ipc: IpcBudget | None = None
    engine: dict[str, Any] | None = None  # the engine's account of itself from /metrics (harness.runs_on)
    # Filled by the caller when known (the CLI sets them).
    tokenizer_id: str | None = None
    flags: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        """benchmark_serving's backend name for the endpoint used."""
        return "openai-chat" if is_chat(self.settings.endpoint) else "openai"

    @property
    def failed(self) -> int:
        return self.metrics.failed


def payload_kind(workload: list[SampleRequest]) -> str:
    return "image" if any(s.image_data_urls for s in workload) else "text"


def check_endpoint(workload: list[SampleRequest], endpoint: str) -> None:
    if endpoint not in ENDPOINTS:
        raise BenchmarkError(f"--endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    if not is_chat(endpoint) and any(s.image_data_urls for s in workload):
        raise BenchmarkError(
            f"the workload has images, which only the chat endpoint accepts: "
            f"use --endpoint /v1/chat/completions (got {endpoint})"
        )


async def run_benchmark(
    base_url: str,
    model: str,
    workload: list[SampleRequest],
    args: argparse.Namespace | LoadSettings,
) -> BenchmarkResult:
    """Warm up, scrape /metrics, send the workload on schedule, scrape again, compute.

    ``args`` is a namespace carrying add_load_arguments' flags (or a
    LoadSettings). Raises BenchmarkError for bad settings or when every
    warmup request failed. A cancellation (Ctrl-C) stops the run: requests
    in flight or not yet sent are recorded as failed with error "cancelled",
    and the partial result is returned with ``interrupted=True`` rather than
    the cancellation re-raised, so the caller can still save it.
    """
    settings = args if isinstance(args, LoadSettings) else LoadSettings.from_args(args)
    if not workload:
        raise BenchmarkError("the workload is empty")
    check_endpoint(workload, settings.endpoint)
    url = base_url.rstrip("/") + settings.endpoint
    chat = is_chat(settings.endpoint)
    bodies = [
        encode_payload(build_payload(s, model, settings.endpoint, continuous_usage=settings.continuous_usage))
        for s in workload
    ]
    offsets = plan_arrivals(len(workload), settings.request_rate, settings.burstiness, settings.seed)
    started_at = datetime.now().astimezone()

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        warmup_failed = await _warmup(session, url, bodies, workload, settings, chat)
        before = await scrape_metrics(session, base_url)
        # Only wirebench's server needs the settle wait; others (vLLM) are not slowed.
        wirebench = exposes_codec_counters(before)
        if wirebench:
            await _settle()
            before = await scrape_metrics(session, base_url)
        cursor = await ipc.spans_cursor(session, base_url) if wirebench else None
        if fanout.in_process(settings, url):
            probe = LoopLagProbe.start()  # the guard's event-loop lag, as every worker measures it
            records, duration, interrupted = await _run_load(session, url, bodies, workload, offsets, settings, chat)
            load = fanout.single(records, duration, interrupted, probe.stop())
        else:  # --workers N / --ray: the same schedule sent from other processes or hosts
            try:
                load = await fanout.run_fanout(url, chat, workload, bodies, offsets, settings)
            except LoadWorkerError as exc:
                raise BenchmarkError(str(exc)) from None
            records, duration, interrupted = load.records, load.duration_s, load.interrupted
        if wirebench and not interrupted:
            try:
                await _settle()
            except asyncio.CancelledError:  # Ctrl-C now: keep the finished run
                interrupted = True
                uncancel_current_task()
        after = await scrape_metrics(session, base_url)
        budget = await ipc.fetch_budget(session, base_url, cursor, [r.server_id for r in records if r.success])

    result_metrics = M.compute_metrics(
        records,
        duration,
        selected_metrics=settings.selected_metrics,
        percentiles=settings.percentiles,
        goodput_slos_ms=settings.goodput_slos_ms,
    )
    return BenchmarkResult(
        metrics=result_metrics,
        records=records,
        settings=settings,
        base_url=base_url,
        model=model,
        codec=codec_name(after) or codec_name(before),
        payload_kind=payload_kind(workload),
        num_prompts=len(workload),
        started_at=started_at,
        interrupted=interrupted,
        warmup_failed=warmup_failed,
        codec_figures=codec_figures(before, after),
        client_health=fanout.health(load, settings.request_rate, settings.max_concurrency),
        ipc=budget,
        engine=runs_on.with_step_counts(runs_on.from_metrics(after) or runs_on.from_metrics(before), before, after),
    )


def exposes_codec_counters(metrics_text: str | None) -> bool:
    """True when a /metrics scrape carries wirebench's codec counters."""
    return metrics_text is not None and any(name == prom.CODEC_MESSAGES for name, _ in prom.parse(metrics_text))


async def _settle() -> None:
    await asyncio.sleep(SCRAPE_SETTLE_S)


async def _warmup(
    session: aiohttp.ClientSession,
    url: str,
    bodies: list[bytes],
    workload: list[SampleRequest],
    settings: LoadSettings,
    chat: bool,
) -> int:
    """Send warmup requests (not counted); raise if every one failed."""
    n = settings.warmup_requests
    if n == 0:
        return 0
    limit = asyncio.Semaphore(settings.max_concurrency or n)
    origin = time.perf_counter()

    async def one(i: int) -> RequestRecord:
        j = i % len(bodies)
        rec = RequestRecord(-1 - i, workload[j].prompt_len, workload[j].expected_output_len, 0.0)
        async with limit:
            return await send_request(
                session, url, bodies[j], rec, origin=origin, chat=chat, timeout_s=settings.request_timeout_s
            )

    records = await asyncio.gather(*(one(i) for i in range(n)))
    failed = [r for r in records if not r.success]
    if len(failed) == n:
        raise BenchmarkError(f"all {n} warmup request(s) failed; first error: {failed[0].error}", failed)
    return len(failed)


async def _run_load(
    session: aiohttp.ClientSession,
    url: str,
    bodies: list[bytes],
    workload: list[SampleRequest],
    offsets: list[float],
    settings: LoadSettings,
    chat: bool,
) -> tuple[list[RequestRecord], float, bool]:
    records = [RequestRecord(i, s.prompt_len, s.expected_output_len, offsets[i]) for i, s in enumerate(workload)]
    slots = asyncio.Semaphore(settings.max_concurrency) if settings.max_concurrency else None
    progress = Progress(len(records), enabled=settings.progress, label=settings.progress_label)
    # As benchmark_serving does: collect now and keep the prepared workload out
    # of later collections, so GC pauses in the client are short.
    gc.collect()
    gc.freeze()
    origin = time.perf_counter()

    async def one(rec: RequestRecord) -> None:
        await send_within(
            slots, session, url, bodies[rec.index], rec, origin=origin, chat=chat, timeout_s=settings.request_timeout_s
        )
        lag_ms = None if math.isnan(rec.dispatched) else (rec.dispatched - rec.planned_send) * 1000
        progress.update(rec.success, lag_ms)

    try:
        interrupted = await send_on_schedule(records, origin, one)
    finally:
        gc.unfreeze()
    duration = time.perf_counter() - origin
    progress.close()
    return records, duration, interrupted
