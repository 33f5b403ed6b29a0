"""From per-request records to the benchmark's figures: one pure function.

Definitions (only successful requests count, as in vLLM's benchmark_serving):

- TTFT: from the actual send to the first chunk that carried output.
- E2EL: from the actual send to ``data: [DONE]``.
- TPOT: ``(E2EL − TTFT) / (output_tokens − 1)``, only for requests with more
  than one output token.
- ITL (per token), metric ``itl``: for every chunk after the first
  token-carrying chunk, with gap ``g`` to the previous token-carrying chunk
  and ``k`` tokens, ``k`` values of ``g / k``. A chunk carrying k tokens is k
  tokens, not one. Tokens that arrive together with the first token (a
  first chunk of k > 1) have no gap before them and are not ITL samples; they
  are covered by TTFT. So a request contributes ``sum(tokens) − k_first``
  samples summing to (last chunk − first chunk).
- ITL per chunk, metric ``chunk_itl``: the gap between consecutive chunks
  that carried output, one sample per chunk after the first (this is what
  benchmark_serving calls ITL; equal to ``itl`` when every chunk is one token).
- Throughputs divide by the benchmark duration; total input tokens are the
  workload's prompt lengths (as benchmark_serving counts them).
- Goodput: successful requests meeting every given SLO (ms) per second; a
  request with at most one output token has TPOT 0 for this purpose.
- Schedule lag: actual − planned send over every request that was sent;
  dispatch lag: when the runner acted on the planned time − planned (the
  difference between the two is the wait for a --max-concurrency slot).

Every statistic is in milliseconds; std is the population std (ddof 0) and
percentiles interpolate linearly, both as numpy does by default. A statistic
of no samples is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.loadgen.client import RequestRecord

METRICS: dict[str, tuple[str, str]] = {
    # name: (label in the console, section header)
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "chunk_itl": ("Chunk ITL", "Inter-chunk Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")
DEFAULT_PERCENTILES = (99.0,)


@dataclass(frozen=True)
class MetricStats:
    """Summary of one metric's samples, in milliseconds."""

    count: int
    mean: float
    median: float
    std: float
    percentiles: dict[float, float] = field(default_factory=dict)

    @classmethod
    def of(cls, seconds: Sequence[float], percentiles: Sequence[float]) -> MetricStats:
        if not len(seconds):
            return cls(0, math.nan, math.nan, math.nan, {float(p): math.nan for p in percentiles})
        ms = np.asarray(seconds, dtype=float) * 1000.0
        return cls(
            count=len(ms),
            mean=float(np.mean(ms)),
            median=float(np.median(ms)),
            std=float(np.std(ms)),
            percentiles={float(p): float(np.percentile(ms, p)) for p in percentiles},
        )


@dataclass(frozen=True)
class LagStats:
    """Client schedule lag in milliseconds (mean, p99, max)."""

    count: int
    mean_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LagStats:
        if not len(seconds):
            return cls(0, math.nan, math.nan, math.nan)
        ms = np.asarray(seconds, dtype=float) * 1000.0
        return cls(len(ms), float(np.mean(ms)), float(np.percentile(ms, 99)), float(np.max(ms)))


@dataclass(frozen=True)
class BenchmarkMetrics:
    duration_s: float
    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    # None when no SLO was given.
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    ttft: MetricStats
    tpot: MetricStats
    itl: MetricStats
    chunk_itl: MetricStats
    e2el: MetricStats
    schedule_lag: LagStats
    dispatch_lag: LagStats
    # Per record, in record order: output tokens (0 for a failed request).
    output_lens: list[int]
    selected_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS
    selected_percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)

    def stats(self, name: str) -> MetricStats:
        if name not in METRICS:
            raise KeyError(f"unknown metric {name!r}; known: {', '.join(METRICS)}")
        return getattr(self, name)


def token_itls(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """Per-token inter-token latencies of one request (see the module docstring)."""
    out: list[float] = []
    previous: float | None = None
    for t, k in zip(chunk_times, chunk_tokens):
        if k <= 0:
            continue  # text without a token (usage said 0): no token arrived here
        if previous is not None:
            out.extend([(t - previous) / k] * k)
        previous = t
    return out


def chunk_itls(chunk_times: Sequence[float]) -> list[float]:
    """Gaps between consecutive output chunks of one request."""
    return [b - a for a, b in zip(chunk_times, chunk_times[1:])]


def request_tpot(record: RequestRecord) -> float | None:
    if record.output_tokens <= 1:
        return None
    return (record.latency - record.ttft) / (record.output_tokens - 1)


def compute_metrics(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    selected_metrics: Sequence[str] = DEFAULT_PERCENTILE_METRICS,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput_slos_ms: dict[str, float] | None = None,
) -> BenchmarkMetrics:
    """The benchmark's figures from its records; pure (no clock, no IO)."""
    unknown = [m for m in selected_metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {', '.join(METRICS)}")
    bad = [p for p in percentiles if not 0 <= p <= 100]
    if bad:
        raise ValueError(f"percentiles must be within [0, 100], got {bad}")
    slos = dict(goodput_slos_ms or {})
    unknown = [m for m in slos if m not in GOODPUT_METRICS]
    if unknown:
        raise ValueError(f"unknown goodput metric(s) {unknown}; known: {', '.join(GOODPUT_METRICS)}")

    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    citls: list[float] = []
    e2els: list[float] = []
    output_lens: list[int] = []
    total_input = 0
    good = 0
    for rec in records:
        if not rec.success:
            output_lens.append(0)
            continue
        output_lens.append(rec.output_tokens)
        total_input += rec.prompt_len
        ttfts.append(rec.ttft)
        e2els.append(rec.latency)
        tpot = request_tpot(rec)
        if tpot is not None:
            tpots.append(tpot)
        itls.extend(token_itls(rec.chunk_times, rec.chunk_tokens))
        citls.extend(chunk_itls(rec.chunk_times))
        if slos and _meets(slos, rec.ttft, tpot or 0.0, rec.latency):
            good += 1

    completed = len(ttfts)
    total_output = sum(output_lens)

    def per_second(x: float) -> float:
        return x / duration_s if duration_s > 0 else math.nan

    sent = [r for r in records if r.sent]
    return BenchmarkMetrics(
        duration_s=duration_s,
        completed=completed,
        failed=len(records) - completed,
        total_input=total_input,
        total_output=total_output,
        request_throughput=per_second(completed),
        request_goodput=per_second(good) if slos else None,
        output_throughput=per_second(total_output),
        total_token_throughput=per_second(total_input + total_output),
        ttft=MetricStats.of(ttfts, percentiles),
        tpot=MetricStats.of(tpots, percentiles),
        itl=MetricStats.of(itls, percentiles),
        chunk_itl=MetricStats.of(citls, percentiles),
        e2el=MetricStats.of(e2els, percentiles),
        schedule_lag=LagStats.of([r.schedule_lag for r in sent]),
        dispatch_lag=LagStats.of([r.dispatched - r.planned_send for r in records if not math.isnan(r.dispatched)]),
        output_lens=output_lens,
        selected_metrics=tuple(selected_metrics),
        selected_percentiles=tuple(float(p) for p in percentiles),
        goodput_slos_ms=slos,
    )


def _meets(slos_ms: dict[str, float], ttft: float, tpot: float, e2el: float) -> bool:
    values = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
    return all(values[name] * 1000.0 <= limit for name, limit in slos_ms.items())


def percentile_key(p: float) -> str:
    """'99' for 99.0, '99.9' for 99.9 (benchmark_serving's p{...} naming)."""
    return str(int(p)) if float(p).is_integer() else str(p)


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        raise ValueError(f"unknown metric(s) {unknown or text!r}; choose from {','.join(METRICS)}")
    return names


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ValueError(f"percentiles must be numbers separated by commas, got {text!r}") from None
    if not values or any(not 0 <= p <= 100 for p in values):
        raise ValueError(f"percentiles must be within [0, 100], got {text!r}")
    return values


def parse_goodput(pairs: Sequence[str]) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` → ``{"ttft": 200.0, "tpot": 50.0}`` (milliseconds)."""
    slos: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        name = name.strip().lower()
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(
                f"bad goodput SLO {pair!r}: use NAME:MILLISECONDS with NAME one of {', '.join(GOODPUT_METRICS)}"
            )
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"bad goodput SLO {pair!r}: {value!r} is not a number of milliseconds") from None
        if not limit >= 0:
            raise ValueError(f"bad goodput SLO {pair!r}: must be >= 0 ms")
        slos[name] = limit
    return slos
