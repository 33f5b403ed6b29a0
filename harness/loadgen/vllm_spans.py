"""A run's codec figures and IPC budget measured inside a real vLLM, from the wirebench plugin's files.

The plugin (``harness.vllm_plugin``) writes one JSON Lines file per vLLM process into a folder
(``harness.vllm_plugin.records`` has the format). Before the load, ``PluginSpans.cursor`` notes where
each file ends; after it, ``figures`` reads what came since and gives what wirebench's own server
gives through ``/metrics`` and ``/v1/wirebench/spans``:

- ``CodecFigures``: per direction, messages, µs (wall and thread CPU), bytes and frames per message;
- ``IpcBudget``: per request of the run, its first-token path through vLLM's engine link, the spans
  wirebench's own server has (``harness.wire.spans``): request encode, wire (encode end → the engine's
  decode start), decode, the engine's input queue (decode end → the busy loop added it to the
  scheduler); then the output batch that carried its first token: the output queue (its step returned
  it → its encode starts), encode, wire, decode. ``ipc`` sums the eight, as on wirebench's server.
  Records without the queues (a plugin that did not time them) leave those two NaN and ``ipc`` the sum
  of the six spans measured. A run in blocks also gets each block's mean codec + wire µs per output
  step: the plugin's output encode and decode rows carry CLOCK_MONOTONIC ns, as the client's records
  do, so each output batch goes to the block whose window holds its encode start
  (``harness.loadgen.ipc.step_block_means``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.loadgen.ipc import STEP_BLOCK_FIGURE, Window, step_block_means
from harness.loadgen.serverstats import CodecFigures, figures_of
from harness.processes.jsonl_records import RecordFolder, read_rows
from harness.server_metrics.prometheus import CodecCell
from harness.vllm_plugin.records import (
    OUTPUT_DECODE,
    OUTPUT_ENCODE,
    OUTPUT_QUEUED,
    REFUSED,
    REQUEST_ADDED,
    REQUEST_DECODE,
    REQUEST_ENCODE,
)
from harness.wire.spans import CODEC_WIRE_SPANS, REQUEST_SPANS, IpcBudget, budget, span_stats

KINDS = (REQUEST_ENCODE, REQUEST_DECODE, OUTPUT_ENCODE, OUTPUT_DECODE, REQUEST_ADDED, OUTPUT_QUEUED)
# What ipc sums: every span of the first-token path (wirebench's own server's), or, from records without
# the queues, the codec and wire spans alone.
WITH_QUEUES = tuple(f"{d}.{w}" for d, w in REQUEST_SPANS)
MEASURED = CODEC_WIRE_SPANS


class PluginSpans(RecordFolder):
    """The plugin's folder of one server."""

    metadata_key = "vllm_plugin"  # where a run file keeps roles()

    def refusals(self) -> list[str]:
        """Why the codec could not carry some request, as the API server's plugin recorded it (once a reason)."""
        found = []
        for path in self.files():
            rows, _ = read_rows(path)
            found += [str(row[1]) for row in rows if row and row[0] == REFUSED]
        return found

    def rows_since(self, cursor: dict[str, int]) -> dict[str, list[list[Any]]]:
        """Every record written after ``cursor``, by kind."""
        kinds: dict[str, list[list[Any]]] = {k: [] for k in KINDS}
        for path in self.files():
            rows, _ = read_rows(path, cursor.get(str(path), 0))
            for row in rows:
                if row[0] in kinds:
                    kinds[row[0]].append(row)
        return kinds

    def figures(
        self, cursor: dict[str, int], server_ids: Sequence[str], windows: Sequence[Window | None] = ()
    ) -> tuple[CodecFigures | None, IpcBudget]:
        """The run's codec figures (None when nothing was recorded) and its requests' IPC budget; with
        ``windows`` (``harness.loadgen.ipc.block_windows``), each block's codec + wire µs per output step."""
        rows = self.rows_since(cursor)
        roles = self.roles()
        missing = {"api", "engine"} - set(roles)
        if missing:
            why = f"no timings from vLLM's {' and '.join(sorted(missing))} process (is the plugin installed there?)"
            return None, IpcBudget(unavailable=why)
        codec = roles["api"].get("codec")
        if roles["api"].get("clock") != roles["engine"].get("clock"):
            return codec_figures(codec, rows), IpcBudget(unavailable="vLLM's processes run on different hosts")
        return codec_figures(codec, rows), ipc_budget(rows, server_ids, windows)


def _cell(rows: list[list[Any]], start: int) -> CodecCell:
    """Counters of one direction × operation from its rows ([.., start, end, cpu, bytes, frames, ..] at ``start``)."""
    return CodecCell(
        messages=float(len(rows)),
        seconds=sum(r[start + 1] - r[start] for r in rows) / 1e9,
        bytes=float(sum(r[start + 3] for r in rows)),
        frames=float(sum(r[start + 4] for r in rows)),
        cpu_seconds=sum(_cpu_us(r[start + 2]) for r in rows) / 1e6,
    )


def _cpu_us(ns: float | None) -> float:
    """A call's thread CPU time in µs; NaN where the process did not read it (the plugin's default)."""
    return ns / 1000.0 if ns is not None else math.nan


def codec_figures(codec: str | None, rows: dict[str, list[list[Any]]]) -> CodecFigures | None:
    if not rows[REQUEST_ENCODE] and not rows[OUTPUT_ENCODE]:
        return None
    cells = {
        ("request", "encode"): _cell(rows[REQUEST_ENCODE], 3),
        ("request", "decode"): _cell(rows[REQUEST_DECODE], 3),
        ("output", "encode"): _cell(rows[OUTPUT_ENCODE], 2),
        ("output", "decode"): _cell(rows[OUTPUT_DECODE], 2),
    }

    return figures_of(codec, cells)


def _us(start: float, end: float) -> float:
    return (end - start) / 1000.0 if start > 0 and end > 0 else math.nan


def _of_run(external_id: str, server_ids: set[str]) -> bool:
    """Whether a request is one the run sent: vLLM's external id is the response id the client saw,
    or that id with the prompt's index (``cmpl-<id>-0``)."""
    return external_id in server_ids or external_id.rsplit("-", 1)[0] in server_ids


def _first_times(rows: list[list[Any]]) -> dict[Any, int]:
    """Per key (a request id, a batch stamp), the earliest time recorded: ``[kind, key, time]`` rows."""
    first: dict[Any, int] = {}
    for _, key, at in rows:
        if key not in first or at < first[key]:
            first[key] = at
    return first


def ipc_budget(
    rows: dict[str, list[list[Any]]], server_ids: Sequence[str], windows: Sequence[Window | None] = ()
) -> IpcBudget:
    """Each of the run's requests' spans (µs) through vLLM's engine link, summarised; with ``windows``,
    each block's mean codec + wire µs per output step."""
    wanted = set(server_ids)
    decoded = {r[2]: r for r in rows[REQUEST_DECODE]}
    received = {r[1]: r for r in rows[OUTPUT_DECODE]}  # by batch stamp
    added = _first_times(rows.get(REQUEST_ADDED, []))  # by request id
    queued = _first_times(rows.get(OUTPUT_QUEUED, []))  # by batch stamp
    summed = WITH_QUEUES if added and queued else MEASURED
    first_batch: dict[str, list[Any]] = {}
    for batch in sorted(rows[OUTPUT_ENCODE], key=lambda r: r[2]):
        for rid in batch[7]:
            first_batch.setdefault(rid, batch)
    timelines = []
    for enc in rows[REQUEST_ENCODE]:
        ext, rid = enc[1], enc[2]
        if not _of_run(ext, wanted):
            continue
        dec, out = decoded.get(rid), first_batch.get(rid)
        back = received.get(out[1]) if out else None
        spans = {
            "request.encode": _us(enc[3], enc[4]),
            "request.encode_cpu": _cpu_us(enc[5]),
            "request.wire": _us(enc[4], dec[3]) if dec else math.nan,
            "request.decode": _us(dec[3], dec[4]) if dec else math.nan,
            "request.decode_cpu": _cpu_us(dec[5]) if dec else math.nan,
            "request.queue": _us(dec[4], added.get(rid, 0)) if dec else math.nan,
            "output.queue": _us(queued.get(out[1], 0), out[2]) if out else math.nan,
            "output.encode": _us(out[2], out[3]) if out else math.nan,
            "output.encode_cpu": _cpu_us(out[4]) if out else math.nan,
            "output.wire": _us(out[3], back[2]) if out and back else math.nan,
            "output.decode": _us(back[2], back[3]) if back else math.nan,
            "output.decode_cpu": _cpu_us(back[4]) if back else math.nan,
        }
        spans["ipc"] = sum(spans[name] for name in summed)
        # Named by the response id the client saw, so the run's records find their spans.
        timelines.append({"request_id": ext if ext in wanted else ext.rsplit("-", 1)[0], "spans_us": spans})
    result = budget(timelines)
    for what, at in (("encode", 2), ("decode", 2)):
        kind = OUTPUT_ENCODE if what == "encode" else OUTPUT_DECODE
        result.spans[f"step.{what}"] = span_stats(_us(r[at], r[at + 1]) for r in rows[kind])
        result.spans[f"step.{what}_cpu"] = span_stats(_cpu_us(r[at + 2]) for r in rows[kind])
    result.spans["step.wire"] = span_stats(
        _us(r[3], received[r[1]][2]) for r in rows[OUTPUT_ENCODE] if r[1] in received
    )
    if windows:
        steps = ((r[2], _step_us(r, received[r[1]])) for r in rows[OUTPUT_ENCODE] if r[1] in received)
        result.blocks[STEP_BLOCK_FIGURE] = step_block_means(steps, windows)
    return result


def _step_us(encoded: list[Any], decoded: list[Any]) -> float:
    """One output batch's encode + wire + decode µs, from its encode row and its decode row."""
    return _us(encoded[2], encoded[3]) + _us(encoded[3], decoded[2]) + _us(decoded[2], decoded[3])
