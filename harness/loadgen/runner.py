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
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import aiohttp

from harness.loadgen import fanout, guard, ipc
from harness.loadgen import metrics as M
from harness.loadgen.arrivals import planned_offsets, positive_float
from harness.loadgen.client import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    ENDPOINTS,
    RequestRecord,
    build_payload,
    encode_payload,
    is_chat,
    send_request,
)
from harness.loadgen.looplag import LoopLagProbe
from harness.loadgen.progress import Progress
from harness.loadgen.serverstats import (
    CodecFigures,
    codec_figures,
    codec_name,
    outputs_behind_share,
    scrape_metrics,
)
from harness.loadgen.workers import (
    LoadWorkerError,
    WorkerCount,
    parse_workers,
    send_on_schedule,
    send_within,
    uncancel_current_task,
)
from harness.wire import declare, prom, runs_on
from harness.wire.declare import setting
from harness.wire.heap import freeze_heap
from harness.wire.messages import MAX_LOGPROBS
from harness.wire.spans import IpcBudget
from harness.workloads.sample import SampleRequest

DEFAULT_REQUEST_TIMEOUT_S = 600.0
DEFAULT_RESULT_DIR = "results"  # where run and compare documents go unless --result-dir says
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
    """The load flags, validated; built from an argparse namespace. A field declared with ``setting``
    is its own flag (harness.wire.declare, added by harness.loadgen.flags); the others are read from
    flags that transform their value (--request-timeout, --percentile-metrics, ...) by ``from_args``.
    """

    endpoint: str = setting(
        COMPLETIONS,
        flag="--endpoint",
        choices=ENDPOINTS,
        help=f"API endpoint (default {COMPLETIONS}); image workloads need {CHAT_COMPLETIONS}",
        comparable=True,
    )
    request_rate: float = math.inf
    burstiness: float = setting(
        1.0,
        flag="--burstiness",
        type=positive_float,
        help="gamma shape of the arrival intervals: 1.0 = Poisson, <1 burstier, >1 more regular",
        comparable=True,
    )
    seed: int | None = 0  # the dataset flags own --seed: it seeds the arrivals too
    max_concurrency: int | None = setting(
        None,
        flag="--max-concurrency",
        type=int,
        help="at most this many requests in flight; a request whose planned time has come "
        "waits for a slot, which shows up as schedule lag",
        comparable=True,
    )
    selected_metrics: tuple[str, ...] = M.DEFAULT_PERCENTILE_METRICS
    percentiles: tuple[float, ...] = M.DEFAULT_PERCENTILES
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    warmup_requests: int = setting(
        0, flag="--warmup-requests", help="requests sent before the clock starts and not counted (default 0)"
    )
    # In seconds; the flag's 0 (no limit) reads back as None.
    request_timeout_s: float | None = setting(
        DEFAULT_REQUEST_TIMEOUT_S,
        flag="--request-timeout",
        help=f"seconds a request may take in all; 0 = no limit (default {DEFAULT_REQUEST_TIMEOUT_S:g})",
    )
    continuous_usage: bool = setting(
        True,
        flag="--no-continuous-usage",
        help="do not ask for usage in every chunk (stream_options.continuous_usage_stats); "
        "then each non-empty chunk counts as one token",
    )
    # Top logprobs per token asked of the server (vLLM benchmark's --logprobs).
    logprobs: int | None = setting(
        None,
        flag="--logprobs",
        type=int,
        metavar="K",
        help="ask for the top-K logprobs of every output token (completions: logprobs=K; chat: logprobs=true, "
        "top_logprobs=K), as vLLM's benchmark_serving --logprobs: heavier outputs on the wire (default: none)",
        comparable=True,
    )
    progress: bool | None = None  # None: when stderr is a TTY
    progress_label: str = "requests"  # bench run names the arm and round here
    # Client processes (or "auto"), and the Ray address ("" = ray.init's default; None = no Ray): see fanout.
    workers: WorkerCount = setting(
        1,
        flag="--workers",
        type=parse_workers,
        metavar="N|auto",
        help="client processes sharing the schedule (round-robin) and one start instant; metrics are computed "
        "once from all raw records. auto: half the usable CPUs for a server on this host (loopback URL), all but "
        "one for a remote one, 1..8; with --ray one actor per node. --max-concurrency is shared out among them "
        "(default 1: this process)",
    )
    ray: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadSettings:
        """Read the flags of add_load_arguments; a missing attribute, or None, takes its default."""
        d = cls()
        given = {k: v for k, v in vars(args).items() if v is not None}

        def get(name: str, default: Any) -> Any:
            return given.get(name, default)

        declared = declare.from_values(cls, given)  # endpoint is validated by check_endpoint
        max_conc = declared.max_concurrency
        if max_conc is not None and max_conc < 1:
            raise BenchmarkError(f"--max-concurrency must be >= 1, got {max_conc}")
        logprobs = declared.logprobs
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise BenchmarkError(f"--logprobs must be in [0, {MAX_LOGPROBS}] (OpenAI's limit), got {logprobs}")
        if declared.warmup_requests < 0:
            raise BenchmarkError(f"--warmup-requests must be >= 0, got {declared.warmup_requests}")
        goodput = get("goodput", None) or []
        timeout = declared.request_timeout_s
        if get("no_progress", False):
            progress: bool | None = False
        elif get("progress", False):
            progress = True
        else:
            progress = None
        try:
            metrics_sel = get("percentile_metrics", ",".join(d.selected_metrics))
            pcts = get("metric_percentiles", "99")
            fanout.check_settings(declared.workers, get("ray", None), max_conc)
            return replace(
                declared,
                request_rate=float(get("request_rate", d.request_rate)),
                seed=getattr(args, "seed", d.seed),
                selected_metrics=M.parse_percentile_metrics(metrics_sel)
                if isinstance(metrics_sel, str)
                else tuple(metrics_sel),
                percentiles=M.parse_percentiles(pcts) if isinstance(pcts, str) else tuple(float(p) for p in pcts),
                goodput_slos_ms=M.parse_goodput(goodput) if not isinstance(goodput, dict) else dict(goodput),
                request_timeout_s=float(timeout) if timeout and timeout > 0 else None,
                progress=progress,
                progress_label=str(get("progress_label", d.progress_label)),
                ray=get("ray", None),
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
    engine: dict[str, Any] | None = None  # the engine's account of itself from /metrics (harness.wire.runs_on)
    # CPU of the client, frontend and engine over the run (harness.loadgen.process_cpu.usage); None when
    # the server's processes were not known (bench load against a URL).
    process_cpu: dict[str, Any] | None = None
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
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        load = ServerLoad(session, base_url, model, workload, settings)
        await load.begin()
        if fanout.in_process(settings, load.url):
            await load.send_block(0, len(workload))
        else:  # --workers N / --ray: the same schedule sent from other processes or hosts
            await load.send_fanout()
        return await load.finish()


class ServerLoad:
    """One server's part of a benchmark, in three steps: ``begin`` (warm up, count before);
    ``send_block`` once for the whole workload (run_benchmark) or once per block of it (bench
    run --block-size: the arms take turns), or ``send_fanout`` (--workers/--ray); ``finish``
    (count after, compute). Record times count from the first block's start."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        model: str,
        workload: list[SampleRequest],
        settings: LoadSettings,
    ) -> None:
        if not workload:
            raise BenchmarkError("the workload is empty")
        check_endpoint(workload, settings.endpoint)
        self.session, self.base_url, self.model = session, base_url, model
        self.workload, self.settings = workload, settings
        self.url = base_url.rstrip("/") + settings.endpoint
        self.chat = is_chat(settings.endpoint)
        self.bodies = [
            encode_payload(
                build_payload(
                    s, model, settings.endpoint, continuous_usage=settings.continuous_usage, logprobs=settings.logprobs
                )
            )
            for s in workload
        ]
        self.offsets = planned_offsets(workload, settings.request_rate, settings.burstiness, settings.seed)
        self.started_at = datetime.now().astimezone()
        self.records: list[RequestRecord] = []
        self.unsent = range(len(workload))  # what no block has sent yet
        self.duration = 0.0
        self.interrupted = False
        self.warmup_failed = 0
        self.before: str | None = None
        self.wirebench = False
        self.cursor: Any = None
        self.origin: float | None = None  # perf_counter at the first block's start: the records' zero
        self.loop_lag_s: list[float] = []  # the guard's event-loop lag, sampled while blocks run
        self.outcome: fanout.LoadOutcome | None = None

    async def begin(self) -> None:
        """Warm up (raises BenchmarkError when every warmup request failed), then count before."""
        s = self.settings
        self.warmup_failed = await _warmup(self.session, self.url, self.bodies, self.workload, s, self.chat)
        self.before = await scrape_metrics(self.session, self.base_url)
        # Only wirebench's server needs the settle wait; others (vLLM) are not slowed.
        self.wirebench = exposes_codec_counters(self.before)
        if self.wirebench:
            await _settle()
            self.before = await scrape_metrics(self.session, self.base_url)
        self.cursor = await ipc.spans_cursor(self.session, self.base_url) if self.wirebench else None

    async def send_block(self, start: int, stop: int) -> bool:
        """Requests start..stop-1 on their schedule, the block's first sent now; waits for all of
        them. Returns whether it was interrupted (then nothing more should be sent)."""
        base = self.offsets[start]
        probe = LoopLagProbe.start()  # as every worker measures it
        records, duration, interrupted, self.origin = await _run_load(
            self.session,
            self.url,
            self.bodies,
            self.workload,
            [(i, self.offsets[i] - base) for i in range(start, stop)],
            self.settings,
            self.chat,
            self.origin,
        )
        self.loop_lag_s += probe.stop()
        self.records += records
        self.unsent = range(stop, len(self.workload))
        self.duration += duration
        self.interrupted = self.interrupted or interrupted
        return interrupted

    def _cancelled(self, i: int) -> RequestRecord:
        s = self.workload[i]
        rec = RequestRecord(i, s.prompt_len, s.expected_output_len, math.nan)  # never scheduled
        rec.error = "cancelled"
        return rec

    async def send_fanout(self) -> None:
        """The whole workload from other processes or hosts (--workers N / --ray)."""
        try:
            self.outcome = await fanout.run_fanout(
                self.url, self.chat, self.workload, self.bodies, self.offsets, self.settings
            )
        except LoadWorkerError as exc:
            raise BenchmarkError(str(exc)) from None
        self.records, self.duration = self.outcome.records, self.outcome.duration_s
        self.interrupted = self.outcome.interrupted

    async def finish(self) -> BenchmarkResult:
        """Count after (once the engine's counters arrived), then compute the result."""
        if self.wirebench and not self.interrupted:
            try:
                await _settle()
            except asyncio.CancelledError:  # Ctrl-C now: keep the finished run
                self.interrupted = True
                uncancel_current_task()
        after = await scrape_metrics(self.session, self.base_url)
        if self.interrupted and self.outcome is None:  # blocks never sent are requests lost to Ctrl-C
            self.records += [self._cancelled(i) for i in self.unsent]
            self.unsent = range(0)
        records = self.records
        load = self.outcome or fanout.single(records, self.duration, self.interrupted, self.loop_lag_s)
        budget = await ipc.fetch_budget(
            self.session, self.base_url, self.cursor, [r.server_id for r in records if r.success]
        )
        settings = self.settings
        result_metrics = M.compute_metrics(
            records,
            self.duration,
            selected_metrics=settings.selected_metrics,
            percentiles=settings.percentiles,
            goodput_slos_ms=settings.goodput_slos_ms,
        )
        return BenchmarkResult(
            metrics=result_metrics,
            records=records,
            settings=settings,
            base_url=self.base_url,
            model=self.model,
            codec=codec_name(after) or codec_name(self.before),
            payload_kind=payload_kind(self.workload),
            num_prompts=len(self.workload),
            started_at=self.started_at,
            interrupted=self.interrupted,
            warmup_failed=self.warmup_failed,
            codec_figures=codec_figures(self.before, after),
            client_health=fanout.health(
                load, settings.request_rate, settings.max_concurrency, outputs_behind_share(self.before, after)
            ),
            ipc=budget,
            engine=runs_on.with_step_counts(
                runs_on.from_metrics(after) or runs_on.from_metrics(self.before), self.before, after
            ),
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
    planned: list[tuple[int, float]],
    settings: LoadSettings,
    chat: bool,
    run_origin: float | None = None,
) -> tuple[list[RequestRecord], float, bool, float]:
    """Send each (index, offset) of ``planned`` at its offset from the start (once the client's GC is
    settled); wait for all. Record times count from ``run_origin`` (a perf_counter value; default this
    start). Returns the records, the seconds from the start until the last finished, whether Ctrl-C
    stopped it, and the origin used."""
    slots = asyncio.Semaphore(settings.max_concurrency) if settings.max_concurrency else None
    # As benchmark_serving does: collect now and keep the prepared workload out
    # of later collections, so GC pauses in the client are short.
    freeze_heap()
    started = time.perf_counter()
    origin = started if run_origin is None else run_origin
    records = [
        RequestRecord(i, workload[i].prompt_len, workload[i].expected_output_len, at + (started - origin))
        for i, at in planned
    ]
    progress = Progress(len(records), enabled=settings.progress, label=settings.progress_label)

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
    duration = time.perf_counter() - started
    progress.close()
    return records, duration, interrupted, origin
