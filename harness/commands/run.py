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

from harness.analysis.seed_table import format_seed_table
from harness.analysis.verdict_text import format_comparison
from harness.experiment import presets
from harness.experiment.flags import add_experiment_arguments, experiment_from_args
from harness.experiment.flow import prepare, run_experiment
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
130 interrupted (the finished rounds are still judged and saved)."""


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
    if prepared.moved_to_chat:
        print("bench run: image workload, using /v1/chat/completions")
    result = run_experiment(prepared)
    if result is None:
        return 1
    print(format_comparison(result.arms, result.comparison))
    if args.preset == presets.SEED_10245:
        departures = presets.departures_from_fit(presets.SEED_10245, vars(args))
        by_arm = presets.arm_departures(presets.SEED_10245, vars(args), result.experiment.server.arm_flags)
        print(format_seed_table(result.arms, args.output_codec, departures, by_arm))
    if result.experiment.plan.save_result and result.outcomes:
        path, _ = result.save("compare")
        print(f"Comparison saved to {path}")
    if result.interrupted:
        return 130
    return 1 if result.any_failed else 0
