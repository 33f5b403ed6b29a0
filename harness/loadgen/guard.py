"""The client-bottleneck guard: did the client, not the server, limit the run?

A load generator that runs out of CPU becomes part of what it measures: it
sends late, and it reads chunks late, so TTFT and ITL grow although the
server did not slow down. Three signs, each with a threshold; any one
crossed marks the run CLIENT-LIMITED (``--strict-client`` turns that into
exit code 4):

- schedule lag p99 > SCHEDULE_LAG_P99_MS: requests left later than planned,
  so the offered load was not the one asked for. With --max-concurrency the
  dispatch lag is judged instead (waiting for a slot is the limit doing its
  job, not the client failing). Not judged at rate inf, where everything is
  planned at 0 and lag is only the time to start N requests.
- event-loop lag p99 > LOOP_LAG_P99_MS (``looplag``): the loop woke a
  sleeping task that much late, and every chunk read waits the same way.
- coalesced share > COALESCED_SHARE_MAX: of the socket reads that carried
  output, the share that carried more than one output chunk. A client that
  reads late finds several chunks waiting and stamps them with one time
  (ITL samples of 0 ms). A server that writes chunks back to back causes it
  too. A wirebench server counts the outputs it took while the request's
  next one already waited (its loop behind that stream, the two chunks
  written back to back); when the client's own lags stayed within their
  lines and those outputs explain the chunks that shared a read (a burst
  of k chunks is k - 1 of each; the client may add COALESCED_SHARE_MAX of
  its reads, its own line), the sign is the server's: noted, not held
  against the client. Both are totals over the run, so a server behind
  early can cover a client late later on when its lags did not show it. Any other server, or a
  coalescing share it does not explain, still marks the run.

Coalescing is counted from the records: the client stamps every event of
one read with the same time, so chunks of one read have equal chunk times
(exactly: separate reads never share a perf_counter value). That costs
nothing in the read loop and works on saved result files.

Thresholds come from scripts/studies/client_capacity/ against a server of known
timing (TTFT 100 ms, 5 ms per token) on a 2-core VM: in runs within 2 % of
the true TTFT, p99 schedule lag stayed below ~7 ms, loop lag below ~5 ms
(idle baseline ~2 ms there) and coalescing below ~2.6 %; runs 3 % or more
off had crossed at least one line. The guard is for a client that clearly
limits the run; the first 2 % of drift can come before any sign crosses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.loadgen.client import RequestRecord

SCHEDULE_LAG_P99_MS = 10.0
LOOP_LAG_P99_MS = 5.0
COALESCED_SHARE_MAX = 0.03

_WIDTH = 50


@dataclass(frozen=True)
class WorkerReport:
    """One load worker, as the report shows it."""

    worker: int
    requests: int
    host: str = ""
    pid: int | None = None
    # How late it woke at its start instant, ms (its own clock).
    start_late_ms: float = math.nan
    loop_lag_p99_ms: float = math.nan
    # Why it returned no records ("" when it did).
    error: str = ""


@dataclass(frozen=True)
class ClientHealth:
    limited: bool
    reasons: tuple[str, ...]
    mode: str
    # "schedule", "dispatch" or "" (not judged: rate inf).
    lag_kind: str
    lag_p99_ms: float
    loop_lag_samples: int
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    output_reads: int
    coalesced_reads: int
    workers: tuple[WorkerReport, ...] = ()
    barrier_spread_ms: float | None = None
    barrier_uncertainty_ms: float | None = None
    # The server's outputs taken while the next one waited, of all it streamed (None: it does not say).
    server_behind_share: float | None = None
    # Signs that were the server's doing, not the client's.
    notes: tuple[str, ...] = ()
    thresholds: dict[str, float] = field(
        default_factory=lambda: {
            "schedule_lag_p99_ms": SCHEDULE_LAG_P99_MS,
            "loop_lag_p99_ms": LOOP_LAG_P99_MS,
            "coalesced_share": COALESCED_SHARE_MAX,
        }
    )

    @property
    def coalesced_share(self) -> float:
        return self.coalesced_reads / self.output_reads if self.output_reads else math.nan


def percentile_ms(samples_s: Sequence[float], p: float) -> float:
    return float(np.percentile(np.asarray(samples_s, dtype=float), p) * 1000.0) if len(samples_s) else math.nan


def count_reads(records: Sequence[RequestRecord]) -> tuple[int, int]:
    """(reads that carried output, those that carried more than one output chunk)."""
    reads = coalesced = 0
    for rec in records:
        previous: float | None = None
        run = 0
        for t in rec.chunk_times:
            if t == previous:
                run += 1
                if run == 2:
                    coalesced += 1
            else:
                reads += 1
                run = 1
                previous = t
    return reads, coalesced


def assess(
    records: Sequence[RequestRecord],
    loop_lag_s: Sequence[float],
    *,
    request_rate: float,
    max_concurrency: int | None = None,
    mode: str = "in-process",
    workers: Sequence[WorkerReport] = (),
    barrier_spread_ms: float | None = None,
    barrier_uncertainty_ms: float | None = None,
    server_behind_share: float | None = None,
) -> ClientHealth:
    """Judge the client's own lag; pure (records and samples in, verdict out).
    ``server_behind_share``: the server's outputs written back to back, of all it streamed, when it counts them."""
    reasons: list[str] = []
    notes: list[str] = []
    sent = [r for r in records if r.sent]
    if math.isinf(request_rate):
        lag_kind, lag_p99 = "", math.nan
    elif max_concurrency:
        lag_kind = "dispatch"
        lag_p99 = percentile_ms([r.dispatched - r.planned_send for r in records if not math.isnan(r.dispatched)], 99)
    else:
        lag_kind = "schedule"
        lag_p99 = percentile_ms([r.schedule_lag for r in sent], 99)
    if lag_p99 > SCHEDULE_LAG_P99_MS:
        reasons.append(
            f"p99 {lag_kind} lag {lag_p99:.1f} ms > {SCHEDULE_LAG_P99_MS:g} ms: requests left later than planned"
        )
    loop_p99 = percentile_ms(loop_lag_s, 99)
    if loop_p99 > LOOP_LAG_P99_MS:
        reasons.append(
            f"p99 event-loop lag {loop_p99:.1f} ms > {LOOP_LAG_P99_MS:g} ms: chunks were read late, "
            "inflating TTFT and ITL"
        )
    reads, coalesced = count_reads(records)
    share = coalesced / reads if reads else 0.0
    own_lags_ok = not reasons  # schedule and loop lag, the client's own signs
    chunks = sum(len(r.chunk_times) for r in records)
    if share > COALESCED_SHARE_MAX and own_lags_ok and _server_explains(reads, chunks, server_behind_share):
        notes.append(
            f"{share:.1%} of output reads carried several chunks, but the server wrote {server_behind_share:.1%} "
            "of its outputs back to back (its loop behind their requests) while the client's own lags stayed "
            "within their lines: the server's doing, and ITL's 0 ms samples are what it sent"
        )
    elif share > COALESCED_SHARE_MAX:
        reasons.append(
            f"{share:.1%} of output reads carried several chunks > {COALESCED_SHARE_MAX:.0%}: the client read "
            "late (or the server wrote chunks back to back); ITL has 0 ms samples"
        )
    return ClientHealth(
        limited=bool(reasons),
        reasons=tuple(reasons),
        mode=mode,
        lag_kind=lag_kind,
        lag_p99_ms=lag_p99,
        loop_lag_samples=len(loop_lag_s),
        loop_lag_p99_ms=loop_p99,
        loop_lag_max_ms=max(loop_lag_s) * 1000.0 if len(loop_lag_s) else math.nan,
        output_reads=reads,
        coalesced_reads=coalesced,
        workers=tuple(workers),
        barrier_spread_ms=barrier_spread_ms,
        barrier_uncertainty_ms=barrier_uncertainty_ms,
        server_behind_share=server_behind_share,
        notes=tuple(notes),
    )


def _server_explains(reads: int, chunks: int, server_behind_share: float | None) -> bool:
    """Whether the server's back-to-back writes account for the chunks that shared a read: a burst of k
    chunks is k - 1 outputs the server took behind and k - 1 chunks read with an earlier one, so only
    chunks beyond the server's count are the client's; up to COALESCED_SHARE_MAX of its reads (one extra
    chunk each, as a late read mostly finds) is within its own line."""
    if server_behind_share is None:
        return False
    return chunks - reads <= server_behind_share * chunks + COALESCED_SHARE_MAX * reads


def _row(label: str, value: Any, fmt: str = "") -> str:
    # The report's row layout (report._row), kept here to avoid an import cycle.
    if isinstance(value, float) and fmt:
        value = "n/a" if math.isnan(value) else format(value, fmt)
    return f"{label:<40} {value!s:<10}"


def format_lines(health: ClientHealth | None) -> list[str]:
    """The console lines of the guard ([] without a verdict)."""
    if health is None:
        return []
    count = len(health.workers) or 1
    lines = [f"{'Client health':-^{_WIDTH}}", _row("Load workers:", f"{count} ({health.mode})")]
    if health.barrier_spread_ms is not None:
        spread = f"{health.barrier_spread_ms:.3f}"
        if health.barrier_uncertainty_ms:
            spread += f" +/- {health.barrier_uncertainty_ms:.3f}"
        lines.append(_row("Worker start spread (ms):", spread))
    lines += [
        _row("P99 event-loop lag (ms):", health.loop_lag_p99_ms, ".3f"),
        _row("Max event-loop lag (ms):", health.loop_lag_max_ms, ".3f"),
        _row("Coalesced output reads (%):", health.coalesced_share * 100.0, ".2f"),
    ]
    if health.server_behind_share is not None:
        lines.append(_row("Server outputs back to back (%):", health.server_behind_share * 100.0, ".2f"))
    for w in health.workers:
        if w.error:
            lines.append(f"  worker {w.worker}: {w.error}")
    if health.limited:
        lines.append(_row("Verdict:", "CLIENT-LIMITED (the client, not the server, limited this run)"))
        lines += [f"  - {reason}" for reason in health.reasons]
    else:
        lines.append(_row("Verdict:", "ok (the client kept up)"))
    lines += [f"  - {note}" for note in health.notes]
    return lines


def health_dict(health: ClientHealth | None) -> dict[str, Any] | None:
    """The result file's "client" section (report.jsonable turns NaN into null)."""
    if health is None:
        return None
    return {
        "limited": health.limited,
        "reasons": list(health.reasons),
        "mode": health.mode,
        "workers": len(health.workers) or 1,
        "barrier_spread_ms": health.barrier_spread_ms,
        "barrier_uncertainty_ms": health.barrier_uncertainty_ms,
        "lag_kind": health.lag_kind,
        "lag_p99_ms": health.lag_p99_ms,
        "loop_lag": {
            "samples": health.loop_lag_samples,
            "p99_ms": health.loop_lag_p99_ms,
            "max_ms": health.loop_lag_max_ms,
        },
        "output_reads": health.output_reads,
        "coalesced_reads": health.coalesced_reads,
        "coalesced_share": health.coalesced_share,
        "server_behind_share": health.server_behind_share,
        "notes": list(health.notes),
        "thresholds": dict(health.thresholds),
        "worker_details": [dataclasses.asdict(w) for w in health.workers],
    }
