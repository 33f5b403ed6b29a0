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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from harness.loadgen import conversations, fanout, guard, ipc
from harness.loadgen import metrics as M
from harness.loadgen.arrivals import offered_rates, own_times, planned_offsets
from harness.loadgen.client import (
    ENDPOINTS,
    RequestRecord,
    build_payload,
    encode_payload,
    is_chat,
    send_request,
)
from harness.loadgen.looplag import LoopLagProbe
from harness.loadgen.progress import Progress
from harness.loadgen.saturation import KeptUp, kept_up
from harness.loadgen.serverstats import (
    CodecFigures,
    codec_figures,
    codec_name,
    outputs_behind_share,
    scrape_metrics,
)
from harness.loadgen.settings import BenchmarkError, LoadSettings
from harness.loadgen.sglang_spans import SglangSpans
from harness.loadgen.vllm_spans import PluginSpans
from harness.loadgen.workers import (
    LoadWorkerError,
    send_on_schedule,
    send_within,
    uncancel_current_task,
)
from harness.processes.heap import freeze_heap
from harness.processes.jsonl_records import FLUSH_S
from harness.server_metrics import engine_info, prometheus
from harness.wire.spans import IpcBudget
from harness.workloads.sample import SampleRequest

DEFAULT_RESULT_DIR = "results"  # where run and compare documents go unless --result-dir says
# Wait before a /metrics scrape of a wirebench server: the engine's codec
# counters arrive with its idle heartbeat (sent after 0.25 s without outputs),
# so a scrape right after the last request would miss the engine's share.
SCRAPE_SETTLE_S = 0.6


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
    engine: dict[str, Any] | None = (
        None  # the engine's account of itself from /metrics (harness.server_metrics.engine_info)
    )
    # CPU of the client, frontend and engine over the run (harness.loadgen.process_cpu.usage); None when
    # the server's processes were not known (bench load against a URL).
    process_cpu: dict[str, Any] | None = None
    # Filled by the caller when known (the CLI sets them).
    tokenizer_id: str | None = None
    flags: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # Every request went at its own send time (a trace's timestamps): the rate and burstiness
    # settings played no part, so the run had no planned rate.
    own_send_times: bool = False

    @property
    def backend(self) -> str:
        """benchmark_serving's backend name for the endpoint used."""
        return "openai-chat" if is_chat(self.settings.endpoint) else "openai"

    @property
    def failed(self) -> int:
        return self.metrics.failed

    @property
    def saturation(self) -> KeptUp | None:
        """Whether the server kept up with the offered rate (harness.loadgen.saturation); None at rate inf."""
        return kept_up(conversations.first_turns(self.records), int(self.flags.get("block_size") or 0))


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
    if not is_chat(endpoint) and conversations.is_conversation(workload):
        raise BenchmarkError(
            f"a multi-turn conversation sends its chat as a list of messages: use --endpoint /v1/chat/completions "
            f"(got {endpoint})"
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
        if load.conversations is not None or fanout.in_process(settings, load.url):  # conversations: here
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
        ramp = settings.ramp
        self.offsets = planned_offsets(workload, settings.request_rate, settings.burstiness, settings.seed, ramp)
        self.offered = offered_rates(workload, settings.request_rate, ramp)  # each record's offered_rps
        # A multi-turn workload's turns wait for each other's answers; None for independent requests.
        self.conversations = conversations.ConversationLoad.of(workload, settings)
        if self.conversations is not None:
            self.offered = self.conversations.offered
        self.own_send_times = own_times(workload)  # what planned_offsets went by, for the run file
        self.started_at = datetime.now().astimezone()
        self.records: list[RequestRecord] = []
        self.unsent: Sequence[int] = range(len(workload))  # what no block has sent yet
        self.blocks: list[list[RequestRecord]] = []  # each block's records as sent: its window of output steps
        self.duration = 0.0
        self.interrupted = False
        self.warmup_failed = 0
        self.before: str | None = None
        self.wirebench = False
        self.cursor: Any = None
        # A real server's timings, written by wirebench's code inside it (harness.loadgen.vllm_spans,
        # harness.loadgen.sglang_spans); None otherwise.
        self.plugin: PluginSpans | SglangSpans | None = None
        if settings.vllm_spans:
            self.plugin = PluginSpans(settings.vllm_spans)
        elif settings.sglang_spans:
            self.plugin = SglangSpans(settings.sglang_spans)
        self.plugin_cursor: dict[str, int] = {}
        self.origin: float | None = None  # perf_counter at the first block's start: the records' zero
        self.loop_lag_s: list[float] = []  # the guard's event-loop lag, sampled while blocks run
        self.outcome: fanout.LoadOutcome | None = None

    async def begin(self) -> None:
        """Warm up (raises BenchmarkError when every warmup request failed), then count before."""
        s = self.settings
        try:
            self.warmup_failed = await _warmup(self.session, self.url, self.bodies, self.workload, s, self.chat)
        except BenchmarkError as exc:
            # A real vLLM answers a request its codec cannot carry 500 with no message; the plugin says why.
            if self.plugin is None:
                raise
            await asyncio.sleep(2 * FLUSH_S)  # the plugin writes its records every FLUSH_S
            refusals = self.plugin.refusals()
            if not refusals:
                raise
            raise BenchmarkError(f"{exc}; the codec: {refusals[0]}", exc.records, refusals[0]) from None
        self.before = await scrape_metrics(self.session, self.base_url)
        # Only wirebench's server needs the settle wait; others (vLLM) are not slowed.
        self.wirebench = exposes_codec_counters(self.before)
        if self.wirebench:
            await _settle()
            self.before = await scrape_metrics(self.session, self.base_url)
        self.cursor = await ipc.spans_cursor(self.session, self.base_url) if self.wirebench else None
        if self.plugin is not None:  # a real vLLM with wirebench's plugin: its warmup's timings are not the run's
            await _settle()
            self.plugin_cursor = self.plugin.cursor()

    async def send_block(self, start: int, stop: int) -> bool:
        """Requests start..stop-1 on their schedule, the block's first sent now; waits for all of
        them. Returns whether it was interrupted (then nothing more should be sent)."""
        base = self.offsets[start]
        probe = LoopLagProbe.start()  # as every worker measures it
        if self.conversations is not None:  # the conversations that start in the block, whole
            sent = self.conversations.send(self.session, self.url, self.model, start, stop, self.origin)
        else:
            planned = [(i, self.offsets[i] - base) for i in range(start, stop)]
            sent = _run_load(
                self.session, self.url, self.bodies, self.workload, planned, self.settings, self.chat, self.origin
            )
        records, duration, interrupted, self.origin = await sent
        self.loop_lag_s += probe.stop()
        self.records += records
        self.blocks.append(records)
        recorded = {r.index for r in self.records}  # a conversation's later turns may lie past the block
        self.unsent = [i for i in range(stop, len(self.workload)) if i not in recorded]
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
        if (self.wirebench or self.plugin is not None) and not self.interrupted:
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
        for record in records:  # however they were sent (blocks, workers, never), by workload index
            record.offered_rps = self.offered[record.index]
        load = self.outcome or fanout.single(records, self.duration, self.interrupted, self.loop_lag_s)
        served = [r.server_id for r in records if r.success]
        figures = codec_figures(self.before, after)
        budget: IpcBudget | None
        windows = ipc.block_windows(self.blocks)  # per block sent, its time on the server's clock
        if self.plugin is not None:
            figures, budget = self.plugin.figures(self.plugin_cursor, served, windows)
        else:
            budget = await ipc.fetch_budget(self.session, self.base_url, self.cursor, served, windows)
        if budget is not None:
            for record in records:
                record.codec_us = budget.codec_us.get(record.server_id, math.nan)
                record.codec_wire_us = budget.codec_wire_us.get(record.server_id, math.nan)
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
            codec=codec_name(after) or codec_name(self.before) or (figures.codec if figures else None),
            payload_kind=payload_kind(self.workload),
            num_prompts=len(self.workload),
            started_at=self.started_at,
            interrupted=self.interrupted,
            warmup_failed=self.warmup_failed,
            own_send_times=self.own_send_times,
            codec_figures=figures,
            # A real server's processes as wirebench's code inside them saw them (codec or IPC mode, clock,
            # vLLM's opt-in, ipc held), under vllm_plugin or sglang_hook; a conversation's figures by turn.
            extra={
                **({self.plugin.metadata_key: self.plugin.roles()} if self.plugin is not None else {}),
                **({"turns": conversations.by_turn(records)} if self.conversations else {}),
            },
            client_health=fanout.health(
                load, settings.peak_rate, settings.max_concurrency, outputs_behind_share(self.before, after)
            ),
            ipc=budget,
            engine=engine_info.with_device_time(
                engine_info.with_step_counts(
                    engine_info.from_metrics(after) or engine_info.from_metrics(self.before), self.before, after
                ),
                budget.device if budget is not None else None,
            ),
        )


def exposes_codec_counters(metrics_text: str | None) -> bool:
    """True when a /metrics scrape carries wirebench's codec counters."""
    return metrics_text is not None and any(
        name == prometheus.CODEC_MESSAGES for name, _ in prometheus.parse(metrics_text)
    )


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
