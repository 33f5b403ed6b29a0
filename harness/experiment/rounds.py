"""Rounds of an experiment: each arm served by a fresh `bench serve`, loaded, reported, saved.

Sequential (``block_size`` 0): the arms take whole-workload turns in
``round_order`` (a Williams design's rows). In blocks (``block_size`` N): a round
starts every arm's server at once, warms them up in the round's order, and the
arms take turns N requests at a time (A B, B A, ...; each block waits for its
requests), so the seconds-long swings of a shared machine land on every arm of
a round alike; each arm's run is still one result, and the round
is still the unit of the statistics. Side by side (``duet``): every arm's
block b is sent at the same moment instead. With ``--until-resolved`` the
rounds go on while ``keep_going`` (asked after each round) says so.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from harness.analysis.documents import label_prefix, save_run
from harness.experiment.arms import REAL_SERVERS, ArmSpec, round_order, split_arm_env
from harness.experiment.server import ServerProcess
from harness.experiment.settings import Experiment
from harness.experiment.sglang_server import SglangServer, flush_cache, remove_leftovers, shm_files
from harness.experiment.vllm_server import HANDOVER_GAP_S, VllmServer, reset_caches, spans_folder
from harness.loadgen import process_cpu
from harness.loadgen.runner import BenchmarkError, BenchmarkResult, ServerLoad, run_benchmark
from harness.loadgen.settings import LoadSettings
from harness.vllm_plugin import ENV_IPC_ONLY
from harness.wire.hook_policy import VLLM_OPT_IN
from harness.workloads.sample import SampleRequest
from wirecodecs import UNSUPPORTED_PAYLOAD

Workload = list[SampleRequest]
MAX_ROUNDS = 1000  # --until-resolved: a bound, never reached in practice (its minutes end the run first)


@dataclass
class RunOutcome:
    """One arm's run in one round (round -1: a probe): its result, or why there is none."""

    arm: ArmSpec
    round: int
    result: BenchmarkResult | None = None
    status: str = "ok"  # ok | failures | unsupported | error | interrupted
    message: str = ""
    path: Path | None = None


@dataclass
class Served:
    """One arm's server and the load settings that go with it (a real vLLM's timings folder)."""

    process: ServerProcess
    load: LoadSettings


def start_server(exp: Experiment, arm: ArmSpec, rnd: int) -> Served:
    """A fresh server for ``arm``: `bench serve` with the experiment's model and engine settings, the
    arm's own command, or a real vLLM with wirebench's plugin (--server vllm)."""
    server = exp.server
    own = server.arm_flags.get(arm.label, ())
    if arm.server == "vllm":
        assert server.vllm is not None
        vllm = server.vllm
        spans = spans_folder(exp.plan.result_dir, arm.label)
        model = _vllm_model(vllm, exp.workload.tokenizer)
        arm_env, own = split_arm_env(own)
        command = vllm.command(model, server.served_model, server.engine.max_model_len, own, arm.python)
        env = vllm.environment(arm.codec, spans, arm_env, own)
        if ENV_IPC_ONLY in env:
            print(
                f"  {arm.label}: {VLLM_OPT_IN.assignment} for vLLM (the codec unpickles its peer's data), its "
                "engine link held to a local ipc socket",
                flush=True,
            )
        process = ServerProcess(arm.codec, [], server.log_path, command=command, env=env, cpus=exp.plan.server_cpus)
        return Served(process, replace(exp.load, vllm_spans=spans))
    if arm.server == "sglang":
        assert server.sglang is not None
        return _start_sglang(exp, server.sglang, arm, own)
    flags = [*server.flags, *own]
    if arm.transport != "zmq":
        flags += ["--transport", arm.transport]
    if server.trace_file:
        flags += ["--trace-file", trace_path(server.trace_file, arm, rnd)]
    process = ServerProcess(
        arm.codec, flags, server.log_path, python=arm.python, command=arm.command, cpus=exp.plan.server_cpus
    )
    return Served(process, exp.load)


@functools.cache
def _vllm_model(vllm: VllmServer, tokenizer: str | None) -> str:
    """The model every vLLM arm serves, made (or found made) once a process."""
    return vllm.model_path(tokenizer)


def _start_sglang(exp: Experiment, sglang: SglangServer, arm: ArmSpec, own: tuple[str, ...]) -> Served:
    """A real SGLang in the arm's IPC mode, wirebench's hook timing its hops; the shared-memory files it
    leaves when stopped are removed then."""
    server = exp.server
    spans = spans_folder(exp.plan.result_dir, arm.label, "sglang")
    model = _sglang_model(sglang, exp.workload.tokenizer)
    arm_env, own = split_arm_env(own)
    command = sglang.command(model, server.served_model, server.engine.max_model_len, own, arm.python)
    before = shm_files()
    process = ServerProcess(
        arm.codec,
        [],
        server.log_path,
        command=command,
        env=sglang.environment(arm.codec, spans, arm_env),
        cpus=exp.plan.server_cpus,
        after_stop=lambda: remove_leftovers(before),
    )
    return Served(process, replace(exp.load, sglang_spans=spans))


@functools.cache
def _sglang_model(sglang: SglangServer, tokenizer: str | None) -> str:
    """The model every SGLang arm serves, made (or found made) once a process."""
    return sglang.model_path(tokenizer)


def trace_path(template: str, arm: ArmSpec, rnd: int) -> str:
    """--trace-file for one run: the file name gets the arm's label and round (one trace per server)."""
    path = Path(template)
    return str(path.with_name(f"{path.stem}-{arm.label}-r{rnd}{path.suffix or '.json'}"))


def run_one(exp: Experiment, arm: ArmSpec, rnd: int, workload: Workload, tokenizer_id: str) -> RunOutcome:
    """One arm's run: a fresh server, the workload, the report; the server stops afterwards."""
    outcome = RunOutcome(arm, rnd)
    why = arm.unsupported()
    if why is not None:
        outcome.status, outcome.message = "unsupported", why
        return outcome
    served = start_server(exp, arm, rnd)
    server = served.process
    try:
        base_url = server.wait_ready(exp.server.ready_timeout_s)
        roles = process_cpu.server_roles(server.proc.pid)
        before = process_cpu.snapshot(roles)
        try:
            model = asyncio.run(served_model(exp, arm, base_url))
            result = asyncio.run(run_benchmark(base_url, model, workload, served.load))
        except BenchmarkError as exc:
            refused(outcome, exc)
            return outcome
        result.process_cpu = _cpu(before, process_cpu.snapshot(roles), result)
        take_result(exp, outcome, result, tokenizer_id)
    except RuntimeError as exc:
        outcome.status, outcome.message = "error", str(exc)
    finally:
        server.stop()
    return outcome


async def served_model(exp: Experiment, arm: ArmSpec, base_url: str) -> str:
    """The model name to send: the experiment's, except that an arm running a server command of its own is
    sent the first model its server lists at /v1/models (a real vLLM refuses any other name with a 404)."""
    if not arm.command or exp.server.model_named:
        return exp.server.served_model
    import aiohttp

    from harness.loadgen.serverstats import ServerUnreachable, fetch_model_ids

    try:
        async with aiohttp.ClientSession() as session:
            ids = await fetch_model_ids(session, base_url)
    except ServerUnreachable as exc:
        raise BenchmarkError(str(exc)) from None
    return ids[0] if ids else exp.server.served_model


def run_round_in_blocks(
    exp: Experiment, arms: list[ArmSpec], rnd: int, workload: Workload, tokenizer_id: str
) -> list[RunOutcome]:
    """One round of every arm in blocks of ``exp.plan.block_size``, each arm on its own fresh server,
    all up for the round."""
    with BlockServers(exp, arms, rnd) as servers:
        return servers.round(rnd, workload, tokenizer_id)


# Whether to run another round, asked with every outcome so far (--until-resolved); None: --repeat rounds.
KeepGoing = Callable[[list[RunOutcome]], bool]


def round_numbers(exp: Experiment) -> range:
    """The rounds to run: --repeat of them, or up to MAX_ROUNDS until the answer is known."""
    return range(MAX_ROUNDS if exp.plan.sequential else exp.plan.repeat)


def round_name(exp: Experiment, rnd: int) -> str:
    return f"round {rnd + 1}" + (", until resolved" if exp.plan.sequential else f"/{exp.plan.repeat}")


def run_rounds_on_kept_servers(
    exp: Experiment,
    arms: list[ArmSpec],
    workload: Workload,
    tokenizer_id: str,
    keep_going: KeepGoing | None = None,
) -> list[RunOutcome]:
    """Every round in blocks on servers started once (a real vLLM takes a minute to start); each round is
    still its own result per arm, the unit of the statistics. Stops at the first interrupted round, or
    when ``keep_going`` says so."""
    outcomes: list[RunOutcome] = []
    with BlockServers(exp, arms, 0) as servers:
        for rnd in round_numbers(exp):
            if rnd:
                print(f"\n[{round_name(exp, rnd)}] the same servers, blocks of {exp.plan.block_size}", flush=True)
                servers.reset_caches()
            done = servers.round(rnd, workload, tokenizer_id)
            outcomes += done
            if any(o.status == "interrupted" for o in done):
                break
            if keep_going is not None and not keep_going(outcomes):
                break
    return outcomes


class BlockServers:
    """Every arm's server of a run in blocks, started at once and stopped together."""

    def __init__(self, exp: Experiment, arms: list[ArmSpec], rnd: int) -> None:
        self.exp, self.arms = exp, arms
        self.failed: dict[int, tuple[str, str]] = {}  # arm index → (status, message): no server to load
        self.served: dict[int, Served] = {}
        for i, arm in enumerate(arms):
            why = arm.unsupported()
            if why is not None:
                self.failed[i] = ("unsupported", why)
            else:
                self.served[i] = start_server(exp, arm, rnd)  # all start before any is waited for
        self.urls: dict[int, str] = {}

    def __enter__(self) -> BlockServers:
        try:
            for i, served in self.served.items():
                try:
                    self.urls[i] = served.process.wait_ready(self.exp.server.ready_timeout_s)
                except RuntimeError as exc:
                    self.failed[i] = ("error", str(exc))
            self.roles = {i: process_cpu.server_roles(self.served[i].process.proc.pid) for i in self.urls}
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: Any) -> None:
        stop_all([s.process for s in self.served.values()])

    def reset_caches(self) -> None:
        """Each real server's caches emptied (vLLM's, SGLang's radix cache), so a round replaying the last
        one's prompts and images is not served from them; a server that refuses says so (its round then
        ran on warm caches)."""
        for i, url in self.urls.items():
            kind = self.arms[i].server
            failed = reset_caches(url) if kind == "vllm" else flush_cache(url) if kind == "sglang" else None
            if failed:
                print(f"{self.arms[i].label}: its caches were not emptied for this round: {failed}", flush=True)

    def round(self, rnd: int, workload: Workload, tokenizer_id: str) -> list[RunOutcome]:
        """One round of every arm in blocks; an arm without a server has its reason as its outcome."""
        exp = self.exp
        outcomes = [RunOutcome(arm, rnd) for arm in self.arms]
        for i, (status, message) in self.failed.items():
            outcomes[i].status, outcomes[i].message = status, message
        if not self.urls:
            return outcomes
        before = {i: process_cpu.snapshot(r) for i, r in self.roles.items()}
        loads = {i: (url, self.served[i].load, self.arms[i]) for i, url in self.urls.items()}
        results = asyncio.run(_load_in_blocks(exp, loads, workload, rnd))
        after = {i: process_cpu.snapshot(r) for i, r in self.roles.items()}
        served = [r for r in results.values() if isinstance(r, BenchmarkResult)]
        share = (sum(len(r.records) for r in served), sum(r.metrics.total_output for r in served))
        for i, result in results.items():
            if isinstance(result, BenchmarkError):
                refused(outcomes[i], result)
            else:
                result.process_cpu = _cpu(before[i], after[i], result, share)
                take_result(exp, outcomes[i], result, tokenizer_id)
        return outcomes


def _cpu(
    before: process_cpu.Snapshot,
    after: process_cpu.Snapshot,
    result: BenchmarkResult,
    client_share: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The run's process CPU over its whole load, per request and output token measured (a warmup's
    CPU, when there is one, counts in the time but not in the requests)."""
    return process_cpu.usage(before, after, len(result.records), result.metrics.total_output, client_share)


def stop_all(servers: list[ServerProcess]) -> None:
    """Signal every server first, then wait for each: they stop together, not one after another."""
    for server in servers:
        server.request_stop()
    for server in servers:
        server.stop()


async def _load_in_blocks(
    exp: Experiment, servers: dict[int, tuple[str, LoadSettings, ArmSpec]], workload: Workload, rnd: int
) -> dict[int, BenchmarkResult | BenchmarkError]:
    """Each server warmed up, then block after block of the workload to each in turn; per server its
    result, or the BenchmarkError of a warmup that failed. Ctrl-C ends the round; what ran is kept."""
    import aiohttp

    from harness.loadgen.workers import uncancel_current_task

    results: dict[int, BenchmarkResult | BenchmarkError] = {}
    stopped = False
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        loads: dict[int, ServerLoad] = {}
        # Warmups in the round's order too: the arm warmed last is not always the same one.
        for i, (url, settings, arm) in round_order(list(servers.items()), rnd):
            try:
                model = await served_model(exp, arm, url)
                load = ServerLoad(session, url, model, workload, replace(settings, progress=False))  # blocks: no bar
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
            in_order = [loads[i] for i in sorted(loads)]  # arm order: take_turns applies the design's rows
            block = exp.plan.block_size or len(workload)
            if exp.plan.duet:
                stopped = await side_by_side(in_order, len(workload), block, rnd)
            else:
                stopped = await take_turns(in_order, len(workload), block, rnd, block_gap(exp))
        for i, load in loads.items():
            load.interrupted = load.interrupted or stopped  # the round ended early for every arm
            while i not in results:
                try:
                    results[i] = await load.finish()
                except asyncio.CancelledError:  # Ctrl-C while counting after: count again, keep the run
                    uncancel_current_task()
                    load.interrupted = True
    return results


def block_gap(exp: Experiment) -> float:
    """--block-gap resolved: the one given, else HANDOVER_GAP_S when an arm is a real vLLM, else 0."""
    if exp.plan.block_gap is not None:
        return exp.plan.block_gap
    return HANDOVER_GAP_S if any(a.server == "vllm" for a in exp.arms) else 0.0


async def _interrupted_quiet(seconds: float) -> bool:
    """Sleep ``seconds``; True when Ctrl-C came meanwhile (the round then ends as in a block)."""
    from harness.loadgen.workers import uncancel_current_task

    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        uncancel_current_task()
        return True
    return False


async def take_turns(loads: list[Any], n: int, block: int, rnd: int, gap: float = 0.0) -> bool:
    """Blocks of ``block`` requests to each load in turn, block b of round r in row b + r of the
    Williams design (two arms: reversed every other block), ``gap`` seconds of quiet before a block
    that goes to another load than the last one (outside every block's clock), and before the first
    (the warmups just went to every load). True when Ctrl-C stopped it."""
    last = None
    for b, start in enumerate(range(0, n, block)):
        for load in round_order(loads, b + rnd):
            if gap and load is not last and await _interrupted_quiet(gap):
                return True
            last = load
            if await load.send_block(start, min(start + block, n)):
                return True
    return False


async def side_by_side(loads: list[Any], n: int, block: int, rnd: int) -> bool:
    """--duet: every arm's block b sent at the same moment (the same requests on the same schedule),
    block after block, so each pair of blocks shares the machine's moment exactly. The arm whose
    requests go out first (microseconds apart, one client) follows the Williams design's rows as
    take_turns' order does, so neither arm always leads. True on Ctrl-C."""
    for b, start in enumerate(range(0, n, block)):
        ordered = round_order(loads, b + rnd)
        stops = await asyncio.gather(*(load.send_block(start, min(start + block, n)) for load in ordered))
        if any(stops):
            return True
    return False


def refused(outcome: RunOutcome, exc: BenchmarkError) -> None:
    """Every warmup request failed: for a codec that cannot carry the payload
    this is the server's clear 400, which the table shows."""
    refusal = exc.refusal or _codec_refusal(exc.records)
    outcome.status = "error" if refusal is None else "unsupported"
    outcome.message = refusal or _error_message(str(exc))


def take_result(exp: Experiment, outcome: RunOutcome, result: BenchmarkResult, tokenizer_id: str) -> None:
    """Report one run's result, set the outcome's status from it, save it."""
    from harness.loadgen.report import failures_line, print_report, run_line

    arm, rnd = outcome.arm, outcome.round
    result.tokenizer_id = tokenizer_id
    result.flags = {**exp.record(), "codec": arm.codec, "arm": arm.label, "round": rnd}
    if arm.python or arm.command:  # a build arm: which server it ran
        result.flags["server_python" if arm.python else "server_command"] = arm.python or arm.command
    refusal = None if result.metrics.completed else _codec_refusal(result.records)
    if exp.plan.full_report:
        print_report(result)
    else:
        line = f"{arm.label} {f'r{rnd + 1}' if rnd >= 0 else 'probe'}: {run_line(result)}"  # -1: the probe
        if result.interrupted:
            line += "; interrupted"
        elif result.failed and not refusal:  # why it fell short, as its file says (a refusal is said below)
            line += f"; {failures_line(result)}"
        print(line, flush=True)
    outcome.result = result
    if refusal:
        outcome.result, outcome.status, outcome.message = None, "unsupported", refusal
        return
    if result.interrupted:
        outcome.status = "interrupted"
    elif result.failed:
        outcome.status = "failures"
        outcome.message = failures_line(result)
    if exp.plan.save_result:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{label_prefix(exp.flags)}{arm.label}-r{rnd}-{stamp}.json"
        outcome.path = save_run(result, result_dir=exp.plan.result_dir, filename=name)
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
    return match.group(1) if match and match.group(1) else text  # an empty message says less than the text


def run_rounds(
    exp: Experiment, workload: Workload, tokenizer_id: str, keep_going: KeepGoing | None = None
) -> tuple[list[RunOutcome], bool]:
    """Every round of every arm, in round_order (in blocks: every arm of a round at once, taking
    turns); stops at Ctrl-C keeping what finished, or when ``keep_going`` (asked after each round in
    blocks) says so. Returns (outcomes, interrupted)."""
    outcomes: list[RunOutcome] = []
    try:
        for tag, announce, step in _steps(exp, workload, tokenizer_id, keep_going):
            print(announce, flush=True)
            done = step()
            outcomes += done
            for outcome in done:
                if outcome.status in ("error", "unsupported"):
                    print(f"{tag} {outcome.arm.label}: {outcome.status}: {outcome.message}", flush=True)
            if any(o.status == "interrupted" for o in done):
                return outcomes, True
            if keep_going is not None and not _kept(exp) and not keep_going(outcomes):  # kept servers: per round
                break
    except KeyboardInterrupt:  # a server starting or stopping, or a round being judged (--until-resolved)
        return outcomes, True
    return outcomes, False


def _how(exp: Experiment) -> str:
    return "side by side" if exp.plan.duet else "taking turns"


def _kept(exp: Experiment) -> bool:
    """Rounds in blocks on servers kept for every round (a real vLLM's or SGLang's)."""
    return bool(exp.plan.block_size) and any(a.server in REAL_SERVERS for a in exp.arms)


def _steps(
    exp: Experiment, workload: Workload, tokenizer_id: str, keep_going: KeepGoing | None = None
) -> Iterator[tuple[str, str, Callable[[], list[RunOutcome]]]]:
    """What run_rounds runs, in order: (tag for its messages, the line announcing it, the step)."""
    arms, plan = list(exp.arms), exp.plan
    if _kept(exp):
        announce = (
            f"\n[{round_name(exp, 0)}] {len(arms)} arms {_how(exp)} in blocks of {plan.block_size} requests: "
            "starting their servers, kept for every round"
        )
        yield "[rounds]", announce, partial(run_rounds_on_kept_servers, exp, arms, workload, tokenizer_id, keep_going)
        return
    if plan.block_size:
        for rnd in round_numbers(exp):
            announce = (
                f"\n[{round_name(exp, rnd)}] {len(arms)} arms {_how(exp)} in blocks of {plan.block_size} "
                "requests: starting their servers"
            )
            yield f"[round {rnd + 1}]", announce, partial(run_round_in_blocks, exp, arms, rnd, workload, tokenizer_id)
        return
    steps = [(rnd, arm) for rnd in range(plan.repeat) for arm in round_order(arms, rnd)]
    for i, (rnd, arm) in enumerate(steps, 1):
        # The progress bar says where we are.
        labelled = replace(exp, load=replace(exp.load, progress_label=f"[{i}/{len(steps)}] {arm.label} r{rnd + 1}"))
        announce = f"\n[{i}/{len(steps)}] {arm.label} round {rnd + 1}/{plan.repeat}: starting its server"
        yield f"[{i}/{len(steps)}]", announce, partial(_one_step, labelled, arm, rnd, workload, tokenizer_id)


def _one_step(exp: Experiment, arm: ArmSpec, rnd: int, workload: Workload, tokenizer_id: str) -> list[RunOutcome]:
    return [run_one(exp, arm, rnd, workload, tokenizer_id)]
