"""The experiment flow that ``bench run``, ``bench calibrate`` and ``bench sweep`` share:

prepare (check the settings, build the workload, check the endpoint) → fix the
rate (a capacity probe for auto) → run the rounds → the arms with their runs →
judge → the compare document. Commands parse flags into an ``Experiment`` and
print; everything between is here, once.

Ctrl-C (or SIGTERM, which the bench command turns into the same exception) in a
phase before the rounds raises ``Interrupted`` naming the phase; in a round it
ends the rounds, and the result says which round it cut (``stopped_in``).
"""

from __future__ import annotations

import functools
import os
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from harness.analysis.blocks import block_values
from harness.analysis.documents import label_prefix, run_document, run_figures, user_metadata, write_json
from harness.analysis.runs import RunEntry, until_resolved_of
from harness.analysis.stats import RESOLVED
from harness.analysis.verdict_text import WIDTH, judge_arms
from harness.analysis.verdicts import Arm, Comparison, compare_document
from harness.experiment.arms import ArmSpec
from harness.experiment.probe import resolve_rate
from harness.experiment.rounds import RunOutcome, Workload, round_name, run_rounds
from harness.experiment.settings import Experiment
from harness.loadgen.runner import check_endpoint
from harness.loadgen.sysinfo import collect_sysinfo
from harness.workloads.datasets import load_workload

# The phases an interrupt can land in before and after the rounds (a round is named by round_name).
PREPARATION = "preparation"
PROBE = "the capacity probe"
ANALYSIS = "analysis"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during ``phase``; a KeyboardInterrupt still, so every handler of Ctrl-C
    (a sweep's, a server's cleanup) treats it as one."""

    def __init__(self, phase: str) -> None:
        super().__init__(phase)
        self.phase = phase


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Name the phase a Ctrl-C lands in: a KeyboardInterrupt raised inside becomes ``Interrupted(name)``
    (one raised by an inner phase keeps its own, nearer name)."""
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted(name) from None


@dataclass
class Prepared:
    """An experiment ready to run: settings checked, its workload built before any clock starts."""

    experiment: Experiment
    workload: Workload
    tokenizer_id: str
    moved_to_chat: bool = False  # an image workload moved from /v1/completions to chat


def prepare(exp: Experiment) -> Prepared:
    """Check ``exp`` and build its workload; ValueError, BenchmarkError or OSError when it cannot run,
    Interrupted on Ctrl-C (SIGTERM)."""
    with phase(PREPARATION):
        exp.check()
        exp, moved = exp.with_images_on_chat()
        workload, tokenizer_id = load_workload(exp.workload)
        check_endpoint(workload, exp.load.endpoint)
    return Prepared(exp, workload, tokenizer_id, moved)


@dataclass
class ExperimentResult:
    """What an experiment ran and found. ``comparison`` judges the measured arms (None with fewer than
    two); ``table`` holds every arm, unmeasured ones too, as the compare document does."""

    experiment: Experiment  # at the rate it ran
    rate_note: dict[str, Any]
    outcomes: list[RunOutcome]
    interrupted: bool
    arms: list[Arm] = field(default_factory=list)
    order: list[RunEntry] = field(default_factory=list)  # every run in the order it ran
    comparison: Comparison | None = None
    table: Comparison | None = None
    stopping: dict[str, Any] | None = None  # --until-resolved: how long it ran and why it stopped
    stopped_in: str | None = None  # interrupted: the round it cut ("round 2/3")

    @property
    def any_failed(self) -> bool:
        return any(o.status in ("failures", "error") for o in self.outcomes)

    def finished_rounds(self) -> ExperimentResult:
        """This result judged on the rounds that ran whole: an interrupted round's runs were cut at
        different points and are not compared as if complete (their files and the compare document
        keep them)."""
        cut = {o.round for o in self.outcomes if o.status == "interrupted"}
        if self.stopped_in is not None:
            cut.add(stopped_round(self.experiment, self.outcomes))
        whole = [o for o in self.outcomes if o.round not in cut]
        return judged(self.experiment, self.rate_note, whole, False)

    def document(self, folder: Path, **metadata: Any) -> dict[str, Any]:
        """The compare document of this experiment (paths relative to ``folder``)."""
        assert self.table is not None
        meta = {"flags": self.experiment.record(), "request_rate": self.rate_note, "machine": machine(), **metadata}
        if self.stopping is not None:
            meta["until_resolved"] = self.stopping
        meta.update(user_metadata(self.experiment.flags))
        rounds = self.stopping["rounds"] if self.stopping else self.experiment.plan.repeat  # as ran, until resolved
        return compare_document(self.table, folder=folder, metadata=meta, repeat=rounds, order=self.order)

    def save(
        self,
        prefix: str = "compare",
        folder: Path | None = None,
        extra: dict[str, Any] | None = None,
        **metadata: Any,
    ) -> tuple[Path, dict]:
        """Write the compare document (plus ``extra`` top-level fields, e.g. calibrate's summary) as
        ``<folder>/<prefix>-<stamp>.json``; (its path, the document)."""
        folder = folder or Path(self.experiment.plan.result_dir)
        path = folder / f"{prefix}-{label_prefix(self.experiment.flags)}{time.strftime('%Y%m%d-%H%M%S')}.json"
        doc = {**self.document(path.parent, **metadata), **(extra or {})}
        write_json(path, doc, indent=2)
        return path, doc


@functools.cache
def machine() -> dict[str, Any]:
    """What the gate compares across documents (harness.analysis.like_for_like): the machine's kind."""
    info = collect_sysinfo(probe_torch=False)
    return {key: info.get(key) for key in ("machine", "cpu_model", "cpu_usable")}


def run_experiment(prepared: Prepared) -> ExperimentResult | None:
    """Fix the rate, run every round (or, --until-resolved, rounds until the answer is known), judge.
    None when the rate could not be fixed (said on stderr); Interrupted on Ctrl-C (SIGTERM) in the
    probe or the analysis, while one in a round ends the rounds and is the result's ``stopped_in``."""
    clock = UntilResolved(prepared.experiment.plan.until_resolved)  # the probe's time counts too
    pin_client(prepared.experiment)
    with phase(PROBE):
        resolved = resolve_rate(prepared.experiment, prepared.workload, prepared.tokenizer_id)
    if resolved is None:
        return None
    exp, note = resolved
    keep_going = partial(clock.keep_going, exp, note) if exp.plan.sequential else None
    outcomes, interrupted = run_rounds(exp, prepared.workload, prepared.tokenizer_id, keep_going)
    with phase(ANALYSIS):
        result = judged(exp, note, outcomes, interrupted)
    result.stopping = clock.record() if exp.plan.sequential else None
    return result


def pin_client(exp: Experiment) -> None:
    """--pin-servers: this process (the load generator) on the CPUs the servers were not given."""
    if exp.plan.server_cpus:
        os.sched_setaffinity(0, os.sched_getaffinity(0) - set(exp.plan.server_cpus))


def judged(exp: Experiment, note: dict[str, Any], outcomes: list[RunOutcome], interrupted: bool) -> ExperimentResult:
    """The result of these outcomes: arms with their runs, verdicts at the plan's margin."""
    arm_list, order = build_arms(outcomes, list(exp.arms))
    comparison, table = judge_arms(arm_list, exp.plan.margin_pct, sequential=exp.plan.sequential)
    result = ExperimentResult(exp, note, outcomes, interrupted, arm_list, order, comparison, table)
    result.stopped_in = round_name(exp, stopped_round(exp, outcomes)) if interrupted else None
    return result


def stopped_round(exp: Experiment, outcomes: list[RunOutcome]) -> int:
    """The round an interrupt cut: the one with an interrupted run, else the one under way (a round
    with fewer runs than arms, or the next, when Ctrl-C came while servers were starting)."""
    cut = [o.round for o in outcomes if o.status == "interrupted"]
    if cut:
        return min(cut)
    if not outcomes:
        return 0
    last = max(o.round for o in outcomes)
    return last if sum(o.round == last for o in outcomes) < len(exp.arms) else last + 1


class UntilResolved:
    """--until-resolved: after each round, judge what ran so far with the anytime-valid test, print where
    the primary figure stands, and stop once every arm's is resolved or the next round would overrun."""

    def __init__(self, minutes: float, resolved: Resolved | None = None) -> None:
        self.minutes = minutes
        self.resolved = resolved or primaries_resolved
        self.started = self.round_started = time.monotonic()
        self.longest_round_s = 0.0
        self.rounds = 0
        self.stopped = "interrupted"  # until a round ends and says otherwise

    def keep_going(self, exp: Experiment, note: dict[str, Any], outcomes: list[RunOutcome]) -> bool:
        now = time.monotonic()
        round_s = now - self.round_started
        if not self.rounds:  # the first round from its loads' start: not the probe, not a kept server's start
            starts = [o.result.started_at.timestamp() for o in outcomes if o.result is not None]
            round_s = time.time() - min(starts) if starts else round_s
        self.longest_round_s = max(self.longest_round_s, round_s)
        self.round_started, self.rounds = now, self.rounds + 1
        comparison = judged(exp, note, outcomes, False).comparison
        left_s = self.minutes * 60.0 - (now - self.started)
        print(progress_line(comparison, self.rounds, (now - self.started) / 60.0, self.minutes), flush=True)
        stop = why_stop(comparison, left_s, self.longest_round_s, self.resolved)
        if stop is None:
            return True
        self.stopped = stop
        print(f"[until resolved] {STOP_NOTES[stop]}", flush=True)
        return False

    def record(self) -> dict[str, Any]:
        """How the run stopped, for the compare document."""
        return {
            "minutes": self.minutes,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "rounds": self.rounds,
            "stopped": self.stopped,
        }


# Whether a comparison has answered what the run asked (bench run: every primary resolved).
Resolved = Callable[[Comparison], bool]


def primaries_resolved(comparison: Comparison) -> bool:
    primaries = [c for c in comparison.cells if c.role == "primary"]
    return bool(primaries) and all(c.verdict.verdict in RESOLVED for c in primaries)


def why_stop(
    comparison: Comparison | None, left_s: float, round_s: float, resolved: Resolved = primaries_resolved
) -> str | None:
    """Why a run under --until-resolved stops after this round ("resolved", "time", "no comparison"),
    or None to run another: answered (by default every primary resolved), or a round as long as the
    longest so far would not end in the time left."""
    if comparison is not None and resolved(comparison):
        return "resolved"
    if left_s < round_s:
        return "time"
    if comparison is None:  # fewer than two arms measured: nothing to resolve
        return "no comparison"
    return None


STOP_NOTES = {
    "resolved": "every arm's primary figure is resolved: stopping",
    "time": "the next round would not end in time: stopping; what is unresolved stays inconclusive",
    "no comparison": "fewer than two arms measured: stopping",
}


def progress_line(comparison: Comparison | None, rounds: int, used_min: float, minutes: float) -> str:
    """Where a run that stops when its answer is known stands: each arm's primary figure and codec family
    with their anytime-valid intervals, and the time used and left."""
    left = max(0.0, minutes - used_min)
    head = f"[until resolved] {rounds} round(s), {used_min:.1f} of {minutes:g} min used, {left:.1f} left"
    if comparison is None:
        return f"{head}: fewer than two arms measured"
    lines = [head + ":"]
    for arm in comparison.arms[1:]:
        cells = [c for c in comparison.cells if c.arm == arm.label and c.role in ("primary", "codec")]
        parts = [
            f"{c.figure.label} {c.verdict.change} {c.verdict.verdict}"
            for c in cells
            if c.verdict.verdict != "not judged"
        ]
        n = next((c.verdict.block_pairs for c in cells if c.role == "primary"), 0)
        text = f"{arm.label} ({n} block pairs): " + "; ".join(parts)
        lines += textwrap.wrap(text, WIDTH, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(lines)


def to_entry(outcome: RunOutcome) -> RunEntry:
    """A run as the comparison sees it: its figures read from its run document."""
    figures = blocks = doc = None
    if outcome.result is not None:
        doc = run_document(outcome.result, sysinfo={})
        figures, blocks = run_figures(doc), block_values(doc)
    entry = RunEntry(outcome.arm.label, outcome.round, outcome.status, outcome.message, outcome.path, None, figures)
    entry.blocks, entry.until_resolved = blocks, until_resolved_of(doc)
    return entry


def build_arms(outcomes: list[RunOutcome], arms: list[ArmSpec]) -> tuple[list[Arm], list[RunEntry]]:
    """The arms with their runs, and every run in the order it ran."""
    entries = [to_entry(o) for o in outcomes]
    return [Arm(a.label, [e for o, e in zip(outcomes, entries) if o.arm == a]) for a in arms], entries
