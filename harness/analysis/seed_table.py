"""Our replay beside the seed's published table (``bench run --preset seed-10245``)."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence

from harness.analysis.verdicts import Arm

# The seed's published figures (ms; req/s and tok/s for throughput), from the PR's thread: main
# (msgspec) and the PR's branch (pickle). None: not published for that arm.
SEED_TABLE: dict[str, dict[str, float | None]] = {
    "msgspec": {
        "mean_ttft_ms": 221.11,
        "median_ttft_ms": 195.76,
        "p99_ttft_ms": 501.90,
        "mean_tpot_ms": 36.36,
        "median_itl_ms": 22.06,
        "p99_itl_ms": 317.37,
        "request_throughput": 34.02,
        "output_throughput": 5103.02,
    },
    "pickle": {
        "mean_ttft_ms": 235.23,
        "median_ttft_ms": None,
        "p99_ttft_ms": None,
        "mean_tpot_ms": 36.91,
        "median_itl_ms": 22.82,
        "p99_itl_ms": 321.38,
        "request_throughput": None,
        "output_throughput": None,
    },
}

# (result key, label): the figures the seed's thread published for its main branch.
SEED_FIGURES = (
    ("mean_ttft_ms", "TTFT mean (ms)"),
    ("median_ttft_ms", "TTFT median (ms)"),
    ("p99_ttft_ms", "TTFT p99 (ms)"),
    ("mean_tpot_ms", "TPOT mean (ms)"),
    ("median_itl_ms", "ITL median (ms)"),
    ("p99_itl_ms", "ITL p99 (ms)"),
    ("request_throughput", "Throughput (req/s)"),
    ("output_throughput", "Output (tok/s)"),
)
TOLERANCE_PCT = 15.0


def codec_of(label: str) -> str:
    """An arm's codec: its label before a transport, an A/A suffix or calibration options
    (``msgspec/shm``, ``msgspec#2``, ``pickle+request-delay=1ms``; harness.experiment.arms labels them)."""
    return re.split(r"[/#+]", label, maxsplit=1)[0]


def seed_rows(arm: Arm) -> list[tuple[str, float | None, float, float | None]]:
    """(label, seed's figure or None, ours as the median over rounds, difference in %) for one arm."""
    seed = SEED_TABLE.get(codec_of(arm.label), {})
    rows = []
    for key, label in SEED_FIGURES:
        values = [v for v in arm.values(key) if not math.isnan(v)]
        ours = statistics.median(values) if values else math.nan
        ref = seed.get(key)
        diff = (ours / ref - 1) * 100 if ref and not math.isnan(ours) else None
        rows.append((label, ref, ours, diff))
    return rows


def format_seed_table(
    arms: list[Arm],
    output_codec: str | None = None,
    departures: Sequence[str] = (),
    arm_departures: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """One block per arm whose codec the seed measured: its figures, ours, and whether within ±15%.
    ``output_codec``: the outputs' codec in every arm (--output-codec), None when each arm used its own.
    ``departures``: the preset's fitted settings this run changed (the fit then does not hold);
    ``arm_departures``: those one arm's own flags changed (--arm-flags), by label."""
    arm_departures = arm_departures or {}
    outputs = (
        f"requests in each arm's codec, outputs in {output_codec} in every arm"
        if output_codec
        else "requests and outputs in each arm's codec"
    )
    lines = [
        "==================== Beside the seed (vLLM PR #10245, Llama-3.1-8B on one H100) ====================",
        "ours: this machine's real frontend, codecs, sockets and client; the GPU's time is modelled "
        "(llama8b-h100); median over rounds",
        f"{outputs} (the PR pickled requests only; its outputs stayed msgpack)",
        (
            "fitted to the seed: the modelled step's fixed part, to its median ITL; time the seed spent outside "
            "its GPU is not modelled (docs/seed.md)"
            + ("; arms marked below left the fit" if any(arm_departures.values()) else "")
            if not departures
            else "not the preset's fit: this run set " + ", ".join(departures) + " (docs/seed.md)"
        ),
    ]
    for arm in arms:
        if codec_of(arm.label) not in SEED_TABLE or not arm.measured:
            continue
        lines.append(f"{arm.label:<24}{'seed':>12}{'ours':>12}{'diff':>10}  within ±{TOLERANCE_PCT:g}%")
        own = [d for d in arm_departures.get(arm.label, ()) if d not in departures]
        if own:
            lines.append("  not the preset's fit: this arm set " + ", ".join(own))
        for label, ref, ours, diff in seed_rows(arm):
            ref_text = f"{ref:,.2f}" if ref is not None else "-"
            diff_text = f"{diff:+.1f}%" if diff is not None else "-"
            ok = "-" if diff is None else ("yes" if abs(diff) <= TOLERANCE_PCT else "no")
            lines.append(f"  {label:<22}{ref_text:>12}{ours:>12,.2f}{diff_text:>10}  {ok}")
    return "\n".join(lines)
