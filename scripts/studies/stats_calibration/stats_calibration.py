#!/usr/bin/env python
"""Measure the false-positive rate and power of harness/analysis/stats.py's verdicts by simulation.

    .venv/bin/python scripts/studies/stats_calibration/stats_calibration.py [--simulations 1000] [--seed 1]

About a minute with the defaults; docs/method.md quotes a --simulations 10000 run.

Each simulated table is one codec pair over the 11 figures of a ``bench run``
table, arms interleaved A B in every round (A B B A in the rows that say so). Per arm
and round a figure's log value gets Gaussian noise of SD sigma ("noise"),
split into a machine-wide part (--rho-machine of the variance, shared by all
figures of that run), a part shared with the figure's group (--rho-group: TTFT
mean/p50/p99 move together, and so on) and its own remainder; "drift" is a
slow linear trend shared by both arms and all figures (latencies up,
throughputs down). The verdicts come from the module's own compare_arms +
judge, so the figures printed are the procedure's, not a formula's.

Verdicts as ``bench run`` makes them: TTFT mean is the primary figure, the other
ten are judged once it is resolved (``judge_gatekept``). Prints markdown tables:
A/A false positives, power for a true change of 3 sigma on the primary figure,
the share called "equivalent", and whether a new run of the rounds an
inconclusive verdict promises finds a change of the margin's size 4 times in 5.
The gate's own rates with the noise measured here: ``scripts/studies/gate_rates/gate_power.py``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from harness.analysis.stats import (
    ALPHA,
    DEFAULT_MARGIN_PCT,
    DEFAULT_ROUNDS,
    PairStats,
    Verdict,
    compare_arms,
    judge_gatekept,
)

# (group, higher_is_better) of the 11 figures of one codec pair.
FIGURES = [
    ("ttft", False),
    ("ttft", False),
    ("ttft", False),  # TTFT mean, p50, p99
    ("tpot", False),
    ("tpot", False),  # TPOT mean, p99
    ("itl", False),
    ("itl", False),  # ITL p50, p99
    ("e2el", False),  # E2EL mean
    ("codec", False),
    ("codec", False),  # codec µs request, output
    ("throughput", True),  # output tok/s
]
GROUPS = sorted({g for g, _ in FIGURES})
GROUP_INDEX = np.array([GROUPS.index(g) for g, _ in FIGURES])
HIGHER = [h for _, h in FIGURES]
# A machine slowdown raises latencies and lowers throughput.
DRIFT_SIGN = np.array([-1.0 if h else 1.0 for h in HIGHER])
EFFECT_FIGURE = 0  # TTFT mean carries the true change in the power runs
NULL_FIGURE = 7  # E2EL mean: a figure with no true change


class Simulator:
    """Draws whole tables (A and B arms, 11 figures x n rounds) under one noise model."""

    def __init__(self, rng: np.random.Generator, rho_machine: float, rho_group: float) -> None:
        if rho_machine + rho_group > 1:
            raise ValueError("rho-machine + rho-group must be <= 1")
        self.rng = rng
        self.w_machine, self.w_group = math.sqrt(rho_machine), math.sqrt(rho_group)
        self.w_own = math.sqrt(1 - rho_machine - rho_group)

    def _noise(self, sims: int, n: int) -> np.ndarray:
        """Log noise of unit SD, shape (sims, figures, n), correlated across figures of one run."""
        f = len(FIGURES)
        machine = self.rng.standard_normal((sims, 1, n))
        group = self.rng.standard_normal((sims, len(GROUPS), n))[:, GROUP_INDEX, :]
        own = self.rng.standard_normal((sims, f, n))
        return self.w_machine * machine + self.w_group * group + self.w_own * own

    @staticmethod
    def slots(n: int, order: str) -> tuple[np.ndarray, np.ndarray]:
        """Time of each arm's run in each round, in rounds (each run takes half a round)."""
        r = np.arange(n, dtype=float)
        first, second = r, r + 0.5
        if order == "ab":
            return first, second
        swap = (np.arange(n) % 2) == 1  # A B | B A | A B ...
        return np.where(swap, second, first), np.where(swap, first, second)

    def draw(
        self, sims: int, n: int, noise_pct: float, drift_pct: float, effect_log: np.ndarray, order: str = "ab"
    ) -> tuple[np.ndarray, np.ndarray]:
        sigma = math.log1p(noise_pct / 100)
        drift = math.log1p(drift_pct / 100) * DRIFT_SIGN[None, :, None]
        t_a, t_b = self.slots(n, order)
        base = np.log(np.linspace(5.0, 50.0, len(FIGURES)))[None, :, None]  # arbitrary positive levels
        log_a = base + drift * t_a + sigma * self._noise(sims, n)
        log_b = base + drift * t_b + sigma * self._noise(sims, n) + effect_log[None, :, None]
        return np.exp(log_a), np.exp(log_b)


def judge_tables(
    a: np.ndarray, b: np.ndarray, margin_pct: float = DEFAULT_MARGIN_PCT
) -> tuple[list[list[PairStats]], list[list[Verdict]]]:
    """Paired comparisons and verdicts of each simulated table (a, b: tables x figures x rounds), as
    bench run judges them: TTFT mean (figure 0) primary, the other ten once it is resolved."""
    stats = [
        [compare_arms(fa, fb, paired=True) for fa, fb in zip(ta.tolist(), tb.tolist(), strict=True)]
        for ta, tb in zip(a, b, strict=True)
    ]
    return stats, [verdicts_of(ss, margin_pct) for ss in stats]


def verdicts_of(ss: list[PairStats], margin_pct: float = DEFAULT_MARGIN_PCT) -> list[Verdict]:
    """One table's verdicts: figure 0 primary, the rest secondary (judge_gatekept, as compare does)."""
    (first,), (rest,) = judge_gatekept(
        [ss[0]],
        [ss[1:]],
        primary_higher_is_better=HIGHER[0],
        secondary_higher_is_better=HIGHER[1:],
        margin_pct=margin_pct,
    )
    return [first, *rest]


def is_difference(v: Verdict) -> bool:
    return v.verdict in ("slower", "faster")


# --- the tables ---------------------------------------------------------------------------------------


def false_positives(sim: Simulator, sims: int) -> list[str]:
    zero = np.zeros(len(FIGURES))
    header = (
        "| n | noise | drift | order | family FP, Holm | per-figure FP, Holm | family FP, unadjusted | "
        f'"equivalent" (±{DEFAULT_MARGIN_PCT:g}%) |'
    )
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for n in (3, 5, 8, 10):
        for noise in (2.0, 5.0):
            for drift, order in ((0.0, "ab"), (1.0, "ab"), (1.0, "abba")):
                stats, verdicts = judge_tables(*sim.draw(sims, n, noise, drift, zero, order))
                family = np.mean([any(map(is_difference, vs)) for vs in verdicts])
                per_figure = np.mean([is_difference(v) for vs in verdicts for v in vs])
                raw = np.mean([any(s.p_value < ALPHA for s in ss) for ss in stats])
                equivalent = np.mean([v.verdict == "equivalent" for vs in verdicts for v in vs])
                label = "none" if drift == 0 else f"{drift:g}%/round"
                lines.append(
                    f"| {n} | {noise:g}% | {label} | {order.upper() if drift else '-'} | {family:.1%} | "
                    f"{per_figure:.2%} | {raw:.1%} | {equivalent:.1%} |"
                )
    return lines


def power(sim: Simulator, sims: int, effect_sd: float, rounds: range) -> tuple[list[str], dict[float, list[float]]]:
    lines = [
        f"| n | noise | power ({effect_sd:g} sigma) | wrong direction | FP on the 10 null figures |",
        "|---|---|---|---|---|",
    ]
    measured: dict[float, list[float]] = {}
    for noise in (2.0, 5.0):
        effect = np.zeros(len(FIGURES))
        effect[EFFECT_FIGURE] = effect_sd * math.log1p(noise / 100)
        for n in rounds:
            _, verdicts = judge_tables(*sim.draw(sims, n, noise, 0.0, effect))
            hit = np.mean([vs[EFFECT_FIGURE].verdict == "slower" for vs in verdicts])
            wrong = np.mean([vs[EFFECT_FIGURE].verdict == "faster" for vs in verdicts])
            fp = np.mean([any(is_difference(v) for i, v in enumerate(vs) if i != EFFECT_FIGURE) for vs in verdicts])
            measured.setdefault(noise, []).append(float(hit))
            lines.append(f"| {n} | {noise:g}% | {hit:.1%} | {wrong:.2%} | {fp:.1%} |")
    return lines, measured


def equivalence(sim: Simulator, sims: int, n: int) -> list[str]:
    noises = (1.0, 2.0, 3.0, 5.0)
    lines = [f"| margin | {' | '.join(f'noise {x:g}%' for x in noises)} |", "|---|" + "---|" * len(noises)]
    smallest = None
    # One set of A/A tables per noise, judged at every margin (the margin only moves the verdict).
    null_stats = {noise: judge_tables(*sim.draw(sims, n, noise, 0.0, np.zeros(len(FIGURES))))[0] for noise in noises}
    for margin in (2.0, 3.0, 4.0, 5.0):
        cells = []
        for noise in noises:
            null = [verdicts_of(ss, margin) for ss in null_stats[noise]]
            at_margin = np.full(len(FIGURES), math.log1p(margin / 100))
            _, edge = judge_tables(*sim.draw(sims, n, noise, 0.0, at_margin), margin)
            share = np.mean([v.verdict == "equivalent" for vs in null for v in vs])
            false = np.mean([v.verdict == "equivalent" for vs in edge for v in vs])
            cells.append(f"{share:.0%} ({false:.1%})")
            if noise == 2.0 and share >= 0.8 and smallest is None:
                smallest = margin
        lines.append(f"| ±{margin:g}% | {' | '.join(cells)} |")
    lines.append(
        f'\nsmallest margin called "equivalent" in >= 80% of A/A at noise 2%: '
        f"{f'±{smallest:g}%' if smallest else 'none up to ±5%'} (DEFAULT_MARGIN_PCT = {DEFAULT_MARGIN_PCT:g})"
    )
    return lines


def new_run_power(sim: Simulator, sims: int, n0: int, noise: float) -> list[str]:
    """Inconclusive at n0 -> the verdict's "a new run of about k rounds would detect the margin": does a
    new run of k rounds, with a true change of the margin's size, find it 4 times in 5 as promised?"""
    effect = np.zeros(len(FIGURES))
    effect[EFFECT_FIGURE] = math.log1p(DEFAULT_MARGIN_PCT / 100)
    _, verdicts = judge_tables(*sim.draw(sims, n0, noise, 0.0, np.zeros(len(FIGURES))))
    promised = [vs[EFFECT_FIGURE].rounds_needed for vs in verdicts if vs[EFFECT_FIGURE].verdict == "inconclusive"]
    ks = [k for k in promised if k is not None][:200]  # bound the run time
    found = [judge_tables(*sim.draw(1, k, noise, 0.0, effect))[1][0][EFFECT_FIGURE].verdict == "slower" for k in ks]
    rate = f"{np.mean(found):.0%}" if found else "-"
    median_k = f"{np.median(ks):.0f}" if ks else "-"
    return [
        "| first run | inconclusive | median rounds promised | new runs that found the margin |",
        "|---|---|---|---|",
        f"| n = {n0}, noise {noise:g}%, no change | {len(ks)} checked | {median_k} | {rate} |",
    ]


# --- main ---------------------------------------------------------------------------------------------


def timed(title: str, make: Callable[[], list[str]]) -> None:
    start = time.perf_counter()
    lines = make()
    print(f"\n### {title}\n")
    print("\n".join(lines))
    print(f"\n({time.perf_counter() - start:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--simulations", type=int, default=1000, help="simulated tables per cell (default 1000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--rho-machine",
        type=float,
        default=0.3,
        help="share of a figure's noise variance common to all figures of a run (default 0.3)",
    )
    p.add_argument(
        "--rho-group",
        type=float,
        default=0.5,
        help="share common to the figure's group, e.g. TTFT mean/p50/p99 (default 0.5)",
    )
    p.add_argument("--effect-sd", type=float, default=3.0, help="true change for the power table, in sigma")
    args = p.parse_args(argv)
    sims = args.simulations
    sim = Simulator(np.random.default_rng(args.seed), args.rho_machine, args.rho_group)
    print(
        f"{sims} simulated 11-figure tables per cell, seed {args.seed}, alpha {ALPHA}, Holm over the table, "
        f"noise split machine {args.rho_machine:g} / group {args.rho_group:g} / own "
        f"{1 - args.rho_machine - args.rho_group:g}"
    )
    timed('A/A: any "slower"/"faster" in a table with no true change', lambda: false_positives(sim, sims))
    measured: dict[float, list[float]] = {}
    rounds = range(3, 11)

    def power_table() -> list[str]:
        lines, got = power(sim, sims, args.effect_sd, rounds)
        measured.update(got)
        return lines

    timed(f"Power: one figure changed by {args.effect_sd:g} sigma, 10 unchanged", power_table)
    enough = [n for i, n in enumerate(rounds) if all(m[i] >= 0.8 for m in measured.values())]
    print(
        f"\nsmallest n with power >= 80% at every noise: {enough[0] if enough else 'none up to 10'} "
        f"(DEFAULT_ROUNDS = {DEFAULT_ROUNDS})"
    )
    timed(
        f'Share called "equivalent" at n = {DEFAULT_ROUNDS}: no true change (true change = margin)',
        lambda: equivalence(sim, sims, DEFAULT_ROUNDS),
    )
    timed(
        f"A new run of the rounds an inconclusive verdict promises, with a true change of ±{DEFAULT_MARGIN_PCT:g}%",
        lambda: new_run_power(sim, sims, 5, 5.0),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
