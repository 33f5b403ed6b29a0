"""Is codec B slower, faster or equivalent to codec A?  Verdicts over benchmark rounds.

``bench run --repeat N`` runs the arms interleaved, so every figure (mean TTFT, p99 TTFT,
mean TPOT, ITL p50/p99, E2EL, codec µs per message, throughput, ...) has one value per arm
and round. Rounds are the unit of replication: requests inside one round share queues and
are not independent samples, so nothing here looks inside a round.

Pure functions, no I/O:

1. ``compare_arms``: on log values (noise and effects are multiplicative). Paired:
   d_r = ln(B_r / A_r), ratio = exp(mean d), CI and p from Student t with n-1 df.
   Unpaired (different round counts, runs made at different times): Welch t on the ln values.
2. ``holm``: Holm step-down over one family (harness.analysis.verdicts makes two: the primary
   figure across arms, then the other figures of the arms whose primary was resolved).
3. ``judge``, first match wins: "not comparable", "too few rounds", "slower"/"faster"
   (Holm-adjusted p < alpha), "equivalent" (the 1-alpha CI inside [1/(1+m), 1+m]), "inconclusive";
   ``not_judged``: the estimate and CI of a comparison left untested.

``power`` is the t test's exact power (noncentral t); ``mde_pct`` is the change the rounds run
detect four times in five, ``rounds_needed`` the rounds a new run needs to detect a stated change
(the margin) four times in five. The equivalence margin is symmetric in log space.

DEFAULT_ROUNDS, DEFAULT_MARGIN_PCT, ROUNDS_POWER and MIN_ROUNDS were chosen from simulated
false-positive rates and power (``scripts/studies/stats_calibration/``, ``--simulations 10000 --seed 1``).
The procedure in full and those tables: docs/method.md (section "Verdicts"); the calibrations on
real runs: docs/results.md (section "What the machine resolves (calibration)").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from harness.analysis.student_t import ncp_for_power, t_ppf, t_sf, t_test_power

ALPHA = 0.05
MIN_ROUNDS = 3
DEFAULT_ROUNDS = 7
DEFAULT_MARGIN_PCT = 5.0
ROUNDS_POWER = 0.8
MDE_POWER = 0.8
MAX_ROUNDS = 1000

VERDICTS = ("slower", "faster", "equivalent", "inconclusive", "too few rounds", "not comparable", "not judged")
RESOLVED = ("slower", "faster", "equivalent")


# --- comparing two arms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PairStats:
    """B against A for one figure, on log values.

    ratio = exp(mean_log) is B/A (a geometric-mean ratio), [ci_low, ci_high] its CI at compare_arms' confidence.
    sd_log is the SD of one round's log difference: of d_r when paired, sqrt(s_A^2 + s_B^2) when not.
    reason is non-empty when the arms cannot be compared at all (then every number is NaN).
    """

    n_a: int
    n_b: int
    paired: bool
    mean_log: float
    se_log: float
    sd_log: float
    df: float
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    reason: str = ""

    @property
    def n_rounds(self) -> int:
        """Rounds per arm (the fewer of the two when unpaired)."""
        return min(self.n_a, self.n_b)

    @property
    def comparable(self) -> bool:
        return not self.reason


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(xs) / n
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else math.nan
    return mean, var


def _t_test(mean: float, se: float, df: float) -> float:
    """Two-sided p of mean = 0; a zero SE (identical or constant differences) gives 1 or 0, not NaN."""
    if not (math.isfinite(se) and df > 0):
        return math.nan
    if se == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    return min(1.0, 2.0 * t_sf(abs(mean) / se, df))


def compare_arms(a: Sequence[float], b: Sequence[float], *, paired: bool, confidence: float = 1 - ALPHA) -> PairStats:
    """B (candidate) against A (baseline): geometric-mean ratio B/A, its CI and the t-test p-value.

    paired: a[i] and b[i] come from the same round (interleaved runs); requires equal lengths.
    Otherwise Welch's t on the log values. A NaN, infinite or non-positive value makes the
    result "not comparable" (reason set) rather than raising: one broken figure must not sink a table.
    """
    if paired and len(a) != len(b):
        raise ValueError(
            f"paired arms need the same number of rounds, got {len(a)} and {len(b)}; "
            "drop unmatched rounds or pass paired=False"
        )
    bad = [v for v in (*a, *b) if not (math.isfinite(v) and v > 0)]
    if bad:
        nan = math.nan
        return PairStats(
            len(a),
            len(b),
            paired,
            nan,
            nan,
            nan,
            nan,
            nan,
            nan,
            nan,
            nan,
            reason=f"value {bad[0]!r} is not a positive finite number",
        )
    log_a = [math.log(v) for v in a]
    log_b = [math.log(v) for v in b]
    if paired:
        mean, var = _mean_var([y - x for x, y in zip(log_a, log_b, strict=True)])
        n = len(a)
        sd, se, df = math.sqrt(var), math.sqrt(var / n) if n else math.nan, float(n - 1)
    else:
        mean_a, var_a = _mean_var(log_a)
        mean_b, var_b = _mean_var(log_b)
        mean = mean_b - mean_a
        sd = math.sqrt(var_a + var_b)
        se, df = _welch(var_a, len(a), var_b, len(b))
    p = _t_test(mean, se, df)
    half = t_ppf(0.5 + confidence / 2, df) * se if df > 0 and math.isfinite(se) else math.nan
    return PairStats(len(a), len(b), paired, mean, se, sd, df, _exp(mean), _exp(mean - half), _exp(mean + half), p)


def _welch(var_a: float, n_a: int, var_b: float, n_b: int) -> tuple[float, float]:
    """Standard error of the difference of means and the Welch-Satterthwaite df."""
    if n_a < 2 or n_b < 2:
        return math.nan, math.nan
    va, vb = var_a / n_a, var_b / n_b
    se = math.sqrt(va + vb)
    if va + vb == 0.0:
        return 0.0, float(n_a + n_b - 2)  # no spread at all: df does not matter, keep it finite
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    return se, df


def _exp(x: float) -> float:
    return math.exp(x) if math.isfinite(x) else math.nan


# --- multiple comparisons --------------------------------------------------------------------------


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in input order: monotone in the sorted p, clipped to 1."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        # The rank-th smallest p faces alpha/(m - rank); carrying the running max keeps the order.
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# --- power, rounds needed and minimum detectable effect ----------------------------------------------


def margin_bounds(margin_pct: float) -> tuple[float, float]:
    """The equivalence margin ±m% as log bounds symmetric in log space: ratios in [1/(1+m), 1+m]."""
    bound = math.log1p(margin_pct / 100)
    return -bound, bound


def power(effect_log: float, sd_log: float, n: int, *, level: float = ALPHA, df_per_round: float = 1.0) -> float:
    """Probability that the two-sided t test at ``level`` over n rounds finds a true log change ``effect_log``.

    sd_log is the SD of one round's log difference; df = df_per_round * (n - 1) (1 when paired, up to
    2 for Welch with equal rounds). Exact for the t test (noncentral t), not a normal approximation.
    """
    df = df_per_round * (n - 1)
    if not (math.isfinite(sd_log) and sd_log > 0 and df > 0):
        return math.nan
    return t_test_power(abs(effect_log) / (sd_log / math.sqrt(n)), df, level)


def _check_power(target: float) -> None:
    if not 0.0 < target < 1.0:
        raise ValueError(f"power must be in (0, 1), got {target}")


def _ncp(n: int, level: float, target: float, df_per_round: float) -> float:
    """The effect, in standard errors, that n rounds detect with power ``target``."""
    return ncp_for_power(round(df_per_round * (n - 1), 2), level, target)


def mde_pct(
    sd_log: float, n: int, *, level: float = ALPHA, power_target: float = MDE_POWER, df_per_round: float = 1.0
) -> float:
    """Minimum detectable effect in %: the change the two-sided t test at ``level`` detects with
    ``power_target`` (default 4 times in 5) in n rounds, from the test's exact power."""
    _check_power(power_target)
    if not (math.isfinite(sd_log) and sd_log > 0 and n >= 2):
        return math.nan
    return 100.0 * math.expm1(_ncp(n, level, power_target, df_per_round) * sd_log / math.sqrt(n))


def rounds_needed(
    sd_log: float,
    effect_pct: float,
    *,
    level: float = ALPHA,
    power_target: float = ROUNDS_POWER,
    df_per_round: float = 1.0,
    max_rounds: int = MAX_ROUNDS,
) -> int | None:
    """Rounds a *new* run needs to detect a true change of ``effect_pct`` with ``power_target``,
    given the round-to-round SD observed (the stated effect, never the observed one: plugging in
    the observed effect makes a null result look one top-up away). None beyond max_rounds.

    More rounds means a new run of this many rounds: topping this one up and testing again after
    each round raises the false-positive rate (a fixed-sample test, not a sequential one).
    """
    _check_power(power_target)
    effect_log = math.log1p(effect_pct / 100)
    if not (math.isfinite(sd_log) and sd_log > 0 and effect_log > 0):
        return None

    def enough(k: int) -> bool:
        return effect_log * math.sqrt(k) / sd_log >= _ncp(k, level, power_target, df_per_round)

    # The normal-theory answer is a lower bound (t tails are heavier): start there.
    z = NormalDist().inv_cdf(1 - level / 2) + NormalDist().inv_cdf(power_target)
    start = max(2, math.floor((z * sd_log / effect_log) ** 2))
    return _first_n(enough, start, max_rounds)


def _first_n(ok: Callable[[int], bool], start: int, stop: int) -> int | None:
    """Smallest n in [start, stop] with ok(n), for ok monotone in n (galloping from start, then bisection)."""
    if start > stop:
        return None
    if ok(start):
        return start
    lo, step = start, 1
    while not ok(hi := min(start + step, stop)):
        if hi >= stop:
            return None
        lo, step = hi, 2 * step
    while hi - lo > 1:  # ok(hi) holds, ok(lo) does not
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


# --- verdicts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """The verdict on one comparison of a family, with the figures behind it (changes in %, B against A).

    rounds_needed (inconclusive only): the rounds a new run needs to detect a change of the margin's
    size 4 times in 5 at the level this comparison faced, with the round-to-round SD seen here.
    """

    verdict: str
    change_pct: float
    ci_low_pct: float
    ci_high_pct: float
    p_value: float
    p_adjusted: float
    rounds_needed: int | None
    mde_pct: float
    n_rounds: int
    margin_pct: float = DEFAULT_MARGIN_PCT
    min_rounds: int = MIN_ROUNDS
    reason: str = ""
    # From rounds in blocks with the anytime-valid test (harness.analysis.sequential): the unit is still
    # the round (the mean of its block pairs), the interval is a confidence sequence's and p_value the
    # anytime p-value; the block pairs behind it and how strongly a round's blocks moved together.
    sequential: bool = False
    block_pairs: int = 0
    intra_round_correlation: float = math.nan

    @property
    def change(self) -> str:
        """The change and its interval; one round gives no interval, and none is printed."""
        if not math.isfinite(self.change_pct):
            return "no change measured"
        if not math.isfinite(self.ci_low_pct):
            return f"{self.change_pct:+.1f}% (no interval from {self.n_rounds} round(s))"
        if not math.isfinite(self.ci_high_pct):  # a confidence sequence too short to bound the change
            return f"{self.change_pct:+.1f}% [{self.ci_low_pct:+.1f}%, unbounded]"
        return f"{self.change_pct:+.1f}% [{self.ci_low_pct:+.1f}%, {self.ci_high_pct:+.1f}%]"

    @property
    def text(self) -> str:
        """One short line for a table cell or a log."""
        change, margin = self.change, f"±{self.margin_pct:g}%"
        if self.verdict in ("slower", "faster"):
            inside = -self.margin_pct < self.ci_low_pct and self.ci_high_pct < self.margin_pct
            return f"{self.verdict} by {change}" + (f", within {margin}" if inside else "")
        if self.verdict == "equivalent":
            return f"equivalent within {margin} ({change})"
        if self.verdict == "inconclusive" and self.sequential:
            return f"inconclusive: {change} over {self.n_rounds} rounds; more rounds would narrow it"
        if self.verdict == "inconclusive":
            if self.rounds_needed is None:
                return f"inconclusive: {change}; over {MAX_ROUNDS} rounds would be needed to detect {margin}"
            return f"inconclusive: {change}; a new run of ≈{self.rounds_needed} rounds would detect {margin}"
        if self.verdict == "too few rounds":
            return f"too few rounds for a verdict ({self.n_rounds} < {self.min_rounds})"
        if self.verdict == "not judged":
            return f"{change}, not judged: {self.reason}"
        return f"not comparable: {self.reason}"


def judge(
    family: Sequence[PairStats | None],
    *,
    higher_is_better: Sequence[bool],
    alpha: float = ALPHA,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    min_rounds: int = MIN_ROUNDS,
    test_alpha: float | None = None,
) -> list[Verdict]:
    """Verdicts for one family of comparisons, Holm-adjusted together: "slower"/"faster" by Holm's
    adjusted p-values, "equivalent" when the 1 - alpha/k interval lies inside the margin, k the
    comparisons tested (Bonferroni, Holm's first step: a false "equivalent" anywhere in the family
    stays within alpha too).

    None stands for a comparison that could not be made (a figure missing on one side).
    ``test_alpha``: the family's share of the error rate for "slower"/"faster", when it is less than
    ``alpha`` (the CIs shown, and the equivalence test's alpha, stay as above).
    """
    test_alpha = alpha if test_alpha is None else test_alpha
    if len(higher_is_better) != len(family):
        raise ValueError(f"higher_is_better has {len(higher_is_better)} entries for {len(family)} comparisons")
    if min_rounds < 2:
        raise ValueError("min_rounds must be >= 2: one round has no spread to test against")
    tested_stats = {i: s for i, s in enumerate(family) if s is not None and s.comparable and s.n_rounds >= min_rounds}
    tested = list(tested_stats)
    adjusted = dict(zip(tested, holm([s.p_value for s in tested_stats.values()]), strict=True))
    rejected = {i for i, p in adjusted.items() if p < test_alpha}
    common: dict[str, Any] = {"margin_pct": margin_pct, "min_rounds": min_rounds}
    verdicts = []
    for i, stats in enumerate(family):
        if stats is None or not stats.comparable:
            reason = "missing on one side" if stats is None else stats.reason
            n = 0 if stats is None else stats.n_rounds
            nan = math.nan
            verdicts.append(Verdict("not comparable", nan, nan, nan, nan, nan, None, nan, n, reason=reason, **common))
            continue
        # The Holm threshold this comparison faces once the other rejections are made.
        level = test_alpha / max(1, len(tested) - len(rejected - {i}))
        verdicts.append(
            _one_verdict(
                stats,
                higher_is_better[i],
                adjusted.get(i, math.nan),
                i in rejected,
                level,
                alpha,
                margin_pct,
                min_rounds,
                equivalence_alpha=alpha / max(1, len(tested)),
            )
        )
    return verdicts


def _change_fields(stats: PairStats, alpha: float) -> dict[str, Any]:
    """The change in % with its 1-alpha CI, and the p-value: what every verdict shows."""
    half = t_ppf(1 - alpha / 2, stats.df) * stats.se_log if stats.df > 0 else math.nan

    def pct(x: float) -> float:
        return 100.0 * math.expm1(x) if math.isfinite(x) else math.nan

    return {
        "change_pct": pct(stats.mean_log),
        "ci_low_pct": pct(stats.mean_log - half),
        "ci_high_pct": pct(stats.mean_log + half),
        "p_value": stats.p_value,
        "n_rounds": stats.n_rounds,
    }


def not_judged(
    stats: PairStats | None,
    reason: str,
    *,
    alpha: float = ALPHA,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    min_rounds: int = MIN_ROUNDS,
) -> Verdict:
    """A comparison reported with its estimate and CI but no verdict (a secondary figure whose
    primary was not resolved: testing it would spend error rate the primary did not earn)."""
    common: dict[str, Any] = {"margin_pct": margin_pct, "min_rounds": min_rounds, "reason": reason}
    if stats is None or not stats.comparable:
        nan = math.nan
        n = 0 if stats is None else stats.n_rounds
        return Verdict("not judged", nan, nan, nan, nan, nan, None, nan, n, **common)
    return Verdict(
        "not judged",
        p_adjusted=math.nan,
        rounds_needed=None,
        mde_pct=math.nan,
        **_change_fields(stats, alpha),
        **common,
    )


def _one_verdict(
    stats: PairStats,
    higher_is_better: bool,
    p_adj: float,
    rejected: bool,
    level: float,
    alpha: float,
    margin_pct: float,
    min_rounds: int,
    equivalence_alpha: float,
) -> Verdict:
    n = stats.n_rounds
    fields = _change_fields(stats, alpha)
    fields.update(p_adjusted=p_adj, margin_pct=margin_pct, min_rounds=min_rounds)
    if n < min_rounds:
        return Verdict("too few rounds", rounds_needed=None, mde_pct=math.nan, **fields)
    # Welch df per round relative to a paired design (1 when paired); with equal rounds per arm it lies in [1, 2].
    df_per_round = min(2.0, max(1.0, stats.df / (n - 1))) if n > 1 and math.isfinite(stats.df) else 1.0
    mde = mde_pct(stats.sd_log, n, level=level, df_per_round=df_per_round)
    if rejected:
        worse = stats.mean_log < 0 if higher_is_better else stats.mean_log > 0
        return Verdict("slower" if worse else "faster", rounds_needed=None, mde_pct=mde, **fields)
    lo, hi = margin_bounds(margin_pct)
    half = t_ppf(1 - equivalence_alpha / 2, stats.df) * stats.se_log if stats.df > 0 else math.nan
    if lo < stats.mean_log - half and stats.mean_log + half < hi:
        return Verdict("equivalent", rounds_needed=None, mde_pct=mde, **fields)
    needed = rounds_needed(stats.sd_log, margin_pct, level=level, df_per_round=df_per_round)
    return Verdict("inconclusive", rounds_needed=needed, mde_pct=mde, **fields)


PRIMARY_SHARE = 0.8  # of alpha, spent on the primary family; the rest falls back to the secondary one


def judge_gatekept(
    primary: Sequence[PairStats | None],
    secondary: Sequence[Sequence[PairStats | None]],
    *,
    primary_higher_is_better: bool,
    secondary_higher_is_better: Sequence[bool],
    alpha: float = ALPHA,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    min_rounds: int = MIN_ROUNDS,
    primary_share: float = PRIMARY_SHARE,
) -> tuple[list[Verdict], list[list[Verdict]]]:
    """Gatekeeping over arms with a fallback split of alpha, so a whole table's family-wise rate stays
    at alpha: the primary figure of every arm is one Holm family tested at primary_share · alpha; the
    secondary figures of the arms whose primary was resolved (slower, faster, equivalent) are a second
    Holm family, tested at the whole alpha when every primary was found different, else at the rest,
    (1 - primary_share) · alpha; the secondary figures of unresolved arms are ``not_judged``.
    ``secondary[i]`` are arm i's other figures, in the order of ``secondary_higher_is_better``."""
    settings: dict[str, Any] = {"alpha": alpha, "margin_pct": margin_pct, "min_rounds": min_rounds}
    firsts = judge(
        primary,
        higher_is_better=[primary_higher_is_better] * len(primary),
        test_alpha=primary_share * alpha,
        **settings,
    )
    open_arms = [i for i, v in enumerate(firsts) if v.verdict in RESOLVED]
    all_different = bool(firsts) and all(v.verdict in ("slower", "faster") for v in firsts)
    family = [p for i in open_arms for p in secondary[i]]
    verdicts = iter(
        judge(
            family,
            higher_is_better=list(secondary_higher_is_better) * len(open_arms),
            test_alpha=alpha if all_different else (1 - primary_share) * alpha,
            **settings,
        )
    )
    why = "primary not resolved"
    seconds = [
        [next(verdicts) for _ in secondary[i]]
        if i in open_arms
        else [not_judged(p, why, **settings) for p in secondary[i]]
        for i in range(len(primary))
    ]
    return firsts, seconds
