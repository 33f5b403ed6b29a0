"""``bench load``: replay a workload against an OpenAI-compatible server.

Exit codes: 0 every request succeeded; 1 some requests failed (the partial
result is still printed and saved); 2 bad flags, an unreachable server or a
failed warmup; 4 with --strict-client, the client-bottleneck guard found that
the client, not the server, limited the run (checked after 1; the result is
still printed and saved); 130 interrupted by Ctrl-C (what finished is saved).

``bench run`` reuses ``add_load_arguments`` and ``run_benchmark`` for each
codec; ``report.print_report`` prints and ``harness.documents.save_run`` saves.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import aiohttp

from harness.documents import DEFAULT_RESULT_DIR, save_run
from harness.loadgen.arrivals import describe_arrivals, positive_float, positive_rate
from harness.loadgen.client import CHAT_COMPLETIONS, COMPLETIONS
from harness.loadgen.metrics import METRICS
from harness.loadgen.report import print_report
from harness.loadgen.runner import (
    DEFAULT_REQUEST_TIMEOUT_S,
    BenchmarkError,
    BenchmarkResult,
    LoadSettings,
    check_endpoint,
    run_benchmark,
)
from harness.loadgen.serverstats import ServerUnreachable, fetch_model_ids
from harness.loadgen.workers import parse_workers
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

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
EXIT_FAILED_REQUESTS = 1
EXIT_USAGE = 2
EXIT_CLIENT_LIMITED = 4
EXIT_INTERRUPTED = 130


def _add_once(group: argparse._ActionsContainer, *flags: str, **kwargs: Any) -> None:
    """Add a flag unless another module (the dataset flags) already did.

    --seed and --tokenizer may be defined by the dataset flags too; the first
    definition wins and both users read the same value.
    """
    if any(flag in group._option_string_actions for flag in flags):
        return
    group.add_argument(*flags, **kwargs)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    _add_once(group, "--base-url", default=DEFAULT_BASE_URL, help=f"server URL (default {DEFAULT_BASE_URL})")
    _add_once(group, "--model", default=None, help="model name to send (default: the first id of GET /v1/models)")
    _add_once(
        group,
        "--tokenizer",
        default=None,
        help="tokenizer.json used to count prompt tokens (default: the project's embedded tokenizer)",
    )


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """Every load flag except the dataset flags, --base-url and --model."""
    group = parser.add_argument_group("load")
    _add_once(
        group,
        "--endpoint",
        default=COMPLETIONS,
        choices=(COMPLETIONS, CHAT_COMPLETIONS),
        help=f"API endpoint (default {COMPLETIONS}); image workloads need {CHAT_COMPLETIONS}",
    )
    _add_once(
        group,
        "--request-rate",
        type=positive_rate,
        default=float("inf"),
        help="requests per second (default inf: send all at once)",
    )
    _add_once(
        group,
        "--burstiness",
        type=positive_float,
        default=1.0,
        help="gamma shape of the arrival intervals: 1.0 = Poisson, <1 burstier, >1 more regular",
    )
    _add_once(group, "--seed", type=int, default=0, help="random seed (arrival schedule; default 0)")
    _add_once(
        group,
        "--max-concurrency",
        type=int,
        default=None,
        help="at most this many requests in flight; a request whose planned time has come "
        "waits for a slot, which shows up as schedule lag",
    )
    _add_once(
        group,
        "--warmup-requests",
        type=int,
        default=0,
        help="requests sent before the clock starts and not counted (default 0)",
    )
    _add_once(
        group,
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help=f"seconds a request may take in all; 0 = no limit (default {DEFAULT_REQUEST_TIMEOUT_S:g})",
    )
    _add_once(
        group,
        "--no-continuous-usage",
        action="store_true",
        help="do not ask for usage in every chunk (stream_options.continuous_usage_stats); "
        "then each non-empty chunk counts as one token",
    )

    add_scale_arguments(parser)

    stats = parser.add_argument_group("metrics")
    _add_once(
        stats,
        "--percentile-metrics",
        default="ttft,tpot,itl",
        help=f"comma-separated metrics to report among {','.join(METRICS)} (default ttft,tpot,itl)",
    )
    _add_once(
        stats,
        "--metric-percentiles",
        default="99",
        help='comma-separated percentiles to report, e.g. "25,50,99" (default 99)',
    )
    _add_once(
        stats,
        "--goodput",
        nargs="+",
        default=None,
        metavar="NAME:MS",
        help="SLOs for goodput, e.g. ttft:200 tpot:50 e2el:2000 (milliseconds)",
    )

    out = parser.add_argument_group("result")
    _add_once(
        out,
        "--save-result",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="save the JSON result (default: yes)",
    )
    _add_once(
        out, "--result-dir", default=DEFAULT_RESULT_DIR, help=f"folder of result files (default {DEFAULT_RESULT_DIR})"
    )
    _add_once(
        out,
        "--result-filename",
        default=None,
        help="file name of the result (default <codec-or-backend>-<timestamp>.json)",
    )
    _add_once(out, "--no-progress", action="store_true", help="no progress line on stderr")
    _add_once(out, "--progress", action="store_true", help="show the progress line even when stderr is not a TTY")


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the load comes from (harness/loadgen/fanout.py)."""
    group = parser.add_argument_group("client scale")
    _add_once(
        group,
        "--workers",
        type=parse_workers,
        default=1,
        metavar="N|auto",
        help="client processes sharing the schedule (round-robin) and one start instant; metrics are computed "
        "once from all raw records. auto: half the usable CPUs for a server on this host (loopback URL), all but "
        "one for a remote one, 1..8; with --ray one actor per node. --max-concurrency is shared out among them "
        "(default 1: this process)",
    )
    _add_once(
        group,
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run the --workers as Ray actors (many hosts): ADDRESS as ray.init takes it (auto, ray://head:10001); "
        "none: RAY_ADDRESS, else a cluster on this host, else a new local one. Needs "
        "pip install 'wirebench[distributed]'",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.workloads.datasets import (
        add_dataset_arguments,  # the dataset flags own --seed/--tokenizer if they define them
    )

    add_dataset_arguments(parser)
    add_server_arguments(parser)
    add_load_arguments(parser)
    scale = next(g for g in parser._action_groups if g.title == "client scale")
    _add_once(
        scale,
        "--strict-client",
        action="store_true",
        help=f"exit {EXIT_CLIENT_LIMITED} when the client-bottleneck guard finds the client limited the run (for CI)",
    )


def load_workload(args: argparse.Namespace) -> tuple[list[SampleRequest], str]:
    """The workload and the tokenizer's name, built before any clock starts."""
    from harness.tokenizer import load_tokenizer
    from harness.workloads.datasets import build_workload

    tokenizer = load_tokenizer(getattr(args, "tokenizer", None))
    return build_workload(args, tokenizer), tokenizer.name


async def resolve_model(base_url: str, model: str | None) -> str:
    """Check the server answers; pick the first model it lists when none is given."""
    async with aiohttp.ClientSession() as session:
        ids = await fetch_model_ids(session, base_url)
    if model:
        return model
    if not ids:
        raise BenchmarkError(f"{base_url}/v1/models lists no model; pass --model")
    return ids[0]


def flags_dict(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if not callable(v)}


def _error(message: str) -> None:
    print(f"bench load: error: {message}", file=sys.stderr)


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
        return EXIT_INTERRUPTED

    try:
        workload, tokenizer_id = load_workload(args)
        check_endpoint(workload, settings.endpoint)
    except (BenchmarkError, ValueError, OSError) as exc:
        _error(str(exc))
        return EXIT_USAGE

    conc = f", max concurrency {settings.max_concurrency}" if settings.max_concurrency else ""
    print(
        f"Sending {len(workload)} requests to {base_url}{settings.endpoint}: "
        f"{describe_arrivals(settings.request_rate, settings.burstiness)}{conc}",
        flush=True,
    )
    try:
        result = asyncio.run(run_benchmark(base_url, model, workload, settings))
    except BenchmarkError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _error("interrupted before the load started; nothing to save")
        return EXIT_INTERRUPTED

    result.tokenizer_id = tokenizer_id
    result.flags = flags_dict(args)
    print_report(result)
    if getattr(args, "save_result", True):
        path = save_run(
            result,
            result_dir=getattr(args, "result_dir", None) or DEFAULT_RESULT_DIR,
            filename=getattr(args, "result_filename", None),
        )
        print(f"Result saved to {path}")
    if result.interrupted:
        return EXIT_INTERRUPTED
    if result.failed:
        _error(f"{result.failed} of {result.num_prompts} requests failed")
        return EXIT_FAILED_REQUESTS
    if getattr(args, "strict_client", False) and result.client_health is not None and result.client_health.limited:
        _error("the client, not the server, limited this run (--strict-client): see 'Client health' above")
        return EXIT_CLIENT_LIMITED
    return 0
