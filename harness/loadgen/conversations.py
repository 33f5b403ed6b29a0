"""Sending a multi-turn workload: each conversation's turns one after another, each with the chat so far.

A conversation's first turn follows the run's arrival schedule (``--request-rate``, ``--burstiness``, a
ramp: they plan conversation starts); each later turn is planned at its predecessor's end plus its think
time (``--conversation-think-time``), and sends the chat as it stands: the earlier user messages, the
assistant's answers as the server returned them, then its own message (``History``). Its body is built
and encoded when it is sent, since the answers are only known then: that JSON encoding runs on the
client's clock, as it must. ``--max-concurrency`` caps the turns in flight; a conversation thinking
holds no slot.

Every turn is accounted for. A failed turn ends its conversation: the turns after it are recorded as
failed, "not sent" and why, so a run's request count always adds up. A record carries its
``conversation`` and ``turn``, the ``request_bytes`` it sent, and as ``prompt_len`` the whole prompt's
tokens: the server's usage count when it reports one, else an estimate (the previous turn's prompt and
answer plus the new message).

``by_turn`` gives the figures per turn index the report prints and the run file keeps: how the cost of
moving a message grows as the chat it carries does.
"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp

from harness.loadgen.arrivals import offered_rates, planned_offsets
from harness.loadgen.client import RequestRecord, build_payload, encode_payload
from harness.loadgen.progress import Progress
from harness.loadgen.ramp import Ramp
from harness.loadgen.workers import send_on_schedule, send_within
from harness.processes.heap import freeze_heap
from harness.workloads.chat import user_message
from harness.workloads.multi_turn import ConversationTurn
from harness.workloads.registry import datasets
from harness.workloads.sample import SampleRequest

NOT_SENT = "not sent: an earlier turn of its conversation failed"


class ConversationSettings(Protocol):
    """The LoadSettings fields read here (harness.loadgen.settings imports this module)."""

    @property
    def endpoint(self) -> str: ...
    @property
    def request_rate(self) -> float: ...
    @property
    def burstiness(self) -> float: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def ramp(self) -> Ramp | None: ...
    @property
    def max_concurrency(self) -> int | None: ...
    @property
    def request_timeout_s(self) -> float | None: ...
    @property
    def continuous_usage(self) -> bool: ...
    @property
    def logprobs(self) -> int | None: ...
    @property
    def progress(self) -> bool | None: ...
    @property
    def progress_label(self) -> str: ...


@dataclass
class History:
    """One conversation's chat so far, as its next turn sends it."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    def prompt(self, message: str) -> tuple[dict[str, Any], ...]:
        """The messages of a turn whose new user message is ``message``: the chat so far, then it."""
        return (*self.messages, user_message(message))

    def answered(self, message: str, answer: str) -> None:
        """The turn of ``message`` got ``answer``, the assistant's text as the server returned it."""
        self.messages += [user_message(message), {"role": "assistant", "content": answer}]


def is_conversation(workload: Sequence[SampleRequest]) -> bool:
    return bool(workload) and all(isinstance(s, ConversationTurn) for s in workload)


def is_conversational(dataset_name: str | None) -> bool:
    """Whether the dataset of that --dataset-name sends conversations (False for a name not registered)."""
    return any(d.name == dataset_name and getattr(d, "conversational", False) for d in datasets())


def refusal(flags: Mapping[str, Any]) -> str | None:
    """Why parsed flags (by destination) cannot send their dataset's conversations; None when they can
    or the dataset has none."""
    if not is_conversational(flags.get("dataset_name")):
        return None
    why = "a multi-turn conversation's turns wait for each other's answers"
    if flags.get("block_size"):
        return f"--block-size cuts the workload into blocks of independent requests, but {why}: use --block-size 0"
    if flags.get("until_resolved"):
        return f"--until-resolved judges blocks of independent requests, but {why}: drop it"
    if flags.get("workers", 1) != 1 or flags.get("ray") is not None:
        return f"{why}, so this process sends them all: drop --workers/--ray"
    return None


def first_turns(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The records sent on the arrival schedule: every independent request, and each conversation's
    first turn (a later turn waits for its predecessor, not for the offered rate)."""
    return [r for r in records if not r.turn]


class ConversationLoad:
    """A conversational workload's plan (conversation starts on the arrival schedule) and its sending."""

    def __init__(self, workload: Sequence[ConversationTurn], settings: ConversationSettings) -> None:
        self.workload = workload
        self.settings = settings
        groups: dict[int, list[int]] = {}
        for i, turn in enumerate(workload):
            groups.setdefault(turn.conversation, []).append(i)
        # Each conversation's workload indices in turn order, conversations in the order they start.
        self.groups = sorted((sorted(g, key=lambda i: workload[i].turn) for g in groups.values()), key=min)
        self.group_of = {g[0]: g for g in self.groups}  # by its first turn's index
        firsts = [workload[g[0]] for g in self.groups]
        s = settings
        self.starts = planned_offsets(firsts, s.request_rate, s.burstiness, s.seed, s.ramp)
        rates = offered_rates(firsts, s.request_rate, s.ramp)
        self.offered = [math.nan] * len(workload)  # each turn offered its conversation's start rate
        for rate, group in zip(rates, self.groups):
            for i in group:
                self.offered[i] = rate

    @classmethod
    def of(cls, workload: Sequence[SampleRequest], settings: ConversationSettings) -> ConversationLoad | None:
        """The plan of a conversational workload; None for one of independent requests."""
        if not is_conversation(workload):
            return None
        return cls([s for s in workload if isinstance(s, ConversationTurn)], settings)

    async def send(
        self,
        session: aiohttp.ClientSession,
        url: str,
        model: str,
        start: int,
        stop: int,
        run_origin: float | None = None,
    ) -> tuple[list[RequestRecord], float, bool, float]:
        """Every conversation whose first turn is among workload indices start..stop-1, whole, the first
        sent now; waits for all. Returns what the runner's ``_run_load`` does: the records (every turn of
        those conversations, in workload order), the seconds until the last ended, whether Ctrl-C stopped
        it, and the origin of the record times (``run_origin``, default this start)."""
        chosen = [c for c, g in enumerate(self.groups) if start <= g[0] < stop]
        if not chosen:
            return [], 0.0, False, time.perf_counter() if run_origin is None else run_origin
        freeze_heap()  # as _run_load: the prepared workload kept out of the client's collections
        started = time.perf_counter()
        origin = started if run_origin is None else run_origin
        base = self.starts[chosen[0]]
        records = {i: self._record(i) for c in chosen for i in self.groups[c]}
        firsts = []
        for c in chosen:
            first = records[self.groups[c][0]]
            first.planned_send = self.starts[c] - base + (started - origin)
            firsts.append(first)
        sender = _Sender(self, session, url, model, records, origin)
        try:
            interrupted = await send_on_schedule(firsts, origin, sender.converse)
        finally:
            gc.unfreeze()
        duration = time.perf_counter() - started
        sender.progress.close()
        for rec in records.values():
            if interrupted and not rec.success and not rec.error:
                rec.error = "cancelled"
        return [records[i] for i in sorted(records)], duration, interrupted, origin

    def _record(self, i: int) -> RequestRecord:
        turn = self.workload[i]
        return RequestRecord(
            i, turn.prompt_len, turn.expected_output_len, math.nan, conversation=turn.conversation, turn=turn.turn
        )


class _Sender:
    """Sends the conversations of one ``ConversationLoad.send``."""

    def __init__(
        self,
        load: ConversationLoad,
        session: aiohttp.ClientSession,
        url: str,
        model: str,
        records: dict[int, RequestRecord],
        origin: float,
    ) -> None:
        self.load, self.session, self.url, self.model = load, session, url, model
        self.records, self.origin = records, origin
        s = load.settings
        self.slots = asyncio.Semaphore(s.max_concurrency) if s.max_concurrency else None
        self.progress = Progress(len(records), enabled=s.progress, label=s.progress_label)

    async def converse(self, first: RequestRecord) -> None:
        """``first``'s conversation, turn after turn, until one fails (the rest then not sent)."""
        group = self.load.group_of[first.index]
        history = History()
        previous: RequestRecord | None = None
        for k, i in enumerate(group):
            rec = self.records[i]
            if previous is not None:
                await self._wait_for_turn(rec, previous)
            await self._send_turn(rec, history, previous)
            if not rec.success:
                for j in group[k + 1 :]:
                    self.records[j].error = NOT_SENT
                return
            history.answered(self.load.workload[i].prompt, rec.generated_text)
            previous = rec

    async def _wait_for_turn(self, rec: RequestRecord, previous: RequestRecord) -> None:
        """Until ``previous``'s end plus this turn's think time."""
        rec.planned_send = previous.actual_send + previous.latency + self.load.workload[rec.index].think_s
        delay = self.origin + rec.planned_send - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        rec.dispatched = time.perf_counter() - self.origin

    async def _send_turn(self, rec: RequestRecord, history: History, previous: RequestRecord | None) -> None:
        turn = self.load.workload[rec.index]
        s = self.load.settings
        sample = replace(turn, messages=history.prompt(turn.prompt))
        body = encode_payload(
            build_payload(sample, self.model, s.endpoint, continuous_usage=s.continuous_usage, logprobs=s.logprobs)
        )
        rec.request_bytes = len(body)
        if previous is not None:  # an estimate until the server counts it
            rec.prompt_len = previous.prompt_len + previous.output_tokens + turn.prompt_len
        await send_within(
            self.slots, self.session, self.url, body, rec, origin=self.origin, chat=True, timeout_s=s.request_timeout_s
        )
        if rec.prompt_tokens is not None:
            rec.prompt_len = rec.prompt_tokens
        lag_ms = None if math.isnan(rec.dispatched) else (rec.dispatched - rec.planned_send) * 1000
        self.progress.update(rec.success, lag_ms)


@dataclass(frozen=True)
class TurnFigures:
    """The requests of one turn index: how many, and the means over the successful ones."""

    turn: int
    requests: int  # every record of this turn, failed and not sent among them
    failed: int
    ttft_mean_ms: float
    prompt_tokens_mean: float  # the whole prompt, the chat so far included
    request_bytes_mean: float
    codec_us_mean: float  # the codec on the first-token path (NaN without the server's timelines)
    codec_wire_us_mean: float  # the same with the wire between the codec calls


def by_turn(records: Iterable[RequestRecord]) -> list[TurnFigures]:
    """Per turn index, first to last; empty for a run without conversations."""
    turns: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.turn is not None:
            turns.setdefault(r.turn, []).append(r)
    return [_figures(k, turns[k]) for k in sorted(turns)]


def _figures(turn: int, records: Sequence[RequestRecord]) -> TurnFigures:
    ok = [r for r in records if r.success]
    return TurnFigures(
        turn=turn,
        requests=len(records),
        failed=len(records) - len(ok),
        ttft_mean_ms=_mean(r.ttft * 1000.0 for r in ok),
        prompt_tokens_mean=_mean(float(r.prompt_len) for r in ok),
        request_bytes_mean=_mean(float(r.request_bytes) for r in ok if r.request_bytes is not None),
        codec_us_mean=_mean(r.codec_us for r in ok),
        codec_wire_us_mean=_mean(r.codec_wire_us for r in ok),
    )


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def turn_lines(rows: Sequence[TurnFigures]) -> list[str]:
    """The report's table (at most 80 columns): a row per turn index; the codec columns only when the
    server's timelines gave them."""
    codec = any(math.isfinite(r.codec_us_mean) for r in rows)
    header = f"{'turn':>4}{'requests':>9}{'failed':>7}{'TTFT mean ms':>14}{'prompt tok':>11}{'req bytes':>10}"
    if codec:
        header += f"{'codec µs':>11}{'+wire µs':>11}"
    lines = [header]
    for r in rows:
        row = f"{r.turn:>4}{r.requests:>9}{r.failed:>7}{_num(r.ttft_mean_ms, 14, '.2f')}"
        row += f"{_num(r.prompt_tokens_mean, 11, '.0f')}{_num(r.request_bytes_mean, 10, '.0f')}"
        if codec:
            row += f"{_num(r.codec_us_mean, 11, '.1f')}{_num(r.codec_wire_us_mean, 11, '.1f')}"
        lines.append(row)
    return lines


def _num(value: float, width: int, fmt: str) -> str:
    return f"{'n/a' if math.isnan(value) else format(value, fmt):>{width}}"
