"""A run's codec figures and IPC budget measured inside a real SGLang, from wirebench's hook's files.

The hook (``harness.sglang_hook``) writes one JSON Lines file per SGLang process into a folder
(``harness.sglang_hook.records`` has the format): every message each process sends or receives through
``io_struct``, with its encode (or decode) and socket times. Before the load, ``SglangSpans.cursor`` notes
where each file ends; after it, ``figures`` pairs each message sent with its receipt in the other process
and gives what wirebench's own server gives:

- ``CodecFigures``: request = the TokenizerManager's ``TokenizedGenerateReqInput`` to the Scheduler;
  output = one engine step's outputs on their way back, **both hops summed** (the Scheduler's
  ``BatchTokenIDOutput`` to the DetokenizerManager, then its ``BatchStrOutput`` to the TokenizerManager):
  µs per step, bytes per step, two frames per step. Every one is serial on the first token's path.
- ``IpcBudget``: per request of the run, its first-token path: request encode; the engine's input queue
  (encode end → the scheduler's receive returned: the scheduler takes requests between its steps, so
  this is mostly the wait for the step in flight, with the socket's own time inside it, which cannot be
  told apart; ``request.wire`` stays NaN); decode; the output spans of the step that carried its first
  token on the first hop (``output.*``) and the second (``detok.*``), and ``detok.work``, the
  detokenizer's own work between them (not IPC). ``ipc`` sums those nine spans; ``output.queue`` is not
  timed (NaN, shown as ``-``). The per-request codec + wire figure leaves the input queue out.

SGLang's links are ZeroMQ PUSH/PULL, which keep order: the k-th message of a kind with the same request
ids that one process sent is the k-th the other received.

In msgpack mode the fields msgspec cannot type are pickled into a ``PickleWrapper`` just before the
send and out of it after the receive; the hook times those apart (``wrap``, ``unwrap`` rows), and each
counts in its message's encode or decode (``with_nested``): a wrap in the process's next send, an
unwrap in the oldest receive not yet unwrapped (the scheduler takes several requests, then unwraps
them in order), else its latest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.loadgen.ipc import STEP_BLOCK_FIGURE, Window, step_block_means
from harness.loadgen.serverstats import CodecFigures, figures_of
from harness.processes.jsonl_records import RecordFolder, read_rows
from harness.server_metrics.prometheus import CodecCell
from harness.sglang_hook.records import RECV, SEND, UNWRAP, WRAP
from harness.wire.spans import IpcBudget, budget, span_stats

ROLES = ("tokenizer", "scheduler", "detokenizer")
# (message type, sender, receiver) of the three hops a request and its outputs take.
REQUEST_HOP = ("TokenizedGenerateReqInput", "tokenizer", "scheduler")
OUTPUT_HOP = ("BatchTokenIDOutput", "scheduler", "detokenizer")
DETOK_HOP = ("BatchStrOutput", "detokenizer", "tokenizer")
# Span name prefixes of each hop in the budget.
HOP_SPANS = {REQUEST_HOP: "request", OUTPUT_HOP: "output", DETOK_HOP: "detok"}
CODEC_SPANS = tuple(f"{p}.{w}" for p in HOP_SPANS.values() for w in ("encode", "decode"))
# The codec and the wire on the first-token path (the request hop's wire is its input queue: see above).
CODEC_WIRE_SPANS = (
    "request.encode",
    "request.decode",
    *(f"{p}.{w}" for p in ("output", "detok") for w in ("encode", "wire", "decode")),
)
IPC_SPANS = (*CODEC_WIRE_SPANS, "request.queue")

Row = list[Any]  # [kind, message type, request ids, start, middle, end, bytes, nested pickles ns]
Pair = tuple[Row, Row]  # (sent, received)


class SglangSpans(RecordFolder):
    """The hook's folder of one SGLang server."""

    metadata_key = "sglang_hook"  # where a run file keeps roles()

    def refusals(self) -> list[str]:
        """SGLang's own serializers carry every request: nothing is refused by the hook."""
        return []

    def rows_since(self, cursor: dict[str, int]) -> dict[str, list[Row]]:
        """Every message row written after ``cursor``, by the role of the process that wrote it."""
        by_role: dict[str, list[Row]] = {}
        for path, meta in self.metas().items():
            rows, _ = read_rows(path, cursor.get(str(path), 0))
            kept = (r for r in rows if r and r[0] in (SEND, RECV, WRAP, UNWRAP))
            by_role.setdefault(role_of(meta["role"]), []).extend(kept)
        return {role: with_nested(rows) for role, rows in by_role.items()}

    def figures(
        self, cursor: dict[str, int], server_ids: Sequence[str], windows: Sequence[Window | None] = ()
    ) -> tuple[CodecFigures | None, IpcBudget]:
        """The run's codec figures (None when nothing was recorded) and its requests' IPC budget; with
        ``windows`` (``harness.loadgen.ipc.block_windows``), each block's codec + wire µs per output step."""
        roles = {role_of(role): meta for role, meta in self.roles().items()}
        missing = [r for r in ROLES if r not in roles]
        if missing:
            why = f"no timings from SGLang's {' and '.join(missing)} process (is wirebench's hook installed there?)"
            return None, IpcBudget(unavailable=why)
        rows = self.rows_since(cursor)
        hops = {hop: paired(rows, *hop) for hop in HOP_SPANS}
        codec = "pickle" if roles["tokenizer"].get("ipc") == "pickle" else "msgspec"
        return codec_figures(codec, hops), ipc_budget(hops, server_ids, windows)


def role_of(title: str) -> str:
    """A process's role without its ranks: SGLang titles a scheduler of a parallel run
    ``scheduler_TP0``, ``scheduler_DP1_TP0``..."""
    return title.split("_", 1)[0]


def with_nested(rows: list[Row]) -> list[Row]:
    """One process's send and receive rows, each with the ns of the nested pickles that belong to it
    appended (0 for none); the wrap and unwrap rows themselves left out."""

    def at(row: Row) -> int:
        return int(row[5] if row[0] == RECV else row[3])  # a receive's unwraps follow its decode

    messages = [[*r, 0] for r in rows if r[0] in (SEND, RECV)]
    events = sorted([*messages, *(r for r in rows if r[0] in (WRAP, UNWRAP))], key=at)
    pending_wrap = 0
    not_unwrapped: list[Row] = []
    last_received: Row | None = None
    for row in events:
        if row[0] == WRAP:
            pending_wrap += row[5] - row[3]
        elif row[0] == SEND:
            row[7], pending_wrap = pending_wrap, 0
        elif row[0] == RECV:
            not_unwrapped.append(row)
            last_received = row
        elif (owner := not_unwrapped.pop(0) if not_unwrapped else last_received) is not None:
            owner[7] += row[5] - row[3]
    return messages


def _key(row: Row) -> tuple[str, ...]:
    ids = row[2]
    return tuple(ids) if isinstance(ids, list) else (str(ids),)


def paired(rows: dict[str, list[Row]], message: str, sender: str, receiver: str) -> list[Pair]:
    """Each ``message`` the sender sent, with its receipt: in order within the same request ids (PUSH/PULL
    keeps order); a message without its counterpart (sent just before the cursor, or received after the
    run) is left out."""
    received: dict[tuple[str, ...], list[Row]] = {}
    for row in rows.get(receiver, ()):
        if row[0] == RECV and row[1] == message:
            received.setdefault(_key(row), []).append(row)
    sent: dict[tuple[str, ...], list[Row]] = {}
    for row in rows.get(sender, ()):
        if row[0] == SEND and row[1] == message:
            sent.setdefault(_key(row), []).append(row)
    pairs = [p for key, sends in sent.items() for p in zip(sends, received.get(key, []))]
    return sorted(pairs, key=lambda p: p[0][3])


def _us(start: float, end: float) -> float:
    return (end - start) / 1000.0 if start > 0 and end > 0 else math.nan


def hop_spans(pair: Pair) -> tuple[float, float, float]:
    """A message's encode (sender), wire (encoded → receive returned) and decode (receiver) µs, its nested
    pickles included in encode and decode."""
    sent, got = pair
    return _us(sent[3], sent[4]) + sent[7] / 1e3, _us(sent[4], got[4]), _us(got[4], got[5]) + got[7] / 1e3


def _cell(rows: Sequence[Row], at: int, steps: int) -> CodecCell:
    """One operation's counters over ``rows`` (its time ``at`` → ``at + 1``), per ``steps`` messages."""
    return CodecCell(
        messages=float(steps),
        seconds=sum(r[at + 1] - r[at] + r[7] for r in rows) / 1e9,  # the nested pickles included
        bytes=float(sum(r[6] for r in rows)),
        frames=float(len(rows)),
        cpu_seconds=math.nan,  # the hook reads wall clocks only
    )


def codec_figures(codec: str, hops: dict[tuple[str, str, str], list[Pair]]) -> CodecFigures | None:
    """Per direction, µs and bytes per message: the request hop's, and per step both output hops'."""
    requests, steps = hops[REQUEST_HOP], hops[OUTPUT_HOP]
    if not requests and not steps:
        return None
    outputs = [*steps, *hops[DETOK_HOP]]
    cells = {
        ("request", "encode"): _cell([s for s, _ in requests], 3, len(requests)),
        ("request", "decode"): _cell([r for _, r in requests], 4, len(requests)),
        ("output", "encode"): _cell([s for s, _ in outputs], 3, len(steps)),
        ("output", "decode"): _cell([r for _, r in outputs], 4, len(steps)),
    }
    return figures_of(codec, cells)


def _firsts(pairs: list[Pair], wanted: set[str]) -> dict[str, Pair]:
    """Per request of the run, the first message of these pairs that carried it."""
    first: dict[str, Pair] = {}
    for pair in pairs:  # in send order
        for rid in _key(pair[0]):
            if rid in wanted:
                first.setdefault(rid, pair)
    return first


def ipc_budget(
    hops: dict[tuple[str, str, str], list[Pair]], server_ids: Sequence[str], windows: Sequence[Window | None] = ()
) -> IpcBudget:
    """Each of the run's requests' spans (µs) through SGLang's three hops, summarised; the response id the
    client saw is SGLang's request id."""
    wanted = set(server_ids)
    requests = _firsts(hops[REQUEST_HOP], wanted)
    outputs = _firsts(hops[OUTPUT_HOP], wanted)
    returns = _firsts(hops[DETOK_HOP], wanted)
    timelines: list[dict[str, Any]] = []
    per_request: dict[str, dict[str, float]] = {}
    for rid, request in requests.items():
        spans = dict(zip(("request.encode", "request.queue", "request.decode"), hop_spans(request), strict=True))
        spans["request.wire"] = spans["output.queue"] = math.nan  # inside request.queue; not timed
        out, back = outputs.get(rid), returns.get(rid)
        nothing = (math.nan, math.nan, math.nan)
        spans.update(zip(("output.encode", "output.wire", "output.decode"), hop_spans(out) if out else nothing))
        spans.update(zip(("detok.encode", "detok.wire", "detok.decode"), hop_spans(back) if back else nothing))
        spans["detok.work"] = _us(out[1][5], back[0][3]) if out and back else math.nan
        spans["ipc"] = sum(spans[name] for name in IPC_SPANS)
        timelines.append({"request_id": rid, "spans_us": spans})
        per_request[rid] = spans
    result = budget(timelines)
    result.codec_us = {rid: math.fsum(spans[n] for n in CODEC_SPANS) for rid, spans in per_request.items()}
    result.codec_wire_us = {rid: sum(spans[n] for n in CODEC_WIRE_SPANS) for rid, spans in per_request.items()}
    steps = step_totals(hops)
    for what, values in steps.items():
        if what != "start":
            result.spans[f"step.{what}"] = span_stats(values)
    if windows:
        per_step = [e + w + d for e, w, d in zip(steps["encode"], steps["wire"], steps["decode"], strict=True)]
        result.blocks[STEP_BLOCK_FIGURE] = step_block_means(zip(steps["start"], per_step), windows)
    return result


def step_totals(hops: dict[tuple[str, str, str], list[Pair]]) -> dict[str, list[float]]:
    """Per engine step (each output hop's message, then its detokenized one, in order), both hops' encode,
    wire and decode µs summed, and the step's first encode start (ns)."""
    back: dict[tuple[str, ...], list[Pair]] = {}
    for pair in hops[DETOK_HOP]:
        back.setdefault(_key(pair[0]), []).append(pair)
    out: dict[str, list[float]] = {"start": [], "encode": [], "wire": [], "decode": []}
    for pair in hops[OUTPUT_HOP]:
        later = back.get(_key(pair[0]))
        if not later:
            continue
        second = later.pop(0)
        first_spans, second_spans = hop_spans(pair), hop_spans(second)
        out["start"].append(pair[0][3])
        for what, a, b in zip(("encode", "wire", "decode"), first_spans, second_spans, strict=True):
            out[what].append(a + b)
    return out
