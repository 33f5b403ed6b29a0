"""``bench run``: for each codec, serve, load, report; then compare side by side with verdicts.

Every run starts a fresh ``bench serve`` process with the same model, seed,
limits and workload; only the arm (codec × transport) differs. With
``--repeat N`` the arms are interleaved and the order reverses every other
round; in blocks (the default with two or more arms) every arm's server is up
for the round and the arms take turns N requests at a time, or send them side
by side (``--duet``; ``harness.experiment.rounds``). ``--until-resolved MINUTES``
adds rounds until the answer is known (``harness.analysis.sequential``). The table
shows each figure's median over rounds; the verdicts judge every arm against
the first from the paired per-round ratios (``harness.analysis.verdicts``).

The same codec may appear twice (an A/A run): the second is labelled
``NAME#2``. A codec name may carry calibration options
(``pickle+request-delay=500us``, see ``wirecodecs.calibration``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.analysis.seed_table import format_seed_table
from harness.analysis.verdict_text import format_comparison
from harness.experiment import presets
from harness.experiment.flags import add_experiment_arguments, experiment_from_args
from harness.experiment.flow import ANALYSIS, ExperimentResult, Interrupted, phase, prepare, run_experiment
from harness.loadgen.runner import BenchmarkError

DESCRIPTION = """\
Compare codecs, transports or builds end to end. For every arm, start a fresh
bench serve with the same model, seed, limits and workload, load it and read
its figures; with --repeat N the arms run in N interleaved rounds whose order
changes from round to round. The table shows each figure's median over rounds,
and the verdicts judge every arm against the first from paired per-round
ratios: slower, faster, equivalent or inconclusive."""

EPILOG = """\
examples:
  bench run --codec pickle,msgspec --repeat 7
  bench run --codec pickle,pickle --repeat 7      (an A/A run: expect no difference)
  bench run --codec msgspec,pickle --until-resolved 10 --duet   (stop when the answer is known)
  bench run --codec msgspec-oob --transport zmq,shm --repeat 5
  bench run --arm base='--python ../base/.venv/bin/python' \\
            --arm head='--python .venv/bin/python' --repeat 7

exit codes: 0 every run succeeded; 1 a run failed; 2 bad flags or settings;
130 interrupted by Ctrl-C, 143 by SIGTERM (the servers are stopped; the rounds
that ran whole are judged, and what ran is saved)."""

EXIT_INTERRUPTED = 130  # the bench command makes it 143 when SIGTERM stopped the run


# bench's parser applies the chosen preset's defaults before parsing (harness.cli). Not named PRESETS:
# that name holds flag presets (sweep's --quick), which apply whenever the flag's text is in argv.
NAMED_PRESETS = {"--preset": presets.PRESETS}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_experiment_arguments(p)
    p.add_argument(
        "--preset",
        choices=sorted(presets.PRESETS),
        default=None,
        help=f"a named experiment's defaults (flags given still win): {presets.preset_help()}",
    )


def main(args: argparse.Namespace) -> int:
    if args.preset is not None and getattr(args, "applied_preset", None) != args.preset:
        # argparse took an abbreviation (--pres) that the preset pass before parsing did not see.
        print("bench run: error: write --preset in full (--preset NAME or --preset=NAME)", file=sys.stderr)
        return 2
    try:
        prepared = prepare(experiment_from_args(args))
    except (ValueError, BenchmarkError, OSError) as exc:
        print(f"bench run: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as stop:
        return stopped(stop.phase)
    if prepared.moved_to_chat:
        print("bench run: image workload, using /v1/chat/completions")
    try:
        result = run_experiment(prepared)
    except Interrupted as stop:
        return stopped(stop.phase)
    if result is None:
        return 1
    try:
        with phase(ANALYSIS):
            saved = report(args, result)
    except Interrupted:
        return stopped(ANALYSIS, runs_folder(result))
    if result.stopped_in is not None:
        return stopped(result.stopped_in, saved)
    return 1 if result.any_failed else 0


def report(args: argparse.Namespace, result: ExperimentResult) -> Path | None:
    """Print the comparison (of the rounds that ran whole, after a line saying so, when a round was
    cut short) and save the compare document; its path, or None when not saved."""
    shown = result
    if result.stopped_in is not None:
        shown = result.finished_rounds()
        print(f"\n{interrupted_note(result.stopped_in, shown)}", flush=True)
    if shown.outcomes:
        print(format_comparison(shown.arms, shown.comparison))
        if args.preset == presets.SEED_10245:
            departures = presets.departures_from_fit(presets.SEED_10245, vars(args))
            by_arm = presets.arm_departures(presets.SEED_10245, vars(args), result.experiment.server.arm_flags)
            print(format_seed_table(shown.arms, args.output_codec, departures, by_arm))
    if not (result.experiment.plan.save_result and result.outcomes):
        return None
    path, _ = result.save("compare")  # every run, the cut ones marked interrupted
    print(f"Comparison saved to {path}")
    return path


def interrupted_note(where: str, finished: ExperimentResult) -> str:
    """What an interrupted run's table holds: the rounds that ran whole, or nothing."""
    rounds = len({o.round for o in finished.outcomes})
    if not rounds:
        return f"interrupted during {where}: no round ran whole, so no comparison (each run's file has what it did)"
    return (
        f"interrupted during {where}: the table and verdicts below are of the {rounds} round(s) that ran whole; "
        "the runs cut short are left out"
    )


def runs_folder(result: ExperimentResult) -> Path | None:
    """Where the runs' own files went, when any was saved."""
    return Path(result.experiment.plan.result_dir) if any(o.path for o in result.outcomes) else None


def stopped(where: str, saved: Path | None = None) -> int:
    """The one line an interrupted run ends with, and its exit code (bench turns it into 143 for SIGTERM)."""
    left = f"what ran is saved in {saved}" if saved is not None else "nothing left behind"
    print(f"bench run: interrupted during {where}; {left}", file=sys.stderr)
    return EXIT_INTERRUPTED
