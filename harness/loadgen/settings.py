"""The load's settings, validated once: ``LoadSettings`` and the error a load that cannot run raises.

A field declared with ``setting`` is its own flag (harness.settings.declare; harness.loadgen.flags adds
the flags); ``from_args`` reads the rest from flags that transform their value.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace
from typing import Any

from harness.loadgen import conversations, fanout
from harness.loadgen import metrics as M
from harness.loadgen.arrivals import positive_float
from harness.loadgen.client import CHAT_COMPLETIONS, COMPLETIONS, ENDPOINTS, RequestRecord
from harness.loadgen.ramp import STRATEGIES, Ramp, ramp_from
from harness.loadgen.workers import WorkerCount, parse_workers
from harness.settings import declare
from harness.settings.declare import setting
from harness.wire.messages import MAX_LOGPROBS

DEFAULT_REQUEST_TIMEOUT_S = 600.0


class BenchmarkError(Exception):
    """The benchmark cannot run as asked (bad settings, warmup failed).

    ``records`` holds the failed warmup requests when that is the reason; ``refusal`` says why the
    server's codec could not carry them, when the server told (a real vLLM's plugin records it).
    """

    def __init__(self, message: str, records: list[RequestRecord] | None = None, refusal: str | None = None) -> None:
        super().__init__(message)
        self.records = records or []
        self.refusal = refusal


@dataclass(frozen=True)
class LoadSettings:
    """The load flags, validated; built from an argparse namespace. A field declared with ``setting``
    is its own flag (harness.settings.declare, added by harness.loadgen.flags); the others are read from
    flags that transform their value (--request-timeout, --percentile-metrics, ...) by ``from_args``.
    """

    endpoint: str = setting(
        COMPLETIONS,
        flag="--endpoint",
        choices=ENDPOINTS,
        help=f"API endpoint (default {COMPLETIONS}); image workloads need {CHAT_COMPLETIONS}",
        comparable=True,
    )
    request_rate: float = math.inf
    burstiness: float = setting(
        1.0,
        flag="--burstiness",
        type=positive_float,
        help="gamma shape of the arrival intervals: 1.0 = Poisson, <1 burstier, >1 more regular",
        comparable=True,
    )
    # vLLM bench serve's load ramp (harness.loadgen.ramp); it replaces --request-rate.
    ramp_up_strategy: str | None = setting(
        None,
        flag="--ramp-up-strategy",
        choices=STRATEGIES,
        help="ramp the offered rate from --ramp-up-start-rps (the first request) to --ramp-up-end-rps (the last), "
        "as vLLM bench serve does, in place of --request-rate (bench run: of the capacity probe); the report "
        "shows TTFT and the codec per offered-rate bucket (default: no ramp)",
        comparable=True,
    )
    ramp_up_start_rps: float | None = setting(
        None,
        flag="--ramp-up-start-rps",
        type=float,
        metavar="RPS",
        help="the ramp's first rate (> 0 for exponential)",
        comparable=True,
    )
    ramp_up_end_rps: float | None = setting(
        None,
        flag="--ramp-up-end-rps",
        type=float,
        metavar="RPS",
        help="the ramp's last rate, at least the first",
        comparable=True,
    )
    seed: int | None = 0  # the dataset flags own --seed: it seeds the arrivals too
    max_concurrency: int | None = setting(
        None,
        flag="--max-concurrency",
        type=int,
        help="at most this many requests in flight; a request whose planned time has come "
        "waits for a slot, which shows up as schedule lag",
        comparable=True,
    )
    selected_metrics: tuple[str, ...] = M.DEFAULT_PERCENTILE_METRICS
    percentiles: tuple[float, ...] = M.DEFAULT_PERCENTILES
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    warmup_requests: int = setting(
        0,
        flag="--warmup-requests",
        aliases=("--num-warmups",),  # vLLM bench serve's name
        help="requests sent before the clock starts and not counted (default 0)",
    )
    # In seconds; the flag's 0 (no limit) reads back as None.
    request_timeout_s: float | None = setting(
        DEFAULT_REQUEST_TIMEOUT_S,
        flag="--request-timeout",
        help=f"seconds a request may take in all; 0 = no limit (default {DEFAULT_REQUEST_TIMEOUT_S:g})",
    )
    continuous_usage: bool = setting(
        True,
        flag="--no-continuous-usage",
        help="do not ask for usage in every chunk (stream_options.continuous_usage_stats); "
        "then each non-empty chunk counts as one token",
    )
    # Top logprobs per token asked of the server (vLLM benchmark's --logprobs).
    logprobs: int | None = setting(
        None,
        flag="--logprobs",
        type=int,
        metavar="K",
        help="ask for the top-K logprobs of every output token (completions: logprobs=K; chat: logprobs=true, "
        "top_logprobs=K), as vLLM's benchmark_serving --logprobs: heavier outputs on the wire (default: none)",
        comparable=True,
    )
    progress: bool | None = None  # None: when stderr is a TTY
    progress_label: str = "requests"  # bench run names the arm and round here
    # Client processes (or "auto"), and the Ray address ("" = ray.init's default; None = no Ray): see fanout.
    workers: WorkerCount = setting(
        1,
        flag="--workers",
        type=parse_workers,
        metavar="N|auto",
        help="client processes sharing the schedule (round-robin) and one start instant; metrics are computed "
        "once from all raw records. auto: half the usable CPUs for a server on this host (loopback URL), all but "
        "one for a remote one, 1..8; with --ray one actor per node. --max-concurrency is shared out among them "
        "(default 1: this process)",
    )
    ray: str | None = None
    # A real vLLM's timings folder (its plugin's WIREBENCH_VLLM_SPANS): bench load's --vllm-spans, or each
    # vLLM arm's own in bench run. The run's codec figures and IPC budget are read from it.
    vllm_spans: str | None = None
    # A real SGLang's timings folder (wirebench's hook's WIREBENCH_SGLANG_SPANS): each SGLang arm's own in
    # bench run; read the same way.
    sglang_spans: str | None = None

    def __post_init__(self) -> None:
        # Here, not in from_args, so every copy (bench sweep's rate per point among them) is checked.
        try:
            ramp = self.ramp
        except ValueError as exc:
            raise BenchmarkError(str(exc)) from None
        if ramp is not None and math.isfinite(self.request_rate):
            raise BenchmarkError(
                f"--ramp-up-strategy sets the rate over the run: drop --request-rate {self.request_rate:g}"
            )

    @property
    def ramp(self) -> Ramp | None:
        """The load ramp the flags describe (ValueError for one that cannot run), None without one."""
        return ramp_from(self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps)

    @property
    def peak_rate(self) -> float:
        """The highest rate offered: a ramp's end, else --request-rate (inf: all at once)."""
        ramp = self.ramp
        return ramp.end_rps if ramp is not None else self.request_rate

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadSettings:
        """Read the flags of add_load_arguments; a missing attribute, or None, takes its default."""
        d = cls()
        given = {k: v for k, v in vars(args).items() if v is not None}

        def get(name: str, default: Any) -> Any:
            return given.get(name, default)

        declared = declare.from_values(cls, given)  # endpoint is validated by check_endpoint
        max_conc = declared.max_concurrency
        if max_conc is not None and max_conc < 1:
            raise BenchmarkError(f"--max-concurrency must be >= 1, got {max_conc}")
        logprobs = declared.logprobs
        if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
            raise BenchmarkError(f"--logprobs must be in [0, {MAX_LOGPROBS}] (OpenAI's limit), got {logprobs}")
        if declared.warmup_requests < 0:
            raise BenchmarkError(f"--warmup-requests must be >= 0, got {declared.warmup_requests}")
        refused = conversations.refusal(given)  # a multi-turn workload's turns are not independent requests
        if refused is not None:
            raise BenchmarkError(refused)
        goodput = get("goodput", None) or []
        timeout = declared.request_timeout_s
        if get("no_progress", False):
            progress: bool | None = False
        elif get("progress", False):
            progress = True
        else:
            progress = None
        try:
            metrics_sel = get("percentile_metrics", ",".join(d.selected_metrics))
            pcts = get("metric_percentiles", "99")
            fanout.check_settings(declared.workers, get("ray", None), max_conc)
            return replace(
                declared,
                request_rate=float(get("request_rate", d.request_rate)),
                seed=getattr(args, "seed", d.seed),
                selected_metrics=M.parse_percentile_metrics(metrics_sel)
                if isinstance(metrics_sel, str)
                else tuple(metrics_sel),
                percentiles=M.parse_percentiles(pcts) if isinstance(pcts, str) else tuple(float(p) for p in pcts),
                goodput_slos_ms=M.parse_goodput(goodput) if not isinstance(goodput, dict) else dict(goodput),
                request_timeout_s=float(timeout) if timeout and timeout > 0 else None,
                progress=progress,
                progress_label=str(get("progress_label", d.progress_label)),
                ray=get("ray", None),
                vllm_spans=get("vllm_spans", None),
                sglang_spans=get("sglang_spans", None),
            )
        except ValueError as exc:
            raise BenchmarkError(str(exc)) from None
