"""``bench run``: for each codec, serve, load, report; then compare side by side with verdicts.

Every run starts a fresh ``bench serve`` process with the same model, seed,
limits and workload; only ``--codec`` differs. With ``--repeat N`` the codecs
are interleaved and the order reverses every other round (A B C, C B A, A B C,
...): slow drift of a shared machine then hits every pair of codecs equally
(``harness.stats`` measured that A-then-B in every round lets drift through as
false verdicts, and that the reversal removes it). The table shows each
figure's median over rounds; the verdicts (``harness.compare``) judge every
codec against the first from the paired per-round ratios.

With ``--block-size N`` a round starts every arm's server at once and the
arms take turns N requests at a time (A B, B A, ...; each block waits for its
requests to finish), so the seconds-long swings of a shared machine's speed
land on all arms of a round instead of on whichever ran then; each arm's run
is still one result (its blocks' records), and rounds are still the unit.

The same codec may appear twice (an A/A run): the second is labelled
``NAME#2``. A codec name may carry calibration options
(``pickle+request-delay=500us``, see ``wirecodecs.calibration``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from harness import stats
from harness import table as text_table
from harness.compare import (
    CODEC_FIGURES,
    LATENCY_FIGURES,
    Arm,
    Comparison,
    compare,
    compare_document,
    figures_table,
    median_cell,
    verdict_lines,
)
from harness.documents import RunEntry, run_document, run_figures, save_run, write_json
from harness.frontend.settings import default_model_name
from harness.loadgen.arrivals import positive_rate
from harness.loadgen.cli import flags_dict
from harness.serve import add_model_arguments
from harness.serve_process import ServerProcess
from harness.stats import Figure
from harness.transport import TRANSPORTS
from wirecodecs import (
    UNSUPPORTED_PAYLOAD,
    UnknownCodecError,
    available_codecs,
    check_codec_spec,
    codecs_out_of_band,
    sends_out_of_band,
)

SERVER_READY_TIMEOUT_S = 300.0
T = TypeVar("T")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.loadgen.cli import add_load_arguments
    from harness.workloads.datasets import add_dataset_arguments

    p.add_argument(
        "--codec",
        default="pickle",
        help="codec name, a comma-separated list, or 'all' (default pickle); the first is the reference; "
        "a repeated name is an A/A arm; options after + inject a known cost (pickle+request-delay=500us)",
    )
    p.add_argument(
        "--transport",
        default="zmq",
        help="zmq, shm, or a comma list: every codec runs on every transport (interleaved in one table); "
        "shm needs a codec with out-of-band frames (see bench serve --help)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help=f"interleaved rounds, order reversed every other round (default %(default)s; verdicts need >= "
        f"{stats.MIN_ROUNDS}, {stats.DEFAULT_ROUNDS} detect a change of 3x the round-to-round noise 4 times in 5)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=0,
        metavar="N",
        help="keep every arm's server up for the round and let the arms take turns, N requests at a time "
        "(A B, B A, ...): each arm sees the same moments of a shared machine; 0: each arm serves the "
        "whole workload in turn (default %(default)s)",
    )
    p.add_argument(
        "--margin-pct",
        type=float,
        default=stats.DEFAULT_MARGIN_PCT,
        help=f"equivalence margin of the verdicts in percent (default {stats.DEFAULT_MARGIN_PCT:g})",
    )
    p.add_argument("--server-log", default=None, help="append each server's output to this file")
    p.add_argument(
        "--arm-flags",
        action="append",
        default=[],
        metavar="LABEL=FLAGS",
        help="extra bench serve flags for one arm, e.g. --codec msgspec,msgspec --arm-flags 'msgspec#2=--no-spans' "
        "(an A/B of a server setting); repeatable",
    )
    p.add_argument(
        "--trace-file",
        default=None,
        metavar="PATH",
        help="each server writes its request timelines as Chrome trace JSON: PATH with -<arm>-r<round> added",
    )
    add_dataset_arguments(p)  # defines --seed: the workload, arrivals and model weights share it
    add_model_arguments(p)
    add_load_arguments(p)
    # A few untimed requests per server first, so one-off costs (allocator,
    # first model call) land outside every codec's measurement alike.
    p.set_defaults(warmup_requests=4)
    # bench run's default rate is measured, not infinite (bench load keeps benchmark_serving's inf).
    rate = p._option_string_actions["--request-rate"]
    rate.type, rate.default = rate_or_auto, AUTO
    rate.help = (
        f"requests per second, 'inf' (all at once, benchmark_serving's default: a saturation test) or "
        f"'auto' (default: {AUTO_LOAD * 100:.0f}%% of the capacity a short probe at rate inf measures, "
        "so TTFT measures serving, not a queue)"
    )


AUTO = "auto"
AUTO_LOAD = 0.5  # --request-rate auto: this fraction of the measured capacity


def rate_or_auto(text: str) -> float | str:
    return AUTO if text == AUTO else positive_rate(text)


def probe_capacity(arm: ArmSpec, args: argparse.Namespace, workload: list, tokenizer_id: str) -> float:
    """Completed requests per second of a burst (rate inf) against ``arm``'s server: its capacity."""
    n = min(len(workload), max(64, 2 * args.max_num_seqs))
    saved = args.request_rate, args.save_result, args.trace_file
    args.request_rate, args.save_result, args.trace_file = math.inf, False, None
    try:
        print(
            f"\n[probe] {arm.label}: {n} requests at rate inf to measure capacity for --request-rate auto", flush=True
        )
        outcome = run_one(arm, -1, args, workload[:n], tokenizer_id)
    finally:
        args.request_rate, args.save_result, args.trace_file = saved
    if outcome.result is None or not outcome.result.metrics.completed:
        raise RuntimeError(f"the capacity probe failed: {outcome.status}: {outcome.message}")
    return float(outcome.result.metrics.request_throughput)


@dataclass(frozen=True)
class ArmSpec:
    """One arm of a run: the label in tables and file names, the codec and the transport its server uses."""

    label: str
    codec: str
    transport: str = "zmq"

    def unsupported(self) -> str | None:
        """Why this arm cannot run at all (said in the table instead of starting a server), or None."""
        if self.transport == "shm" and not sends_out_of_band(self.codec):
            return (
                f"--transport shm needs a codec with out-of-band frames ({', '.join(codecs_out_of_band())}); "
                f"{self.codec} puts big buffers in its body"
            )
        return None


def parse_arms(codec_spec: str, transport_spec: str = "zmq") -> list[ArmSpec]:
    """Every codec × transport (codec-major); labels carry the transport when several are compared."""
    transports = [t.strip() for t in transport_spec.split(",") if t.strip()]
    bad = [t for t in transports if t not in TRANSPORTS]
    if bad or not transports:
        raise ValueError(
            f"unknown transport(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(TRANSPORTS)}"
        )
    transports = list(dict.fromkeys(transports))
    arms = []
    for codec_arm in parse_codecs(codec_spec):
        for t in transports:
            label = codec_arm.label if len(transports) == 1 else f"{codec_arm.label}/{t}"
            arms.append(ArmSpec(label, codec_arm.codec, t))
    return arms


def parse_codecs(spec: str) -> list[ArmSpec]:
    """``--codec``: names (with calibration options), comma-separated, or 'all'. A repeated codec gets NAME#2."""
    known = available_codecs()
    names = known if spec.strip() == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError(f"no codec given; available: {', '.join(known)}, or all")
    bad = []
    for name in dict.fromkeys(names):
        try:
            check_codec_spec(name)
        except UnknownCodecError:
            bad.append(name)
    if bad:
        raise ValueError(f"unknown codec(s) {', '.join(bad)}; available: {', '.join(known)}, or all")
    arms: list[ArmSpec] = []
    for name in names:
        seen = sum(1 for a in arms if a.codec == name)
        arms.append(ArmSpec(name if not seen else f"{name}#{seen + 1}", name))
    return arms


def check_run_flags(args: argparse.Namespace) -> None:
    """Refuse bad --repeat, --block-size and load flags before any server starts (ValueError or
    BenchmarkError). An auto rate is resolved later, by the probe: the rest is checked at rate inf."""
    from harness.loadgen.runner import LoadSettings

    if args.repeat < 1:
        raise ValueError("--repeat must be >= 1")
    if args.block_size < 0:
        raise ValueError(f"--block-size must be >= 0, got {args.block_size}")
    if args.block_size and (args.workers != 1 or args.ray is not None):
        raise ValueError("--block-size sends every arm's blocks from this process: drop --workers/--ray")
    LoadSettings.from_args(argparse.Namespace(**{**vars(args), "request_rate": math.inf}))


def round_order(arms: list[T], rnd: int) -> list[T]:
    """The arms in round ``rnd`` (or block): as given on even ones, reversed on odd ones (drift cancels in pairs)."""
    return arms if rnd % 2 == 0 else arms[::-1]


def server_flags(args: argparse.Namespace) -> list[str]:
    """The `bench serve` flags that reproduce this run's model and engine settings."""
    probe = argparse.ArgumentParser(add_help=False)
    add_model_arguments(probe)
    flags = ["--seed", str(args.seed)]
    for action in probe._actions:
        value = getattr(args, action.dest, None)
        if value is None or value == action.default:
            continue
        if action.nargs == 0:  # a switch such as --no-spans
            flags.append(action.option_strings[0])
        else:
            flags += [action.option_strings[0], str(value)]
    return flags


def parse_arm_flags(specs: list[str], arms: list[ArmSpec]) -> dict[str, list[str]]:
    """``--arm-flags LABEL='--flag value'`` (repeatable): extra bench serve flags for one arm."""
    labels = {a.label for a in arms}
    out: dict[str, list[str]] = {}
    for spec in specs:
        label, sep, flags = spec.partition("=")
        if not sep or label not in labels:
            raise ValueError(
                f"--arm-flags {spec!r}: expected LABEL=FLAGS with LABEL one of {', '.join(sorted(labels))}"
            )
        out.setdefault(label, []).extend(shlex.split(flags))
    return out


def trace_path(template: str, arm: ArmSpec, rnd: int) -> str:
    """--trace-file for one run: the file name gets the arm's label and round (one trace per server)."""
    path = Path(template)
    return str(path.with_name(f"{path.stem}-{arm.label}-r{rnd}{path.suffix or '.json'}"))


@dataclass
class RunOutcome:
    arm: ArmSpec
    round: int
    result: Any = None  # BenchmarkResult
    status: str = "ok"  # ok | failures | unsupported | error | interrupted
    message: str = ""
    path: Path | None = None


def run_one(arm: ArmSpec, rnd: int, args: argparse.Namespace, workload: list, tokenizer_id: str) -> RunOutcome:
    """One arm's run: a fresh server, the workload, the report; the server stops afterwards."""
    from harness.loadgen.runner import BenchmarkError, run_benchmark

    outcome = RunOutcome(arm, rnd)
    why = arm.unsupported()
    if why is not None:
        outcome.status, outcome.message = "unsupported", why
        return outcome
    server = start_server(arm, rnd, args)
    try:
        base_url = server.wait_ready(SERVER_READY_TIMEOUT_S)
        try:
            result = asyncio.run(run_benchmark(base_url, served_model(args), workload, args))
        except BenchmarkError as exc:
            refused(outcome, exc)
            return outcome
        take_result(outcome, result, args, tokenizer_id)
    except RuntimeError as exc:
        outcome.status, outcome.message = "error", str(exc)
    finally:
        server.stop()
    return outcome


def run_round_in_blocks(
    arms: list[ArmSpec], rnd: int, args: argparse.Namespace, workload: list, tokenizer_id: str
) -> list[RunOutcome]:
    """``--block-size N``: one round of every arm, each on its own fresh server, all up for the round;
    the arms take turns block by block (N requests each, the order reversed every other block), so
    a few seconds' change in the shared machine's speed lands on every arm alike."""
    outcomes = [RunOutcome(arm, rnd) for arm in arms]
    servers: dict[int, ServerProcess] = {}
    try:
        for i, outcome in enumerate(outcomes):
            why = outcome.arm.unsupported()
            if why is not None:
                outcome.status, outcome.message = "unsupported", why
            else:
                servers[i] = start_server(outcome.arm, rnd, args)  # all start before any is waited for
        urls: dict[int, str] = {}
        for i, server in servers.items():
            try:
                urls[i] = server.wait_ready(SERVER_READY_TIMEOUT_S)
            except RuntimeError as exc:
                outcomes[i].status, outcomes[i].message = "error", str(exc)
        if urls:
            results = asyncio.run(_load_in_blocks(urls, workload, args, rnd))
            for i, result in results.items():
                _outcome_from(outcomes[i], result, args, tokenizer_id)
    finally:
        stop_all(list(servers.values()))
    return outcomes


def stop_all(servers: list[ServerProcess]) -> None:
    """Signal every server first, then wait for each: they stop together, not one after another."""
    for server in servers:
        server.request_stop()
    for server in servers:
        server.stop()


async def _load_in_blocks(urls: dict[int, str], workload: list, args: argparse.Namespace, rnd: int) -> dict[int, Any]:
    """Each server warmed up, then block after block of the workload to each in turn; per server its
    result, or the BenchmarkError of a warmup that failed. Ctrl-C ends the round; what ran is kept."""
    from dataclasses import replace

    import aiohttp

    from harness.loadgen.runner import BenchmarkError, LoadSettings, ServerLoad
    from harness.loadgen.workers import uncancel_current_task

    settings = replace(LoadSettings.from_args(args), progress=False)  # blocks are too short for a bar
    results: dict[int, Any] = {}
    stopped = False
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        loads: dict[int, ServerLoad] = {}
        for i, url in urls.items():
            load = ServerLoad(session, url, served_model(args), workload, settings)
            try:
                await load.begin()
            except BenchmarkError as exc:  # e.g. the codec cannot carry this payload
                results[i] = exc
                continue
            except asyncio.CancelledError:  # Ctrl-C while warming up: nothing is sent, what began is kept
                uncancel_current_task()
                stopped = True
                break
            loads[i] = load
        if not stopped:
            stopped = await _take_turns(list(loads.values()), len(workload), args.block_size, rnd)
        for i, load in loads.items():
            load.interrupted = load.interrupted or stopped  # the round ended early for every arm
            while i not in results:
                try:
                    results[i] = await load.finish()
                except asyncio.CancelledError:  # Ctrl-C while counting after: count again, keep the run
                    uncancel_current_task()
                    load.interrupted = True
    return results


async def _take_turns(loads: list[Any], n: int, block: int, rnd: int) -> bool:
    """Blocks of ``block`` requests to each load in turn, the order reversed every other block (and
    round). True when Ctrl-C stopped it."""
    for b, start in enumerate(range(0, n, block)):
        for load in round_order(loads, b + rnd):
            if await load.send_block(start, min(start + block, n)):
                return True
    return False


def _outcome_from(outcome: RunOutcome, result: Any, args: argparse.Namespace, tokenizer_id: str) -> None:
    """An arm's outcome from what its load returned (a result) or raised (a failed warmup)."""
    from harness.loadgen.runner import BenchmarkError

    if isinstance(result, BenchmarkError):
        refused(outcome, result)
    else:
        take_result(outcome, result, args, tokenizer_id)


def served_model(args: argparse.Namespace) -> str:
    return args.served_model_name or default_model_name(args.model_preset)


def start_server(arm: ArmSpec, rnd: int, args: argparse.Namespace) -> ServerProcess:
    """A fresh `bench serve` for ``arm`` with this run's model and engine settings."""
    flags = [*server_flags(args), *args.extra_flags.get(arm.label, [])]
    if arm.transport != "zmq":
        flags += ["--transport", arm.transport]
    if args.trace_file:
        flags += ["--trace-file", trace_path(args.trace_file, arm, rnd)]
    return ServerProcess(arm.codec, flags, args.server_log)


def refused(outcome: RunOutcome, exc: Any) -> None:
    """Every warmup request failed: for a codec that cannot carry the payload
    this is the server's clear 400, which the table shows."""
    refusal = _codec_refusal(exc.records)
    outcome.status = "error" if refusal is None else "unsupported"
    outcome.message = refusal or _error_message(str(exc))


def take_result(outcome: RunOutcome, result: Any, args: argparse.Namespace, tokenizer_id: str) -> None:
    """Report one run's BenchmarkResult, set the outcome's status from it, save it."""
    from harness.loadgen.report import print_report

    arm, rnd = outcome.arm, outcome.round
    result.tokenizer_id = tokenizer_id
    result.flags = {**flags_dict(args), "codec": arm.codec, "arm": arm.label, "round": rnd}
    print_report(result)
    outcome.result = result
    refusal = None if result.metrics.completed else _codec_refusal(result.records)
    if refusal:
        outcome.result, outcome.status, outcome.message = None, "unsupported", refusal
        return
    if result.interrupted:
        outcome.status = "interrupted"
    elif result.failed:
        outcome.status = "failures"
        outcome.message = f"{result.failed} of {result.num_prompts} requests failed"
    if args.save_result:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{arm.label}-r{rnd}-{stamp}.json"
        outcome.path = save_run(result, result_dir=args.result_dir, filename=name)
        print(f"Result saved to {outcome.path}")


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


# --- the comparison ----------------------------------------------------------

# Shown beside the judged figures, not judged: TPOT's tail and the throughputs
# (set by the arrival rate unless it is infinite).
SHOWN = (
    Figure("p99_tpot_ms", "TPOT p99"),
    Figure("request_throughput", "req/s", higher_is_better=True),
    Figure("output_throughput", "out tok/s", higher_is_better=True),
)


# The IPC budget per arm (harness.spans): median over rounds of each run's p50 (µs).
IPC_FIGURES = (
    Figure("ipc_request_encode_p50_us", "req enc"),
    Figure("ipc_request_wire_p50_us", "req wire"),
    Figure("ipc_request_decode_p50_us", "req dec"),
    Figure("ipc_request_queue_p50_us", "in queue"),
    Figure("ipc_output_queue_p50_us", "out queue"),
    Figure("ipc_output_encode_p50_us", "out enc"),
    Figure("ipc_output_wire_p50_us", "out wire"),
    Figure("ipc_output_decode_p50_us", "out dec"),
    Figure("ipc_ipc_mean_us", "IPC mean"),
    Figure("ipc_share_pct", "IPC % TTFT"),
    Figure("loop_lag_p99_ms", "loop lag p99 ms"),
)


def ipc_lines(arm_list: list[Arm]) -> list[str]:
    """The IPC budget table; nothing when no run had request timelines."""
    if not any(math.isfinite(v) for a in arm_list for v in a.values("ipc_ipc_mean_us")):
        return []
    table = text_table.format_table(
        ["arm", *(f.label for f in IPC_FIGURES)],
        [[a.label, *(median_cell(a, f.key) for f in IPC_FIGURES)] for a in arm_list if a.measured],
    )
    note = (
        "IPC budget, µs: p50 over each run's requests (first-token path), median over rounds; "
        "wire = send → receive; IPC mean = the sum on a request's path to its first token"
    )
    return ["", *table, note]


def to_entry(outcome: RunOutcome) -> RunEntry:
    """A run as the comparison sees it: its figures read from its run document."""
    figures = None
    if outcome.result is not None:
        figures = run_figures(run_document(outcome.result, sysinfo={}))
    return RunEntry(outcome.arm.label, outcome.round, outcome.status, outcome.message, outcome.path, None, figures)


def build_arms(outcomes: list[RunOutcome], arms: list[ArmSpec]) -> tuple[list[Arm], list[RunEntry]]:
    """The arms with their runs, and every run in the order it ran."""
    entries = [to_entry(o) for o in outcomes]
    return [Arm(a.label, [e for o, e in zip(outcomes, entries) if o.arm == a]) for a in arms], entries


def format_report(arm_list: list[Arm], comparison: Comparison | None) -> str:
    lines = ["", "=" * 20 + " Codec comparison " + "=" * 20]
    if comparison is None:  # one arm: nothing to judge, the figures alone
        comparison = Comparison(arm_list, [*LATENCY_FIGURES, *CODEC_FIGURES])
        lines += figures_table(comparison, SHOWN)
    else:
        lines += figures_table(comparison, SHOWN)
    for arm in arm_list:
        failed = [r for r in arm.runs if r.status in ("error", "unsupported")]
        if failed and not arm.measured:
            lines.append(f"{arm.label}: {failed[0].status}: {failed[0].message}")
    lines.append(
        "times in ms unless marked µs; µs columns are codec time per message from the server's /metrics; "
        "median over rounds ± half the range"
    )
    lines += ipc_lines(arm_list)
    if comparison.cells:
        lines += ["", *verdict_lines(comparison)]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from harness.loadgen.cli import check_endpoint, load_workload
    from harness.loadgen.runner import BenchmarkError

    try:
        arms = parse_arms(args.codec, args.transport)
        args.extra_flags = parse_arm_flags(args.arm_flags, arms)
        if chat_for_images(args):
            print("bench run: image workload, using /v1/chat/completions")
        check_run_flags(args)
        workload, tokenizer_id = load_workload(args)
        check_endpoint(workload, args.endpoint)
    except (ValueError, BenchmarkError, OSError) as exc:
        print(f"bench run: error: {exc}", file=sys.stderr)
        return 2

    rate_note = resolve_rate(arms, args, workload, tokenizer_id)
    if rate_note is None:
        return 1
    outcomes, interrupted = run_rounds(arms, args, workload, tokenizer_id)
    arm_list, order = build_arms(outcomes, arms)
    comparison, full = judge_arms(arm_list, args.margin_pct)
    print(format_report(arm_list, comparison))
    if args.save_result and outcomes:
        path = Path(args.result_dir) / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
        metadata = {"flags": flags_dict(args), "request_rate": rate_note}
        doc = compare_document(full, folder=path.parent, metadata=metadata, repeat=args.repeat, order=order)
        write_json(path, doc, indent=2)
        print(f"Comparison saved to {path}")
    if interrupted:
        return 130
    if any(o.status in ("failures", "error") for o in outcomes):
        return 1
    return 0


def chat_for_images(args: argparse.Namespace) -> bool:
    """Images only travel through chat: an image workload on /v1/completions moves to chat (True when it did)."""
    if getattr(args, "images_per_request", 0) and args.endpoint == "/v1/completions":
        args.endpoint = "/v1/chat/completions"
        return True
    return False


def judge_arms(arm_list: list[Arm], margin_pct: float) -> tuple[Comparison | None, Comparison]:
    """The verdicts among the measured arms (None with fewer than two), and the table of every arm,
    unmeasured ones included, that the compare document holds."""
    measured = [a for a in arm_list if a.measured]
    comparison = compare(measured, margin_pct=margin_pct) if len(measured) >= 2 else None
    full = Comparison(arm_list, comparison.figures if comparison else [*LATENCY_FIGURES, *CODEC_FIGURES])
    if comparison is not None:
        full.cells, full.margin_pct = comparison.cells, comparison.margin_pct
    return comparison, full


def resolve_rate(arms: list[ArmSpec], args: argparse.Namespace, workload: list, tokenizer_id: str) -> dict | None:
    """Fix --request-rate for every arm and round; with auto, from a capacity probe of the first arm."""
    if args.request_rate != AUTO:
        return {"rate": args.request_rate, "auto": False}
    errors = []
    for arm in arms:  # the first arm that can serve the workload sizes the rate for all
        if arm.unsupported() is not None:
            continue
        try:
            capacity = probe_capacity(arm, args, workload, tokenizer_id)
            break
        except RuntimeError as exc:
            errors.append(f"{arm.label}: {exc}")
        except KeyboardInterrupt:
            return None
    else:
        print(f"bench run: error: --request-rate auto: no arm could be probed: {'; '.join(errors)}", file=sys.stderr)
        return None
    args.request_rate = round(AUTO_LOAD * capacity, 2)
    print(
        f"\n[probe] capacity {capacity:.2f} req/s with {arm.label}: every arm runs at {args.request_rate:g} req/s "
        f"({AUTO_LOAD:.0%} of it; pass --request-rate to choose, inf for a saturation test)",
        flush=True,
    )
    return {"rate": args.request_rate, "auto": True, "capacity_req_s": capacity, "load": AUTO_LOAD, "probe": arm.label}


def run_rounds(
    arms: list[ArmSpec], args: argparse.Namespace, workload: list, tokenizer_id: str
) -> tuple[list[RunOutcome], bool]:
    """Every round of every arm, in round_order (with --block-size, every arm of a round at once,
    taking turns); stops at Ctrl-C keeping what finished."""
    outcomes: list[RunOutcome] = []
    for tag, announce, step in _steps(arms, args, workload, tokenizer_id):
        print(announce, flush=True)
        try:
            done = step()
        except KeyboardInterrupt:
            return outcomes, True
        outcomes += done
        for outcome in done:
            if outcome.status in ("error", "unsupported"):
                print(f"{tag} {outcome.arm.label}: {outcome.status}: {outcome.message}", flush=True)
        if any(o.status == "interrupted" for o in done):
            return outcomes, True
    return outcomes, False


def _steps(
    arms: list[ArmSpec], args: argparse.Namespace, workload: list, tokenizer_id: str
) -> Iterator[tuple[str, str, Callable[[], list[RunOutcome]]]]:
    """What run_rounds runs, in order: (tag for its messages, the line announcing it, the step)."""
    if getattr(args, "block_size", 0):
        for rnd in range(args.repeat):
            announce = (
                f"\n[round {rnd + 1}/{args.repeat}] {len(arms)} arms taking turns in blocks of {args.block_size} "
                "requests: starting their servers"
            )
            yield f"[round {rnd + 1}]", announce, partial(run_round_in_blocks, arms, rnd, args, workload, tokenizer_id)
        return
    plan = [(rnd, arm) for rnd in range(args.repeat) for arm in round_order(arms, rnd)]
    for i, (rnd, arm) in enumerate(plan, 1):
        args.progress_label = f"[{i}/{len(plan)}] {arm.label} r{rnd + 1}"  # the progress bar says where we are
        announce = f"\n[{i}/{len(plan)}] {arm.label} round {rnd + 1}/{args.repeat}: starting bench serve"
        yield f"[{i}/{len(plan)}]", announce, partial(_one_step, arm, rnd, args, workload, tokenizer_id)


def _one_step(arm: ArmSpec, rnd: int, args: argparse.Namespace, workload: list, tokenizer_id: str) -> list[RunOutcome]:
    return [run_one(arm, rnd, args, workload, tokenizer_id)]
