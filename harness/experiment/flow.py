"""The experiment flow that ``bench run``, ``bench calibrate`` and ``bench sweep`` share:

prepare (check the settings, build the workload, check the endpoint) → fix the
rate (a capacity probe for auto) → run the rounds → the arms with their runs →
judge → the compare document. Commands parse flags into an ``Experiment`` and
print; everything between is here, once.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis.compare import Arm, Comparison, compare_document
from harness.analysis.comparison_text import judge_arms
from harness.analysis.documents import label_prefix, run_document, run_figures, user_metadata, write_json
from harness.analysis.runs import RunEntry
from harness.experiment.arms import ArmSpec
from harness.experiment.probe import resolve_rate
from harness.experiment.rounds import RunOutcome, Workload, run_rounds
from harness.experiment.settings import Experiment
from harness.loadgen.runner import check_endpoint
from harness.loadgen.sysinfo import collect_sysinfo
from harness.workloads.datasets import load_workload


@dataclass
class Prepared:
    """An experiment ready to run: settings checked, its workload built before any clock starts."""

    experiment: Experiment
    workload: Workload
    tokenizer_id: str
    moved_to_chat: bool = False  # an image workload moved from /v1/completions to chat


def prepare(exp: Experiment) -> Prepared:
    """Check ``exp`` and build its workload; ValueError, BenchmarkError or OSError when it cannot run."""
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

    @property
    def any_failed(self) -> bool:
        return any(o.status in ("failures", "error") for o in self.outcomes)

    def document(self, folder: Path, **metadata: Any) -> dict[str, Any]:
        """The compare document of this experiment (paths relative to ``folder``)."""
        assert self.table is not None
        meta = {"flags": self.experiment.record(), "request_rate": self.rate_note, "machine": machine(), **metadata}
        meta.update(user_metadata(self.experiment.flags))
        return compare_document(
            self.table, folder=folder, metadata=meta, repeat=self.experiment.plan.repeat, order=self.order
        )

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
    """What the gate compares across documents (harness.analysis.comparable): the machine's kind."""
    info = collect_sysinfo(probe_torch=False)
    return {key: info.get(key) for key in ("machine", "cpu_model", "cpu_usable")}


def run_experiment(prepared: Prepared) -> ExperimentResult | None:
    """Fix the rate, run every round, judge. None when the rate could not be fixed (said on stderr)."""
    resolved = resolve_rate(prepared.experiment, prepared.workload, prepared.tokenizer_id)
    if resolved is None:
        return None
    exp, note = resolved
    outcomes, interrupted = run_rounds(exp, prepared.workload, prepared.tokenizer_id)
    return judged(exp, note, outcomes, interrupted)


def judged(exp: Experiment, note: dict[str, Any], outcomes: list[RunOutcome], interrupted: bool) -> ExperimentResult:
    """The result of these outcomes: arms with their runs, verdicts at the plan's margin."""
    arm_list, order = build_arms(outcomes, list(exp.arms))
    comparison, table = judge_arms(arm_list, exp.plan.margin_pct)
    return ExperimentResult(exp, note, outcomes, interrupted, arm_list, order, comparison, table)


def to_entry(outcome: RunOutcome) -> RunEntry:
    """A run as the comparison sees it: its figures read from its run document."""
    figures = None
    if outcome.result is not None:
        figures = run_figures(run_document(outcome.result, sysinfo={}))
    return RunEntry(outcome.arm.label, outcome.round, outcome.status, outcome.message, outcome.path, None, figures)


def build_arms(outcomes: list[RunOutcome], arms: list[ArmSpec]) -> tuple[list[Arm], list[RunEntry]]:
    """The arms with their runs, and every run in the order it ran."""
    entries = [to_entry(o) for o in outcomes]
    return [Arm(a.label, [e for o, e in zip(outcomes, entries) if o.arm == a]) for a in arms], entries
