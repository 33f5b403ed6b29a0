"""Short untimed runs that size an experiment: the capacity behind ``--request-rate auto``, and
the mean TTFT that ``bench calibrate`` sizes its injected costs on."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from typing import Any

from harness.experiment.arms import ArmSpec
from harness.experiment.rounds import RunOutcome, Workload, run_one, run_round_in_blocks
from harness.experiment.settings import AUTO, AUTO_LOAD, Experiment
from harness.loadgen.arrivals import own_times
from harness.loadgen.conversations import is_conversation


def untimed(exp: Experiment) -> Experiment:
    """The experiment as a probe runs it: nothing saved, no trace written."""
    return replace(exp, plan=replace(exp.plan, save_result=False), server=replace(exp.server, trace_file=None))


def probe_capacity(exp: Experiment, arm: ArmSpec, workload: Workload, tokenizer_id: str) -> float:
    """Completed requests per second of a burst (rate inf) against ``arm``'s server: its capacity.
    KeyboardInterrupt when Ctrl-C (SIGTERM) cut the burst short."""
    n = min(len(workload), max(64, 2 * exp.server.engine.max_num_seqs))
    print(f"\n[probe] {arm.label}: {n} requests at rate inf to measure capacity for --request-rate auto", flush=True)
    outcome = run_one(untimed(exp.at_rate(math.inf)), arm, -1, workload[:n], tokenizer_id)
    if outcome.status == "interrupted":  # a capacity from a burst cut short would be no capacity
        raise KeyboardInterrupt
    if outcome.result is None or not outcome.result.metrics.completed:
        raise RuntimeError(f"the capacity probe failed: {outcome.status}: {outcome.message}")
    return float(outcome.result.metrics.request_throughput)


def resolve_rate(exp: Experiment, workload: Workload, tokenizer_id: str) -> tuple[Experiment, dict[str, Any]] | None:
    """The experiment at a fixed rate, and a note of how it was fixed; with auto, from a capacity
    probe of the first arm that can serve the workload (a ramp replaces the probe: it sets the rates).
    None (said on stderr) when no arm could; KeyboardInterrupt when Ctrl-C (SIGTERM) cut the probe
    short, its server stopped."""
    rate = exp.request_rate
    if own_times(workload):  # a trace's own send times: no probe
        fixed = math.inf if rate == AUTO else float(rate)
        return exp.at_rate(fixed), {"rate": fixed, "auto": False, "dataset_arrivals": True}
    ramp = exp.load.ramp
    if ramp is not None:  # the ramp sets every request's rate: nothing to probe
        print(f"\n[ramp] every arm runs a {ramp.describe()} over its requests (no capacity probe)", flush=True)
        return exp.at_rate(math.inf), {"rate": math.inf, "auto": False, "ramp": ramp.as_dict()}
    if rate != AUTO:
        return exp.at_rate(float(rate)), {"rate": float(rate), "auto": False}
    errors = []
    for arm in exp.arms:
        if arm.unsupported() is not None:
            continue
        try:
            capacity = probe_capacity(exp, arm, workload, tokenizer_id)
            break
        except RuntimeError as exc:
            errors.append(f"{arm.label}: {exc}")
    else:
        print(f"error: --request-rate auto: no arm could be probed: {'; '.join(errors)}", file=sys.stderr)
        return None
    # Conversations: the rate starts conversations, each of which sends its turns, so the capacity in
    # requests a second is shared out among a conversation's mean turns.
    turns = len(workload) / len({getattr(t, "conversation", 0) for t in workload}) if is_conversation(workload) else 1.0
    fixed = round(AUTO_LOAD * capacity / turns, 2)
    per = f" conversations/s ({turns:.2g} turns each)" if turns != 1.0 else " req/s"
    print(
        f"\n[probe] capacity {capacity:.2f} req/s with {arm.label}: every arm runs at {fixed:g}{per}, "
        f"{AUTO_LOAD:.0%} of it\n(--request-rate sets it; inf for a saturation test)",
        flush=True,
    )
    note = {"rate": fixed, "auto": True, "capacity_req_s": capacity, "load": AUTO_LOAD, "probe": arm.label}
    if turns != 1.0:
        note["turns_per_conversation"] = round(turns, 3)
    return exp.at_rate(fixed), note


def probe_mean_ttft(exp: Experiment, codec: str, workload: Workload, tokenizer_id: str) -> float:
    """Mean TTFT of one untimed run of ``codec`` (in blocks when the experiment runs in blocks, since a
    block's first requests meet an idle server). KeyboardInterrupt when Ctrl-C cut it short."""
    arm = ArmSpec(codec, codec)
    probe = untimed(exp)
    outcome: RunOutcome
    if exp.plan.block_size:
        (outcome,) = run_round_in_blocks(probe, [arm], -1, workload, tokenizer_id)
    else:
        outcome = run_one(probe, arm, -1, workload, tokenizer_id)
    if outcome.status == "interrupted":
        raise KeyboardInterrupt
    if outcome.result is None:
        raise RuntimeError(f"the probe run of {codec} failed: {outcome.status}: {outcome.message}")
    return float(outcome.result.metrics.ttft.mean)
