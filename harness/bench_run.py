"""``bench run``: for each codec, serve, load, report; then compare side by side.

Every run starts a fresh ``bench serve`` process with the same model, seed,
limits and workload; only ``--codec`` differs. With ``--repeat N`` the codecs
are interleaved (A B C A B C ...), so slow drift of a shared machine spreads
over all codecs instead of biasing one, and the table shows each figure's
median across repeats with its spread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import table as text_table
from harness.frontend.settings import default_model_name
from harness.serve import add_model_arguments
from harness.serve_process import ServerProcess
from wirecodecs import UNSUPPORTED_PAYLOAD, available_codecs

SERVER_READY_TIMEOUT_S = 300.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.loadgen.cli import add_load_arguments
    from harness.workloads.datasets import add_dataset_arguments

    p.add_argument("--codec", default="pickle", help="codec name, a comma-separated list, or 'all' (default pickle)")
    p.add_argument("--repeat", type=int, default=1, help="interleaved rounds over the codecs (default 1)")
    p.add_argument("--server-log", default=None, help="append each server's output to this file")
    add_dataset_arguments(p)  # defines --seed: the workload, arrivals and model weights share it
    add_model_arguments(p)
    add_load_arguments(p)
    # A few untimed requests per server first, so one-off costs (allocator,
    # first model call) land outside every codec's measurement alike.
    p.set_defaults(warmup_requests=4)


def parse_codecs(spec: str) -> list[str]:
    known = available_codecs()
    if spec.strip() == "all":
        return known
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(
            f"unknown codec(s) {', '.join(unknown) or '(none given)'}; available: {', '.join(known)}, or all"
        )
    return list(dict.fromkeys(names))


def server_flags(args: argparse.Namespace) -> list[str]:
    """The `bench serve` flags that reproduce this run's model and engine settings."""
    probe = argparse.ArgumentParser(add_help=False)
    add_model_arguments(probe)
    flags = ["--seed", str(args.seed)]
    for action in probe._actions:
        value = getattr(args, action.dest, None)
        if value is None or value == action.default:
            continue
        flags += [action.option_strings[0], str(value)]
    return flags


@dataclass
class RunOutcome:
    codec: str
    round: int
    result: Any = None  # BenchmarkResult
    status: str = "ok"  # ok | failures | unsupported | error | interrupted
    message: str = ""
    path: Path | None = None


def run_one(codec: str, rnd: int, args: argparse.Namespace, workload: list, tokenizer_id: str) -> RunOutcome:
    from harness.loadgen.cli import flags_dict
    from harness.loadgen.report import print_report, save_result
    from harness.loadgen.runner import BenchmarkError, run_benchmark

    outcome = RunOutcome(codec, rnd)
    server = ServerProcess(codec, server_flags(args), args.server_log)
    try:
        base_url = server.wait_ready(SERVER_READY_TIMEOUT_S)
        model = args.served_model_name or default_model_name(args.model_preset)
        try:
            result = asyncio.run(run_benchmark(base_url, model, workload, args))
        except BenchmarkError as exc:
            # All warmup requests failed: for a codec that cannot carry the
            # payload this is the server's clear 400, which the table shows.
            refusal = _codec_refusal(exc.records)
            outcome.status = "error" if refusal is None else "unsupported"
            outcome.message = refusal or _error_message(str(exc))
            return outcome
        result.tokenizer_id = tokenizer_id
        result.flags = {**flags_dict(args), "codec": codec, "round": rnd}
        print_report(result)
        outcome.result = result
        refusal = None if result.metrics.completed else _codec_refusal(result.records)
        if refusal:
            outcome.result, outcome.status, outcome.message = None, "unsupported", refusal
            return outcome
        if result.interrupted:
            outcome.status = "interrupted"
        elif result.failed:
            outcome.status = "failures"
            outcome.message = f"{result.failed} of {result.num_prompts} requests failed"
        if args.save_result:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            outcome.path = save_result(result, result_dir=args.result_dir, filename=f"{codec}-r{rnd}-{stamp}.json")
            print(f"Result saved to {outcome.path}")
    except RuntimeError as exc:
        outcome.status, outcome.message = "error", str(exc)
    finally:
        server.stop()
    return outcome


def _codec_refusal(records: list[Any]) -> str | None:
    """The server's message when a request was refused because the codec cannot carry its payload."""
    for record in records:
        if record.error_type == UNSUPPORTED_PAYLOAD:
            return _error_message(record.error)
    return None


def _error_message(text: str) -> str:
    """The OpenAI error body's message inside an HTTP error text, else the text."""
    match = re.search(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    return match.group(1) if match else text


# --- the side-by-side table ---------------------------------------------------

COLUMNS = [
    ("TTFT mean", "mean_ttft_ms"),
    ("TTFT p50", "median_ttft_ms"),
    ("TTFT p99", "p99_ttft_ms"),
    ("TPOT mean", "mean_tpot_ms"),
    ("TPOT p50", "median_tpot_ms"),
    ("TPOT p99", "p99_tpot_ms"),
    ("ITL mean", "mean_itl_ms"),
    ("ITL p50", "median_itl_ms"),
    ("ITL p99", "p99_itl_ms"),
    ("req/s", "request_throughput"),
    ("out tok/s", "output_throughput"),
    ("req enc µs", "request_encode_us"),
    ("req dec µs", "request_decode_us"),
    ("out enc µs", "output_encode_us"),
    ("out dec µs", "output_decode_us"),
]


def summary_figures(result: Any) -> dict[str, float]:
    """The table's figures of one run."""
    m = result.metrics
    figures = {"request_throughput": m.request_throughput, "output_throughput": m.output_throughput}
    for name in ("ttft", "tpot", "itl"):
        stats = m.stats(name)
        figures[f"mean_{name}_ms"] = stats.mean
        figures[f"median_{name}_ms"] = stats.median
        figures[f"p99_{name}_ms"] = stats.percentiles.get(99.0, math.nan)
    codec = result.codec_figures
    if codec is not None:
        figures.update(
            request_encode_us=codec.request.encode_us,
            request_decode_us=codec.request.decode_us,
            output_encode_us=codec.output.encode_us,
            output_decode_us=codec.output.decode_us,
        )
    return figures


def aggregate(outcomes: list[RunOutcome], codecs: list[str]) -> dict[str, dict[str, Any]]:
    """Per codec: each figure's median across rounds and its spread (max-min)/2 in %."""
    table: dict[str, dict[str, Any]] = {}
    for codec in codecs:
        runs = [o for o in outcomes if o.codec == codec]
        measured = [summary_figures(o.result) for o in runs if o.result is not None]
        row: dict[str, Any] = {
            "runs": len(runs),
            "measured": len(measured),
            "status": _status(runs),
            "message": next((o.message for o in runs if o.message), ""),
        }
        for _, key in COLUMNS:
            values = [m[key] for m in measured if key in m and m[key] == m[key]]
            if values:
                mid = statistics.median(values)
                spread = (max(values) - min(values)) / 2 / mid * 100 if mid and len(values) > 1 else None
                row[key] = {"median": mid, "spread_pct": spread, "values": values}
        table[codec] = row
    return table


def _status(runs: list[RunOutcome]) -> str:
    statuses = {o.status for o in runs}
    for worst in ("error", "unsupported", "failures", "interrupted"):
        if worst in statuses:
            return worst
    return "ok"


def format_table(table: dict[str, dict[str, Any]], repeat: int) -> str:
    headers = ["codec"] + [name for name, _ in COLUMNS]
    rows = []
    for codec, row in table.items():
        if row["measured"] == 0:
            rows.append([codec, f"{row['status']}: {row['message']}"])
            continue
        cells = [codec + ("" if row["status"] == "ok" else f" ({row['status']})")]
        for _, key in COLUMNS:
            cell = row.get(key)
            if cell is None:
                cells.append("-")
                continue
            text = _fmt(cell["median"])
            if repeat > 1 and cell["spread_pct"] is not None:
                text += f" ±{cell['spread_pct']:.1f}%"
            cells.append(text)
        rows.append(cells)
    lines = text_table.format_table(headers, rows)
    note = "times in ms unless marked µs; µs columns are codec time per message from the server's /metrics"
    if repeat > 1:
        note += f"; median of {repeat} interleaved rounds, ± half the range"
    return "\n".join(["", "=" * 20 + " Codec comparison " + "=" * 20, *lines, note, *format_changes(table)])


# Figures compared against the first codec, and which direction is better.
COMPARED = [
    ("TTFT mean", "mean_ttft_ms"),
    ("TPOT mean", "mean_tpot_ms"),
    ("ITL mean", "mean_itl_ms"),
    ("out tok/s", "output_throughput"),
]


def changes_vs_baseline(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each codec's change against the first measured codec, per compared figure.

    ``significant`` is None with fewer than two rounds a side (no spread to
    judge), False when the two codecs' per-round values overlap, True when
    every round of one lies beyond every round of the other. Overlapping
    ranges is a deliberately conservative test: a difference smaller than
    the machine's round-to-round noise is reported as noise.
    """
    measured = [c for c, row in table.items() if row["measured"]]
    if len(measured) < 2:
        return {}
    base = table[measured[0]]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for codec in measured[1:]:
        row, cells = table[codec], {}
        for _, key in COMPARED:
            a, b = base.get(key), row.get(key)
            if not a or not b or not a["median"]:
                continue
            va, vb = a["values"], b["values"]
            significant = None
            if len(va) > 1 and len(vb) > 1:
                significant = max(va) < min(vb) or max(vb) < min(va)
            cells[key] = {"change_pct": (b["median"] - a["median"]) / a["median"] * 100, "significant": significant}
        out[codec] = cells
    return out


def format_changes(table: dict[str, dict[str, Any]]) -> list[str]:
    changes = changes_vs_baseline(table)
    if not changes:
        return []
    baseline = next(c for c, row in table.items() if row["measured"])
    verdicts = {None: "one round: no spread to judge", False: "within noise", True: "beyond noise"}
    lines = [f"change vs {baseline} (medians; 'within noise' = the rounds' ranges overlap):"]
    for codec, cells in changes.items():
        parts = [
            f"{label} {cells[key]['change_pct']:+.1f}% ({verdicts[cells[key]['significant']]})"
            for label, key in COMPARED
            if key in cells
        ]
        lines.append(f"  {codec}: " + ", ".join(parts))
    return lines


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def main(args: argparse.Namespace) -> int:
    from harness.loadgen.cli import check_endpoint, load_workload
    from harness.loadgen.report import jsonable
    from harness.loadgen.runner import BenchmarkError, LoadSettings

    try:
        codecs = parse_codecs(args.codec)
        if args.repeat < 1:
            raise ValueError("--repeat must be >= 1")
        if getattr(args, "images_per_request", 0) and args.endpoint == "/v1/completions":
            args.endpoint = "/v1/chat/completions"  # images only travel through chat
            print("bench run: image workload, using /v1/chat/completions")
        LoadSettings.from_args(args)
        workload, tokenizer_id = load_workload(args)
        check_endpoint(workload, args.endpoint)
    except (ValueError, BenchmarkError, OSError) as exc:
        print(f"bench run: error: {exc}", file=sys.stderr)
        return 2

    plan = [(rnd, codec) for rnd in range(args.repeat) for codec in codecs]
    outcomes: list[RunOutcome] = []
    interrupted = False
    for i, (rnd, codec) in enumerate(plan, 1):
        print(f"\n[{i}/{len(plan)}] codec={codec} round {rnd + 1}/{args.repeat}: starting bench serve", flush=True)
        try:
            outcome = run_one(codec, rnd, args, workload, tokenizer_id)
        except KeyboardInterrupt:
            interrupted = True
            break
        outcomes.append(outcome)
        if outcome.status in ("error", "unsupported"):
            print(f"[{i}/{len(plan)}] codec={codec}: {outcome.status}: {outcome.message}", flush=True)
        if outcome.status == "interrupted":
            interrupted = True
            break

    table = aggregate(outcomes, codecs)
    print(format_table(table, args.repeat))
    if args.save_result and outcomes:
        path = Path(args.result_dir) / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = {
            "schema_version": 1,
            "codecs": codecs,
            "repeat": args.repeat,
            # Relative to this file, so a folder of results can move (e.g. into baselines/).
            "runs": [
                {
                    "codec": o.codec,
                    "round": o.round,
                    "status": o.status,
                    "message": o.message,
                    "result_file": os.path.relpath(o.path, path.parent) if o.path else None,
                }
                for o in outcomes
            ],
            "table": table,
            "changes_vs_first": changes_vs_baseline(table),
        }
        path.write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False))
        print(f"Comparison saved to {path}")
    if interrupted:
        return 130
    if any(o.status in ("failures", "error") for o in outcomes):
        return 1
    return 0
