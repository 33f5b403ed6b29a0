"""``bench load``: replay a workload against an OpenAI-compatible server.

Exit codes: 0 every request succeeded; 1 some requests failed (the partial
result is still printed and saved); 2 bad flags, an unreachable server or a
failed warmup; 4 with --strict-client, the client-bottleneck guard found that
the client, not the server, limited the run (checked after 1; the result is
still printed and saved); 130 interrupted by Ctrl-C, 143 by SIGTERM (what finished
is saved).

``bench run`` reuses ``add_load_arguments`` and ``run_benchmark`` for each
codec; ``report.print_report`` prints and ``harness.analysis.documents.save_run`` saves.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import aiohttp

from harness.analysis.documents import DEFAULT_RESULT_DIR, save_run
from harness.loadgen.arrivals import describe_arrivals, describe_own_times, own_times
from harness.loadgen.conversations import is_conversation
from harness.loadgen.flags import add_load_arguments, add_server_arguments, flags_dict
from harness.loadgen.report import failures_line, print_report
from harness.loadgen.runner import (
    BenchmarkError,
    BenchmarkResult,
    LoadSettings,
    check_endpoint,
    run_benchmark,
)
from harness.loadgen.serverstats import ServerUnreachable, fetch_model_ids
from harness.workloads.sample import SampleRequest

__all__ = [
    "add_arguments",
    "add_load_arguments",
    "add_server_arguments",
    "main",
    "run_benchmark",
    "BenchmarkResult",
    "BenchmarkError",
    "LoadSettings",
]

DESCRIPTION = """\
Replay a workload against an OpenAI-compatible server (this project's bench
serve or any other) at a chosen request rate, then print TTFT, TPOT, ITL,
end-to-end latency and throughput, with the server's codec figures when its
/metrics has them, and save the run as a JSON file."""

EPILOG = """\
example:
  bench load --base-url http://127.0.0.1:8000 --num-prompts 200 --request-rate 20

exit codes: 0 every request succeeded; 1 some failed (the partial result is
still printed and saved); 2 bad flags, an unreachable server or a failed
warmup; 4 with --strict-client, the client rather than the server limited the
run; 130 interrupted by Ctrl-C, 143 by SIGTERM (what finished is saved)."""


EXIT_FAILED_REQUESTS = 1
EXIT_USAGE = 2
EXIT_CLIENT_LIMITED = 4
EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.workloads.datasets import add_dataset_arguments  # owns --seed

    add_dataset_arguments(parser)
    add_server_arguments(parser)
    scale = add_load_arguments(parser)
    parser.add_argument_group("a real vLLM").add_argument(
        "--vllm-spans",
        metavar="DIR",
        help="the folder a real vLLM writes its timings to with wirebench's plugin on (WIREBENCH_VLLM_SPANS): the "
        "run's codec figures and IPC budget are read from it",
    )
    scale.add_argument(
        "--strict-client",
        action="store_true",
        help=f"exit {EXIT_CLIENT_LIMITED} when the client-bottleneck guard finds the client limited the run (for CI)",
    )


def load_workload(args: argparse.Namespace) -> tuple[list[SampleRequest], str]:
    """The workload the dataset flags describe, and the tokenizer's name."""
    from harness.workloads.datasets import load_workload as build
    from harness.workloads.spec import WorkloadSpec

    return build(WorkloadSpec.from_args(args))


async def resolve_model(base_url: str, model: str | None) -> str:
    """Check the server answers; pick the first model it lists when none is given."""
    async with aiohttp.ClientSession() as session:
        ids = await fetch_model_ids(session, base_url)
    if model:
        return model
    if not ids:
        raise BenchmarkError(f"{base_url}/v1/models lists no model; pass --model")
    return ids[0]


def _error(message: str) -> None:
    print(f"bench load: error: {message}", file=sys.stderr)


def _interrupted(where: str, saved: Path | None = None) -> int:
    """The one line an interrupted load ends with, and its exit code (143 for SIGTERM: bench's)."""
    left = f"what finished is saved in {saved}" if saved is not None else "nothing saved"
    print(f"bench load: interrupted during {where}; {left}", file=sys.stderr)
    return EXIT_INTERRUPTED


def main(args: argparse.Namespace) -> int:
    try:
        settings = LoadSettings.from_args(args)
    except BenchmarkError as exc:
        _error(str(exc))
        return EXIT_USAGE
    base_url = args.base_url.rstrip("/")
    try:
        model = asyncio.run(resolve_model(base_url, getattr(args, "model", None)))
    except (ServerUnreachable, BenchmarkError) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return _interrupted("the server check")

    try:
        workload, tokenizer_id = load_workload(args)
        check_endpoint(workload, settings.endpoint)
    except (BenchmarkError, ValueError, OSError) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return _interrupted("preparation")

    conc = f", max concurrency {settings.max_concurrency}" if settings.max_concurrency else ""
    arrivals = describe_arrivals(settings.request_rate, settings.burstiness, settings.ramp)
    if own_times(workload):
        arrivals = describe_own_times(workload)
    if is_conversation(workload):  # the rate starts conversations, each sending its turns in turn
        conversations = len({getattr(t, "conversation", 0) for t in workload})
        arrivals = f"{conversations} conversations starting at {arrivals.replace(' req/s', ' a second')}"
    print(
        f"Sending {len(workload)} requests to {base_url}{settings.endpoint}: {arrivals}{conc}",
        flush=True,
    )
    try:
        result = asyncio.run(run_benchmark(base_url, model, workload, settings))
    except BenchmarkError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return _interrupted("the warmup")

    result.tokenizer_id = tokenizer_id
    result.flags = flags_dict(args)
    path = None
    try:
        print_report(result)
        if getattr(args, "save_result", True):
            path = save_run(
                result,
                result_dir=getattr(args, "result_dir", None) or DEFAULT_RESULT_DIR,
                filename=getattr(args, "result_filename", None),
            )
            print(f"Result saved to {path}")
    except KeyboardInterrupt:
        return _interrupted("the report", path)
    if result.interrupted:
        return _interrupted("the load", path)
    if result.failed:
        _error(failures_line(result))
        return EXIT_FAILED_REQUESTS
    if getattr(args, "strict_client", False) and result.client_health is not None and result.client_health.limited:
        _error("the client, not the server, limited this run (--strict-client): see 'Client health' above")
        return EXIT_CLIENT_LIMITED
    return 0
