"""``bench calibrate``: what can this machine resolve?  An A/A run and injected known costs.

One ``bench run`` with these arms, interleaved over ``--repeat`` rounds (in
blocks of 20 requests by default, ``--block-size``):

- ``CODEC`` (the reference) and ``CODEC#2``: the same codec twice (A/A). Any
  "slower"/"faster" between them is a false positive, observed on this machine;
- ``CODEC+request-delay=D`` for each ``--costs-pct`` P: a known cost added to
  every request (2·D, busy-waited in the frontend's encode and the engine's
  decode), sized as P% of the mean TTFT measured by a short probe run first.

It prints the comparison and a summary: the false positives of the A/A arm,
and for each injected cost whether mean TTFT was found "slower", so the
smallest detectable per-request cost at these settings can be read off. The
compare document is saved as ``calibrate-<stamp>.json`` with that summary.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from functools import partial
from typing import Any

from harness.analysis import stats
from harness.analysis.figures import DETECTION_FIGURE
from harness.analysis.verdict_text import format_comparison
from harness.analysis.verdicts import Comparison
from harness.experiment.arms import parse_codecs
from harness.experiment.flags import add_experiment_arguments, experiment_from_args
from harness.experiment.flow import (
    ANALYSIS,
    PROBE,
    Interrupted,
    Prepared,
    UntilResolved,
    judged,
    phase,
    pin_client,
    prepare,
)
from harness.experiment.probe import probe_mean_ttft, resolve_rate
from harness.experiment.rounds import run_rounds
from harness.loadgen.runner import BenchmarkError

DESCRIPTION = """\
Find the smallest per-request cost this machine can detect at these settings.
One bench run with the codec twice (an A/A pair: any verdict between them is a
false positive) and, for each --costs-pct P, the codec plus a busy-waited cost
of P% of the mean TTFT that a short probe run measures first. It prints the
comparison and, for each injected cost, whether mean TTFT was found slower."""

EPILOG = """\
example:
  bench calibrate --codec pickle --costs-pct 1,2,5 --repeat 7

exit codes: 0 calibrated; 1 the probe or an arm failed; 2 bad flags;
130 interrupted by Ctrl-C, 143 by SIGTERM (the servers are stopped; no
calibration)."""

EXIT_INTERRUPTED = 130  # the bench command makes it 143 when SIGTERM stopped it
SIZING_PROBE = "the probe run that sizes the costs"


JUDGED_FOR_DETECTION = DETECTION_FIGURE.key
CALIBRATE_BLOCK_SIZE = 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_arguments(p)
    p.add_argument(
        "--costs-pct",
        default="1,2,5",
        help="injected per-request costs as percent of the probe's mean TTFT, comma-separated (default 1,2,5)",
    )
    # Shorter rounds than bench run's defaults: calibration runs many of them. The rate stays
    # bench run's auto (half the probed capacity): a fixed one may be a queue on a slower machine.
    # Blocks of 20 by default: on a shared machine they resolve 3-5x finer than whole-run turns
    # (measured: docs/results.md); --block-size 0 calibrates bench run's default instead.
    p.set_defaults(repeat=stats.DEFAULT_ROUNDS, num_prompts=200, block_size=CALIBRATE_BLOCK_SIZE)


def parse_costs(text: str) -> list[float]:
    try:
        costs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--costs-pct must be numbers, got {text!r}") from None
    if not costs or any(not 0 < c < 100 for c in costs):
        raise ValueError(f"--costs-pct must be percentages in (0, 100), got {text!r}")
    return costs


def delay_spec(codec: str, cost_ms: float) -> str:
    """The calibration codec adding ``cost_ms`` per request: half in encode, half in decode."""
    per_op_us = max(1, round(cost_ms * 1000 / 2))
    return f"{codec}+request-delay={per_op_us}us"


def summarize(comparison: Comparison, costs: dict[str, float], probe_ms: float) -> dict[str, Any]:
    ref, aa = comparison.arms[0].label, comparison.arms[1].label
    aa_cells = [c for c in comparison.cells if c.arm == aa]
    false_pos = [c.figure.label for c in aa_cells if c.verdict.verdict in ("slower", "faster")]
    # The costs are sized on the probe; the rounds' own reference TTFT says what they came to.
    measured = [v for v in comparison.arms[0].values(JUDGED_FOR_DETECTION) if math.isfinite(v) and v > 0]
    ref_ttft = statistics.median(measured) if measured else math.nan
    injected: list[dict[str, Any]] = []
    for label, pct in costs.items():
        cell = comparison.cell(label, JUDGED_FOR_DETECTION)
        verdict = cell.verdict if cell else None
        cost_ms = pct / 100 * probe_ms
        injected.append(
            {
                "arm": label,
                "cost_pct_of_ttft": pct,
                "cost_ms": cost_ms,
                "cost_pct_of_measured_ttft": 100 * cost_ms / ref_ttft,  # NaN without a measured TTFT
                "verdict": verdict.verdict if verdict else "not comparable",
                "text": verdict.text if verdict else "",
                "detected": bool(verdict and verdict.verdict == "slower"),
            }
        )
    detected: list[float] = [float(i["cost_pct_of_ttft"]) for i in injected if i["detected"]]
    return {
        "reference": ref,
        "probe_mean_ttft_ms": probe_ms,
        "reference_mean_ttft_ms": ref_ttft,
        "aa_arm": aa,
        "aa_judged": len(aa_cells),
        "aa_false_positives": false_pos,
        "injected": injected,
        "smallest_detected_pct": min(detected) if detected else None,
    }


def format_calibration(summary: dict[str, Any], rounds: int) -> str:
    lines = [
        "",
        "=" * 20 + " Calibration " + "=" * 20,
        f"rounds: {rounds}; probe mean TTFT {summary['probe_mean_ttft_ms']:.2f} ms ({summary['reference']}), "
        f"the rounds' {summary['reference_mean_ttft_ms']:.2f} ms (median)",
        f"A/A ({summary['reference']} vs {summary['aa_arm']}): "
        f"{len(summary['aa_false_positives'])} of {summary['aa_judged']} figures called different"
        + (f" ({', '.join(summary['aa_false_positives'])})" if summary["aa_false_positives"] else ""),
    ]
    for item in summary["injected"]:
        mark = "found" if item["detected"] else "not found"
        lines.append(
            f"injected {item['cost_pct_of_ttft']:g}% of TTFT ({item['cost_ms'] * 1000:.0f} µs per request, "
            f"{item['cost_pct_of_measured_ttft']:.1f}% of the rounds' reference): "
            f"{mark}; TTFT mean {item['text']}"
        )
    smallest = summary["smallest_detected_pct"]
    lines.append(
        "smallest injected per-request cost found: "
        + (f"{smallest:g}% of mean TTFT" if smallest is not None else "none of those tried")
    )
    return "\n".join(lines)


def costs_found(comparison: Comparison) -> bool:
    """The A/A arm (the second) resolved and every injected arm's primary found slower."""
    primaries = [c for c in comparison.cells if c.role == "primary"]
    aa, injected = primaries[:1], primaries[1:]
    return bool(aa) and aa[0].verdict.verdict in stats.RESOLVED and all(c.verdict.verdict == "slower" for c in injected)


def main(args: argparse.Namespace) -> int:
    try:
        costs_pct = parse_costs(args.costs_pct)
        if args.arm_flags:
            raise ValueError("calibrate makes its own arms: --arm-flags does not apply")
        server = getattr(args, "server", "wirebench")
        codecs = parse_codecs(args.codec, server)
        if len(codecs) != 1:
            raise ValueError("calibrate takes one codec")
        reference = codecs[0].codec
        if "+" in reference:
            raise ValueError("calibrate takes one plain codec (it adds the injected arms itself)")
        # Its A/A pair to begin with (the injected arms join once a probe has sized them).
        prepared = prepare(experiment_from_args(args, arms=parse_codecs(f"{reference},{reference}", server)))
    except (ValueError, BenchmarkError, OSError) as exc:
        print(f"bench calibrate: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as stop:
        return stopped(stop.phase)
    try:
        return calibrate(prepared, reference, costs_pct)
    except Interrupted as stop:
        return stopped(stop.phase)


def calibrate(prepared: Prepared, reference: str, costs_pct: list[float]) -> int:
    """Probe, size the injected costs, run the rounds, print and save the calibration; its exit code.
    Interrupted when Ctrl-C (SIGTERM) comes before the rounds or after them."""
    # --until-resolved: the probes count too; it is answered once the A/A arm is resolved and every injected
    # cost found (an injected cost under the margin is "equivalent", which is not what calibrate asks).
    clock = UntilResolved(prepared.experiment.plan.until_resolved, costs_found)
    pin_client(prepared.experiment)
    with phase(PROBE):
        resolved = resolve_rate(prepared.experiment, prepared.workload, prepared.tokenizer_id)
    if resolved is None:
        return 1
    exp, rate_note = resolved
    print(f"bench calibrate: probe run of {reference} to size the injected costs", flush=True)
    try:
        with phase(SIZING_PROBE):
            probe_ms = probe_mean_ttft(exp, reference, prepared.workload, prepared.tokenizer_id)
    except RuntimeError as exc:
        print(f"bench calibrate: error: {exc}", file=sys.stderr)
        return 1
    injected = {delay_spec(reference, pct / 100 * probe_ms): pct for pct in costs_pct}
    arms = parse_codecs(",".join([reference, reference, *injected]), prepared.experiment.arms[0].server)
    exp = replace(exp, arms=tuple(arms))
    keep_going = partial(clock.keep_going, exp, rate_note) if exp.plan.sequential else None
    outcomes, interrupted = run_rounds(exp, prepared.workload, prepared.tokenizer_id, keep_going)
    with phase(ANALYSIS):
        result = judged(exp, rate_note, outcomes, interrupted)
        result.stopping = clock.record() if exp.plan.sequential else None
        if result.stopped_in is not None:  # cut runs are not compared, and a calibration needs every arm
            return stopped(result.stopped_in, "no calibration")
        if any(not a.measured for a in result.arms):
            print(format_comparison(result.arms, None))
            print("bench calibrate: not every arm was measured; no calibration", file=sys.stderr)
            return 1
        comparison = result.comparison
        assert comparison is not None
        print(format_comparison(result.arms, comparison))
        summary = summarize(comparison, {a.label: injected[a.codec] for a in arms if a.codec in injected}, probe_ms)
        print(format_calibration(summary, max(len(a.measured) for a in result.arms)))  # --until-resolved: as ran
        if exp.plan.save_result:
            path, _ = result.save("calibrate", extra={"calibration": summary})
            print(f"Calibration saved to {path}")
    return 0


def stopped(where: str, what: str = "nothing left behind") -> int:
    """The one line an interrupted calibration ends with, and its exit code (143 for SIGTERM: bench's)."""
    print(f"bench calibrate: interrupted during {where}; {what}", file=sys.stderr)
    return EXIT_INTERRUPTED
