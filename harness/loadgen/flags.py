"""The load generator's flags: server, load, client scale, metrics and result.

``bench load`` uses them all; ``bench run``, ``calibrate`` and ``sweep`` use the
load, scale, metrics and result groups and turn them into ``LoadSettings`` once.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from harness.loadgen.arrivals import positive_rate
from harness.loadgen.metrics import METRICS
from harness.loadgen.runner import DEFAULT_RESULT_DIR
from harness.loadgen.settings import LoadSettings
from harness.settings.declare import add_arguments, declared

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
RAMP_FLAGS = ("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")  # harness.loadgen.ramp


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--base-url", default=DEFAULT_BASE_URL, help=f"server URL (default {DEFAULT_BASE_URL})")
    group.add_argument("--model", default=None, help="model name to send (default: the first id of GET /v1/models)")
    group.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json used to count prompt tokens, or 'tekken' (mistral-common's; "
        "default: the project's embedded tokenizer)",
    )


def add_load_arguments(
    parser: argparse.ArgumentParser,
    *,
    rate_type: Callable[[str], Any] = positive_rate,
    rate_default: Any = math.inf,
    rate_help: str = "requests per second (default inf: send all at once)",
) -> Any:
    """Every load flag except the dataset flags (which own --seed: it seeds the arrivals too),
    --base-url and --model. bench run passes its own --request-rate type, default and help.
    Returns the client-scale group (bench load adds --strict-client to it)."""
    group = parser.add_argument_group("load")
    add_settings(group, "endpoint")
    group.add_argument(
        "--request-rate",
        type=rate_type,
        default=rate_default,
        help=rate_help,
    )
    add_settings(group, "burstiness", *RAMP_FLAGS, "max_concurrency", "warmup_requests", "request_timeout")
    add_settings(group, "logprobs")
    add_settings(group, "no_continuous_usage")

    scale = add_scale_arguments(parser)

    stats = parser.add_argument_group("metrics")
    stats.add_argument(
        "--percentile-metrics",
        default="ttft,tpot,itl",
        help=f"comma-separated metrics to report among {','.join(METRICS)} (default ttft,tpot,itl)",
    )
    stats.add_argument(
        "--metric-percentiles",
        default="99",
        help='comma-separated percentiles to report, e.g. "25,50,99" (default 99)',
    )
    stats.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="NAME:MS",
        help="SLOs for goodput, e.g. ttft:200 tpot:50 e2el:2000 (milliseconds)",
    )

    out = parser.add_argument_group("result")
    out.add_argument(
        "--save-result",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="save the JSON result (default: yes)",
    )
    out.add_argument(
        "--result-dir", default=DEFAULT_RESULT_DIR, help=f"folder of result files (default {DEFAULT_RESULT_DIR})"
    )
    out.add_argument(
        "--result-filename",
        default=None,
        help="file name of the result (default <codec-or-backend>-<timestamp>.json)",
    )
    out.add_argument(
        "--label",
        default=None,
        help="names the result files, as vLLM bench serve's --label does: bench load's <label>-<timestamp>.json "
        "in place of the codec or backend; bench run's files and comparison get it as a prefix "
        "(<label>-<arm>-r<N>-..., compare-<label>-...)",
    )
    out.add_argument(
        "--metadata",
        nargs="+",
        default=None,
        type=key_value,
        metavar="KEY=VALUE",
        help="notes to keep with the results (metadata.user in each run file and comparison), e.g. "
        "--metadata commit=abc123 host=ci-7, as vLLM bench serve's --metadata",
    )
    out.add_argument(
        "--no-progress",
        "--disable-tqdm",
        action="store_true",
        help="no progress line on stderr (--disable-tqdm: vLLM's name)",
    )
    out.add_argument("--progress", action="store_true", help="show the progress line even when stderr is not a TTY")
    return scale


def add_settings(group: Any, *dests: str) -> None:
    """Add the flags of these declared LoadSettings (by destination), in declaration order: the
    flags read back as a value of their own sit among the hand-written ones in --help's order."""
    others = {d.dest for d in declared(LoadSettings)} - set(dests)
    add_arguments(group, LoadSettings, exclude=others)


def add_scale_arguments(parser: argparse.ArgumentParser) -> Any:
    """Where the load comes from (harness/loadgen/fanout.py); returns the group for more flags."""
    group = parser.add_argument_group("client scale")
    add_settings(group, "workers")
    group.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run the --workers as Ray actors (many hosts): ADDRESS as ray.init takes it (auto, ray://head:10001); "
        "none: RAY_ADDRESS, else a cluster on this host, else a new local one. Needs "
        "pip install 'wirebench[distributed]'",
    )
    return group


def key_value(text: str) -> tuple[str, str]:
    """A ``KEY=VALUE`` word of --metadata."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def flags_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed command line as a plain dict (what result documents record as ``flags``)."""
    return {k: v for k, v in vars(args).items() if not callable(v)}
