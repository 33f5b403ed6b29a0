#!/usr/bin/env python
"""The false-alarm rate, power and time to a verdict of ``--until-resolved`` (harness/analysis/sequential.py)
when the blocks of a round are not independent: by simulation, by replaying recorded rounds, on real A/A runs.

    .venv/bin/python scripts/studies/sequential_calibration/sequential_calibration.py [--runs 10000] \\
        [--replay COMPARE.json ...] [--real COMPARE.json] [--rejudge COMPARE.json ...] [--out FILE.json]

A run in blocks holds m block pairs a round and looks once a round, after it, until R rounds. Two
procedures are measured on the same data:

- "blocks" (the old unit): every block pair's log ratio is a unit of the anytime-valid t test;
- "rounds" (the unit now): one unit a round, the mean of its block pairs' log ratios.

The test's evidence is the running maximum over every prefix (``evaluate``), so a run that looks after
round r has called a difference when some prefix of the units up to round r crossed. A null run is a
false alarm when that happens by round R; a run with a true change is found when it crosses with the
change's sign (its median round to do so is the time to a verdict). A run here never stops early for
"equivalent", so the false alarms are those of the longest run the time allows.

Noise model: block difference = round offset (variance rho) + within (variance 1 - rho), so rho is the
intra-round correlation and the change is in SDs of one block difference. The vectorised crossings are
checked against the module's own ``evaluate`` and ``judge_sequential`` on 50 runs of several cells.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import zlib
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import beta, skew

from harness.analysis.blocks import intra_round_correlation, paired_log_diffs, round_means
from harness.analysis.sequential import critical_t, evaluate, judge_sequential
from harness.analysis.stats import ALPHA
from harness.analysis.student_t import t_ppf
from harness.analysis.verdicts import load_any_compare

PROCEDURES = ("blocks", "rounds")
RHOS = (0.0, 0.02, 0.057, 0.1, 0.2)
EFFECTS_SD = (0.1, 0.2, 0.3, 0.5)
CHECKED_RUNS = 50
FIGURE = "mean_ttft_ms"  # the primary figure of a recording
TARGET_PCT, TARGET_MIN = 1.0, 10.0  # the target: a 1% change found within ten minutes
# Run-wide: the primary figure and the codec family's two figures, correlated as codec time and codec + wire.
FIGURE_CORRELATION = np.array([[1.0, 0.3, 0.3], [0.3, 1.0, 0.6], [0.3, 0.6, 1.0]])

Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]  # standardized noise: mean 0, SD 1


def normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape)


def t3(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_t(3, shape) / math.sqrt(3.0)  # heavy tails, as TTFT blocks have


def lognormal(sigma: float) -> Draw:
    """A centred lognormal scaled to SD 1: mean zero, long right tail."""
    mean, sd = math.exp(sigma**2 / 2), math.sqrt(math.expm1(sigma**2) * math.exp(sigma**2))

    def draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return (np.exp(sigma * rng.standard_normal(shape)) - mean) / sd

    return draw


def clustered(
    rng: np.random.Generator, runs: int, rounds: int, m: int, rho: float, within: Draw = normal, offset: Draw = normal
) -> np.ndarray:
    """(runs, rounds, m) block differences with no change: a round offset shared by its m blocks plus noise."""
    shared = math.sqrt(rho) * offset(rng, (runs, rounds, 1)) if rho > 0 else 0.0
    return shared + math.sqrt(1.0 - rho) * within(rng, (runs, rounds, m))


# ---- the test, vectorised ---------------------------------------------------------------------------------


def critical_ts(n: int, alpha: float) -> np.ndarray:
    """critical_t of every prefix length 1..n (inf where the evidence cannot reach 1/alpha)."""
    return np.array([critical_t(k, alpha) for k in range(1, n + 1)])


def first_crossing(units: np.ndarray, crit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per run (row): the length of the first prefix whose |t| reaches its critical t (0: none), and
    the sign of that prefix's mean: the evidence of ``evaluate`` reaching 1/alpha, the same sums."""
    n = np.arange(1, units.shape[1] + 1)
    mean = np.cumsum(units, axis=1) / n
    var = np.maximum(np.cumsum(units * units, axis=1) - n * mean * mean, 0.0) / np.maximum(n - 1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(mean) / np.sqrt(var / n)
    crit = crit[: units.shape[1]]
    hit = (t >= crit) & np.isfinite(crit)  # a prefix too short to reach 1/alpha never hits, even at |t| = inf
    crossed = hit.any(axis=1)
    first = np.where(crossed, hit.argmax(axis=1) + 1, 0)
    sign = np.sign(mean[np.arange(len(units)), np.maximum(first - 1, 0)]) * crossed
    return first, sign


def crossing_round(blocks: np.ndarray, procedure: str, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """(runs, rounds, m) block differences -> per run the round whose look first calls a difference
    (0: none) and its sign."""
    runs, rounds, m = blocks.shape
    if procedure == "rounds":
        return first_crossing(blocks.mean(axis=2), critical_ts(rounds, alpha))
    first, sign = first_crossing(blocks.reshape(runs, rounds * m), critical_ts(rounds * m, alpha))
    return -(-first // m), sign  # the look after the round that holds the crossing pair


def units_of(run: np.ndarray, procedure: str) -> list[float]:
    """One run's (rounds, m) block differences as the module's data: every pair, or one mean a round."""
    return [float(x) for x in run.ravel()] if procedure == "blocks" else round_means(run.tolist())


def check_against_module(blocks: np.ndarray, rounds: int, rng: np.random.Generator, what: str) -> None:
    """The vectorised decision equals ``evaluate``'s anytime p < alpha, and its sign the verdict of
    ``judge_sequential``, on CHECKED_RUNS runs picked at random."""
    pick = rng.choice(len(blocks), size=min(CHECKED_RUNS, len(blocks)), replace=False)
    data = blocks[pick, :rounds]
    for procedure in PROCEDURES:
        at, sign = crossing_round(data, procedure)
        for run, r, s in zip(data, at, sign, strict=True):
            units = units_of(run, procedure)
            assert (evaluate(units).p_anytime < ALPHA) == (r > 0), (what, procedure)
            verdict = judge_sequential([units])[0].verdict
            expected = {1.0: "slower", -1.0: "faster"}.get(float(s))
            assert verdict == expected or (expected is None and verdict in ("inconclusive", "equivalent")), what


# ---- rates ------------------------------------------------------------------------------------------------


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    tail = (1.0 - level) / 2
    low = float(beta.ppf(tail, k, n - k + 1)) if k > 0 else 0.0
    high = float(beta.ppf(1 - tail, k + 1, n - k)) if k < n else 1.0
    return low, high


def rate(k: int, n: int) -> dict[str, Any]:
    low, high = clopper_pearson(k, n)
    return {"runs": n, "count": k, "rate": round(k / n, 5), "ci": [round(low, 5), round(high, 5)]}


def cell_rows(blocks: np.ndarray, horizons: Sequence[int], effect: float, **labels: Any) -> list[dict[str, Any]]:
    """One row per procedure and horizon: the share called different (found: with the change's sign),
    and for a true change the median round at which the found ones were found."""
    rows = []
    for procedure in PROCEDURES:
        for rounds in horizons:
            at, sign = crossing_round(blocks[:, :rounds], procedure)
            found = (at > 0) & (sign > 0) if effect > 0 else at > 0
            row = {**labels, "effect_sd": effect, "procedure": procedure, "rounds": rounds}
            row |= rate(int(found.sum()), len(blocks))
            if effect > 0:
                row["median_rounds"] = float(np.median(at[found])) if found.any() else None
            rows.append(row)
    return rows


def cell_rng(seed: int, name: str) -> np.random.Generator:
    """Each cell its own stream: a cell's numbers do not depend on which other cells ran."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# ---- the studies ------------------------------------------------------------------------------------------


def clustered_nulls(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for noise, within in (("normal", normal), ("t3", t3)):
        for rho in RHOS:
            rng = cell_rng(args.seed, f"null-{noise}-{rho}")
            blocks = clustered(rng, args.runs, max(args.rounds), args.m, rho, within)
            if rho in (0.057, 0.2):
                check_against_module(blocks, max(args.rounds), rng, f"null {noise} rho {rho}")
            rows += cell_rows(blocks, args.rounds, 0.0, study="clustered", noise=noise, rho=rho)
    return rows


def skewed_nulls(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Centred lognormal differences: skewed block noise (with and without a normal round offset), and
    a skewed round offset (rho = 1: the whole difference a round's, blocks identical)."""
    cases = [("block", s, rho) for s in (0.5, 1.0) for rho in (0.0, 0.057)]
    cases += [("round", s, rho) for s in (0.5, 1.0) for rho in (0.057, 0.2, 1.0)]
    rows = []
    for level, sigma, rho in cases:
        rng = cell_rng(args.seed, f"skew-{level}-{sigma}-{rho}")
        skew = lognormal(sigma)
        if level == "block":
            blocks = clustered(rng, args.runs, max(args.rounds), args.m, rho, within=skew)
        else:
            blocks = clustered(rng, args.runs, max(args.rounds), args.m, rho, offset=skew)
        if (level, sigma, rho) in (("block", 1.0, 0.0), ("round", 1.0, 1.0)):
            check_against_module(blocks, max(args.rounds), rng, f"skew {level} {sigma} {rho}")
        rows += cell_rows(blocks, args.rounds, 0.0, study="skewed", skew_at=level, sigma=sigma, rho=rho)
    return rows


def power(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for rho in (0.0, 0.057):
        for effect in EFFECTS_SD:
            rng = cell_rng(args.seed, f"power-{rho}-{effect}")
            blocks = clustered(rng, args.runs, max(args.rounds), args.m, rho) + effect
            if effect == 0.1:
                check_against_module(blocks, max(args.rounds), rng, f"power rho {rho}")
            rows += cell_rows(blocks, args.rounds, effect, study="power", noise="normal", rho=rho)
    return rows


def fixed_t_every_look(args: argparse.Namespace) -> list[dict[str, Any]]:
    """For contrast, the fixed-sample t test (valid at one length fixed up front) read at every look
    of an A/A run, as a run that simply tops up rounds would: the share ever called different."""
    rng = cell_rng(args.seed, "fixed-t")
    blocks = clustered(rng, args.runs, max(args.rounds), args.m, 0.0)
    rows = []
    for procedure in PROCEDURES:
        per_look = args.m if procedure == "blocks" else 1
        units = blocks.reshape(args.runs, -1) if procedure == "blocks" else blocks.mean(axis=2)
        n = np.arange(1, units.shape[1] + 1)
        mean = np.cumsum(units, axis=1) / n
        var = np.maximum(np.cumsum(units * units, axis=1) - n * mean * mean, 0.0) / np.maximum(n - 1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.abs(mean) / np.sqrt(var / n)
        crit = np.array([t_ppf(1 - ALPHA / 2, k - 1) if k > 1 else math.inf for k in n])
        looks = np.arange(per_look, units.shape[1] + 1, per_look) - 1  # the index of each look's last unit
        called = np.logical_or.accumulate((t[:, looks] >= crit[looks]) & np.isfinite(crit[looks]), axis=1)
        for rounds in args.rounds:
            row = {"study": "fixed-t", "noise": "normal", "rho": 0.0, "procedure": procedure, "rounds": rounds}
            rows.append(row | rate(int(called[:, rounds - 1].sum()), args.runs))
    return rows


def run_wide(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The chance of any false "slower"/"faster" in a run: the primary family (one arm) at alpha, and
    the codec family (two figures, Holm) at alpha. Holm's first step is at alpha/2, and the anytime
    p-values only fall, so the codec family has ever called one when either figure crossed at alpha/2."""
    mix = np.linalg.cholesky(FIGURE_CORRELATION).T
    rows = []
    for rho in (0.0, 0.057, 0.2):
        rng = cell_rng(args.seed, f"run-wide-{rho}")
        shape = (args.runs, max(args.rounds), args.m, len(mix))
        offset = rng.standard_normal((*shape[:2], 1, len(mix))) @ mix
        blocks = math.sqrt(rho) * offset + math.sqrt(1.0 - rho) * (rng.standard_normal(shape) @ mix)
        figures = [blocks[..., i] for i in range(len(mix))]
        check_run_wide(figures, max(args.rounds), rng)
        for procedure in PROCEDURES:
            for rounds in args.rounds:
                primary = crossing_round(figures[0][:, :rounds], procedure)[0] > 0
                codec = [crossing_round(f[:, :rounds], procedure, ALPHA / 2)[0] > 0 for f in figures[1:]]
                any_false = primary | np.logical_or.reduce(codec)
                row = {"study": "run-wide", "rho": rho, "procedure": procedure, "rounds": rounds}
                row["primary"] = round(float(primary.mean()), 5)
                row["codec_family"] = round(float(np.logical_or.reduce(codec).mean()), 5)
                rows.append(row | rate(int(any_false.sum()), args.runs))
    return rows


def check_run_wide(figures: list[np.ndarray], rounds: int, rng: np.random.Generator) -> None:
    """The vectorised family rule equals judge_sequential's verdicts on CHECKED_RUNS runs."""
    pick = rng.choice(len(figures[0]), size=CHECKED_RUNS, replace=False)
    for procedure in PROCEDURES:
        codec = [crossing_round(f[pick, :rounds], procedure, ALPHA / 2)[0] > 0 for f in figures[1:]]
        expected = np.logical_or.reduce(codec)
        for i, run in enumerate(pick):
            family = [units_of(f[run, :rounds], procedure) for f in figures[1:]]
            said = any(v.verdict in ("slower", "faster") for v in judge_sequential(family))
            assert said == expected[i], procedure


# ---- recorded rounds --------------------------------------------------------------------------------------


def recorded_rounds(path: str) -> list[tuple[str, list[list[float]]]]:
    """(arm, rounds of block log ratios of mean TTFT against the first arm) per arm of a compare file."""
    arms = load_any_compare(path)
    ref = arms[0].judged().blocks()
    out = []
    for arm in arms[1:]:
        rounds = paired_log_diffs(ref, arm.judged().blocks(), FIGURE)
        if len(rounds) >= 2:
            out.append((arm.label, rounds))
    return out


def describe(rounds: list[list[float]]) -> dict[str, Any]:
    """A recording's rounds: their count and size, the intra-round correlation, the SD of one pair's
    log ratio, the change, and the skewness of the round means (the round unit's own shape)."""
    flat = [x for r in rounds for x in r]
    return {
        "recorded_rounds": len(rounds),
        "blocks_per_round": sorted({len(r) for r in rounds}),
        "icc": round(intra_round_correlation(rounds), 4),
        "sd_pct": round(100 * float(np.std(flat, ddof=1)), 2),
        "change_pct": round(100 * math.expm1(float(np.mean(flat))), 2),
        "round_mean_skew": round(float(skew(round_means(rounds))), 2) if len(rounds) >= 3 else None,
    }


def replay(path: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """A/A runs made by resampling a recording's whole rounds with replacement (each keeps its blocks
    together), centred on the overall mean, each round with a random sign (under no change a round and
    its mirror are equally likely)."""
    rows = []
    for label, rounds in recorded_rounds(path):
        size = max({len(r) for r in rounds}, key=[len(r) for r in rounds].count)
        kept = np.array([r for r in rounds if len(r) == size])  # rounds with a failed block left out
        kept -= np.concatenate(rounds).mean()
        rng = cell_rng(args.seed, f"replay-{Path(path).name}-{label}")
        draw = kept[rng.integers(0, len(kept), size=(args.runs, max(args.rounds)))]
        draw *= rng.choice([-1.0, 1.0], size=(args.runs, max(args.rounds), 1))
        labels = {"study": "replay", "source": Path(path).name, "arm": label, **describe(rounds)}
        rows += cell_rows(draw, args.rounds, 0.0, **labels, rounds_used=len(kept))
    return rows


def real_segments(path: str, segments: Sequence[int]) -> list[dict[str, Any]]:
    """A long A/A recording cut into consecutive runs of R rounds, each judged as it would have been,
    looking after every round: the module's own evaluate on every prefix."""
    rows = []
    for label, rounds in recorded_rounds(path):
        for length in segments:
            runs = [rounds[i : i + length] for i in range(0, len(rounds) - length + 1, length)]
            if not runs:  # the recording is shorter than one such run
                continue
            for procedure in PROCEDURES:
                units = [[x for r in run for x in r] if procedure == "blocks" else round_means(run) for run in runs]
                alarms = sum(evaluate(u).p_anytime < ALPHA for u in units)
                row = {"study": "real", "source": Path(path).name, "arm": label, **describe(rounds)}
                rows.append(row | {"procedure": procedure, "rounds": length} | rate(alarms, len(runs)))
    return rows


def round_minutes(path: str) -> list[float]:
    """Minutes from the start to the end of each round: its run files are stamped when it ended, and the
    last one ended at until_resolved's elapsed seconds."""
    doc = json.loads(Path(path).read_text())
    ended: dict[int, datetime] = {}
    for run in doc["runs"]:
        stamp = re.search(r"(\d{8}-\d{6})\.json$", run.get("result_file") or "")
        if stamp and run.get("round") is not None:
            ended[run["round"]] = datetime.strptime(stamp.group(1), "%Y%m%d-%H%M%S")
    last = max(ended.values())
    elapsed = doc["metadata"]["until_resolved"]["elapsed_s"]
    return [round((elapsed - (last - ended[r]).total_seconds()) / 60, 2) for r in sorted(ended)]


def time_to_find(rounds: list[list[float]], minutes_per_round: float, args: argparse.Namespace) -> dict[str, Any]:
    """A TARGET_PCT change at this recording's noise (normal model with its SD per pair, its intra-round
    correlation and its blocks a round) at its pace: per unit, the share of simulated runs that find it
    within TARGET_MIN minutes and the median minutes of those that do."""
    flat = np.concatenate(rounds)
    rho, m = max(0.0, intra_round_correlation(rounds)), max(len(r) for r in rounds)
    horizon = max(3, int(TARGET_MIN // minutes_per_round))
    rng = cell_rng(args.seed, f"target-{len(flat)}-{flat.sum()}")
    blocks = float(flat.std(ddof=1)) * clustered(rng, args.runs, horizon, m, rho) + math.log1p(TARGET_PCT / 100)
    out: dict[str, Any] = {"target_pct": TARGET_PCT, "rounds_in_target_min": horizon}
    for procedure in PROCEDURES:
        at, sign = crossing_round(blocks, procedure)
        found = (at > 0) & (sign > 0)
        median = float(np.median(at[found])) * minutes_per_round if found.any() else None
        out[procedure] = {**rate(int(found.sum()), args.runs), "median_min": median and round(median, 2)}
    return out


def rejudge(path: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """A recording judged after each round by both units, at its own margin: the first round each
    resolves the primary figure, what it says then (or after the last round), and how long a 1% change
    at its noise and pace takes to find, simulated."""
    doc = json.loads(Path(path).read_text())
    margin = doc["comparison"]["margin_pct"]
    minutes = round_minutes(path)
    rows = []
    for label, rounds in recorded_rounds(path):
        target = time_to_find(rounds, minutes[-1] / len(minutes), args)
        for procedure in PROCEDURES:
            said = []
            for r in range(1, len(rounds) + 1):
                units = [x for rd in rounds[:r] for x in rd] if procedure == "blocks" else round_means(rounds[:r])
                v = judge_sequential([units], margin_pct=margin)[0]
                said.append((v.verdict, v.stats.change_pct, v.stats.ci_low, v.stats.ci_high))
            first = next((r for r, s in enumerate(said, 1) if s[0] != "inconclusive"), None)
            verdict, change, low, high = said[(first or len(said)) - 1]
            rows.append(
                {
                    "study": "rejudge",
                    "source": Path(path).name,
                    "arm": label,
                    "margin_pct": margin,
                    **describe(rounds),
                    "procedure": procedure,
                    "resolved_at_round": first,
                    "minutes": minutes[first - 1] if first else None,
                    "minutes_recorded": minutes[-1],
                    "verdict": verdict,
                    "change_pct": round(change, 2),
                    "ci_pct": [round(100 * (low - 1), 2), round(100 * (high - 1), 2)],
                    "target": {k: target[k] for k in ("target_pct", "rounds_in_target_min", procedure)},
                }
            )
    return rows


# ---- printing ---------------------------------------------------------------------------------------------


def pct(row: dict[str, Any]) -> str:
    low, high = row["ci"]
    return f"{100 * row['rate']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def table(rows: list[dict[str, Any]], keys: list[str], value: Callable[[dict[str, Any]], str]) -> str:
    """One line per distinct ``keys``, one column per procedure and horizon."""
    columns = list(dict.fromkeys((r["procedure"], r["rounds"]) for r in rows))
    cells: dict[tuple[Any, ...], dict[tuple[str, int], str]] = {}
    for r in rows:
        cells.setdefault(tuple(str(r.get(k)) for k in keys), {})[(r["procedure"], r["rounds"])] = value(r)
    head = keys + [f"{p}, {n} rounds" for p, n in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, by_column in cells.items():
        lines.append("| " + " | ".join([*key, *(by_column.get(c, "-") for c in columns)]) + " |")
    return "\n".join(lines)


def found_and_time(row: dict[str, Any]) -> str:
    return f"{pct(row)}, median {row['median_rounds']:g}" if row.get("median_rounds") else pct(row)


def report(doc: dict[str, Any]) -> None:
    print(f"{doc['settings']['runs']} runs a cell, {doc['settings']['m']} block pairs a round, a look each round")
    print("\nclustered nulls (false alarms)\n" + table(doc["clustered"], ["noise", "rho"], pct))
    print("\nskewed nulls (false alarms)\n" + table(doc["skewed"], ["skew_at", "sigma", "rho"], pct))
    print("\npower and median rounds to the verdict\n" + table(doc["power"], ["rho", "effect_sd"], found_and_time))
    print("\nfor contrast, the fixed-sample t test at every look\n" + table(doc["fixed_t_every_look"], ["rho"], pct))
    print("\nrun-wide: any false verdict, primary + codec family\n" + table(doc["run_wide"], ["rho"], pct))
    if doc["replayed"]:
        keys = ["source", "icc", "sd_pct", "round_mean_skew", "rounds_used", "blocks_per_round"]
        print("\nreplayed whole rounds (false alarms)\n" + table(doc["replayed"], keys, pct))
    if doc["real"]:
        print("\nreal A/A segments (false alarms)\n" + table(doc["real"], ["source", "icc", "recorded_rounds"], pct))
    for r in doc["rejudged"]:
        when = f"round {r['resolved_at_round']} ({r['minutes']} min)" if r["resolved_at_round"] else "never"
        target = r["target"][r["procedure"]]
        print(
            f"rejudged {r['source']} [{r['procedure']}]: {r['verdict']} {r['change_pct']:+.2f}% {r['ci_pct']} "
            f"at {when} of {r['recorded_rounds']} rounds ({r['minutes_recorded']} min); icc {r['icc']}; "
            f"a {TARGET_PCT:g}% change at its noise found within {TARGET_MIN:g} min: {pct(target)}, "
            f"median {target['median_min']} min"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10000, help="simulated runs a cell")
    p.add_argument("--m", type=int, default=10, help="block pairs a round")
    p.add_argument("--rounds", type=int, nargs="+", default=[30, 60], help="rounds a run has time for")
    p.add_argument("--replay", nargs="*", default=[], metavar="COMPARE.json", help="recordings to resample")
    p.add_argument("--real", nargs="*", default=[], metavar="COMPARE.json", help="long A/A recordings to cut")
    p.add_argument("--segments", type=int, nargs="+", default=[10, 30, 60], help="rounds a real A/A run")
    p.add_argument("--rejudge", nargs="*", default=[], metavar="COMPARE.json", help="recordings to judge again")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    started = time.monotonic()
    doc: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "clustered": clustered_nulls(args),
        "skewed": skewed_nulls(args),
        "power": power(args),
        "fixed_t_every_look": fixed_t_every_look(args),
        "run_wide": run_wide(args),
        "replayed": [row for path in args.replay for row in replay(path, args)],
        "real": [row for path in args.real for row in real_segments(path, args.segments)],
        "rejudged": [row for path in args.rejudge for row in rejudge(path, args)],
    }
    doc["seconds"] = round(time.monotonic() - started, 1)
    report(doc)
    print(f"\n{doc['seconds']:.0f} s")
    if args.out:
        lines = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items() if not isinstance(v, list))
        lists = ",\n".join(
            f"{json.dumps(k)}: [\n" + ",\n".join(json.dumps(row) for row in v) + "\n]"
            for k, v in doc.items()
            if isinstance(v, list)
        )
        Path(args.out).write_text("{\n" + lines + ",\n" + lists + "\n}\n")


if __name__ == "__main__":
    main()
