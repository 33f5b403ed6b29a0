"""Is codec B slower, faster or equivalent to codec A?  Verdicts over benchmark rounds.

``bench run --repeat N`` runs the codecs interleaved (A B A B ...), so every
figure (mean TTFT, p99 TTFT, mean TPOT, ITL p50/p99, E2EL, codec µs per
message, throughput, ...) has one value per arm and round. Rounds are the unit
of replication: requests inside one round share queues and are not
independent samples, so nothing here looks inside a round.

Procedure (pure functions, no I/O):

1. ``compare_arms``: on log values, because noise and effects are
   multiplicative. Paired (same rounds on both sides): d_r = ln(B_r / A_r);
   ratio = exp(mean d) (a geometric-mean ratio), CI from Student t with n-1 df,
   p from the two-sided one-sample t test of mean d = 0. Pairing removes what
   drifts from round to round, since both arms of a round see it (not the
   offset within a round of a fixed A-then-B order: see below). Unpaired
   (different round counts, or runs made at different times): Welch t on the
   ln values with Welch-Satterthwaite df.
2. ``holm``: Holm step-down over the whole family (every codec x figure of one
   table): it holds the family-wise error rate at alpha under any dependence
   between figures (TTFT mean/p50/p99 share most of their noise).
3. ``judge``, per comparison, first match wins: "not comparable" (a value is
   NaN, infinite or <= 0, or the figure is missing: left out of the Holm
   family); "too few rounds" (n < min_rounds: figures shown, left out of the
   family); "slower"/"faster" (Holm-adjusted p < alpha; which one depends on
   the figure's higher_is_better); "equivalent" (the 1-alpha CI of the ratio
   lies inside 1 +- margin); else "inconclusive". A significant difference
   smaller than the margin stays "slower"/"faster"; its text adds "within +-M%".

Rounds needed and minimum detectable effect (``rounds_needed``, ``mde_pct``).
With m = mean d, s = the SD of one round's log difference (sd_log) and
h(n) = (t[1-level/2, df(n)] + t[power, df(n)]) * s / sqrt(n):

* level = alpha / (k - r), the Holm threshold the comparison faces next:
  k = comparisons tested in the family, r = the others judged different.
* rounds_needed = the smallest total n (rounds per arm, those already run
  included) at which, if m and s stayed as observed, either h(n) < |m| (the CI
  would exclude 0 at that level: a difference), or m +- h(n) computed at the
  plain alpha would fit inside the margin (equivalence), whichever n is
  smaller; None beyond MAX_ROUNDS. With power = 0.5 this is the bare "the CI
  just resolves" rule; ROUNDS_POWER = 0.8 is used (measured below).
* mde_pct = exp(h(n)) - 1 at the current n and level, power MDE_POWER = 0.8:
  the change this many rounds detects four times in five.
* Unpaired: s = sqrt(s_A^2 + s_B^2), equal rounds per arm assumed ahead.

Defaults, measured with ``.venv/bin/python scripts/stats_calibration.py
--simulations 10000 --seed 1`` (~12 min on 2 busy cores; the default 1000
takes about a minute). Each simulated table is one codec pair's 11 figures (TTFT
mean/p50/p99, TPOT mean/p99, ITL p50/p99, E2EL mean, codec µs request/output,
output tok/s). Log noise per arm and round has SD sigma ("noise"), 30% of its
variance shared by every figure of the run, 50% by the figure's group (the
TTFTs, ...), 20% its own. Drift: +1% per round on every figure (throughput
-1%), shared by both arms; AB = A then B in every round (today's runner),
ABBA = the order reversed every other round. Verdicts come from compare_arms
and judge themselves.

A/A (no true change): share of tables with any "slower"/"faster".

| n | noise | drift | family FP, Holm | per-figure FP, Holm | family FP, no Holm | "equivalent" (±5%) |
|---|---|---|---|---|---|---|
| 3 | 2% | none | 4.9% | 0.47% | 38.9% | 25% |
| 3 | 2% | AB | 5.1% | 0.49% | 41.0% | 24% |
| 3 | 2% | ABBA | 4.5% | 0.43% | 37.5% | 24% |
| 3 | 5% | none / AB / ABBA | 5.0% / 4.6% / 4.5% | 0.48% / 0.43% / 0.43% | 38-39% | 2% |
| 5 | 2% | none | 4.7% | 0.46% | 36.0% | 71% |
| 5 | 2% | AB | 6.0% | 0.62% | 41.4% | 68% |
| 5 | 2% | ABBA | 4.3% | 0.44% | 34.4% | 69% |
| 5 | 5% | none / AB / ABBA | 4.6% / 5.0% / 4.5% | 0.46% / 0.50% / 0.45% | 35-37% | 4% |
| 8 | 2% | none | 4.3% | 0.46% | 34.8% | 98% |
| 8 | 2% | AB | 6.7% | 0.75% | 43.8% | 96% |
| 8 | 2% | ABBA | 3.9% | 0.42% | 33.2% | 97% |
| 8 | 5% | none / AB / ABBA | 4.2% / 4.9% / 4.3% | 0.44% / 0.53% / 0.45% | 34-36% | 11% |
| 10 | 2% | none | 4.7% | 0.51% | 34.8% | 99% |
| 10 | 2% | AB | 8.0% | 0.94% | 46.9% | 98% |
| 10 | 2% | ABBA | 3.8% | 0.40% | 31.8% | 99% |
| 10 | 5% | none / AB / ABBA | 4.3% / 4.9% / 3.9% | 0.49% / 0.53% / 0.45% | 34-36% | 19% |

(Standard error of a family rate ~0.2%.) With uncorrelated figures (--rho-machine
0 --rho-group 0, 3000 tables) the no-drift rows are 4.5-4.9%. Holm keeps the
family-wise rate at <= 5% without drift and with ABBA order; without Holm one
A/A table in three would flag something. With AB order a drift puts half a
round's drift into every d_r, a bias pairing cannot remove and that grows
against the noise with n (8.0% at n = 10, noise 2%; 9.5% with uncorrelated
figures): the runner should reverse the codec order every other round.

Power: one figure changed by 3 sigma (sigma = one arm's round-to-round SD in
log space; the change B/A is 3 sigma in ln), 10 unchanged; share called
"slower" (never the wrong direction; the same at noise 2% and 5%, the test is
scale free):

| n | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10 |
|---|---|---|---|---|---|---|---|---|
| noise 2% | 6.0% | 18.5% | 40.8% | 63.4% | 80.4% | 91.8% | 97.0% | 98.9% |
| noise 5% | 6.3% | 19.3% | 40.3% | 64.0% | 81.2% | 91.8% | 96.5% | 98.8% |

DEFAULT_ROUNDS = 7, the smallest n with power >= 80% (standard error 0.4%;
the noncentral t at the Bonferroni level 0.05/11 gives 80.9%, Holm a little
more). Only just: 8 rounds give 92%. It rests on the family size: at the
Bonferroni level a table of 15 figures needs 8 rounds for 80%, one of 60
comparisons (4 codecs x 15 figures) 9.

Equivalence at n = DEFAULT_ROUNDS: share of A/A figures called "equivalent";
in brackets the share when the true change equals the margin (a wrong
"equivalent", which the 1-alpha CI bounds by alpha/2 = 2.5%):

| margin | noise 1% | noise 2% | noise 3% | noise 5% |
|---|---|---|---|---|
| ±2% | 76% (1.8%) | 7% (1.5%) | 1% (0.3%) | 0% (0.0%) |
| ±3% | 99% (0.3%) | 39% (2.3%) | 8% (1.5%) | 0% (0.2%) |
| ±4% | 100% (0.0%) | 76% (1.8%) | 27% (2.2%) | 2% (0.8%) |
| ±5% | 100% (0.0%) | 94% (1.0%) | 54% (2.2%) | 8% (1.5%) |

DEFAULT_MARGIN_PCT = 5: the smallest margin that DEFAULT_ROUNDS resolves for
>= 80% of unchanged figures at 2% noise (the quieter mean figures of this
machine; p99s are noisier and stay "inconclusive", with the rounds they would
need). Pass a smaller margin to ask a sharper question; more rounds follow.

ROUNDS_POWER = 0.8: a comparison inconclusive after 5 rounds (noise 2%), re-run
with the rounds projected, was resolved in 88% of cases for a figure changed
by 3 sigma (median 8 rounds projected) and 99% for an unchanged one (10);
with the bare rule (power 0.5) 79% and 93% (7 and 7 rounds).

MIN_ROUNDS = 3: with two rounds (1 df) the t quantile at the Holm level of
one true change among 11 figures (0.05/11) is 140 (a change would have to be
140 standard errors wide), with three 14.8, with five 5.7; below three no
verdict is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any

ALPHA = 0.05
MIN_ROUNDS = 3
DEFAULT_ROUNDS = 7
DEFAULT_MARGIN_PCT = 5.0
ROUNDS_POWER = 0.8
MDE_POWER = 0.8
MAX_ROUNDS = 1000

VERDICTS = ("slower", "faster", "equivalent", "inconclusive", "too few rounds", "not comparable")


# --- Student t distribution ------------------------------------------------------------------------

_EPS = 1e-15
_TINY = 1e-300
_MAX_ITER = 100_000
# Beyond this many df the normal distribution stands in for t (relative tail error < 1e-4 for
# |x| < 6); below it the continued fraction gives ~1e-10 relative error or better.
_NORMAL_DF = 1e7


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz evaluation).

    Converges fast for x < (a+1)/(a+b+2); callers use the symmetry I_x(a,b) = 1 - I_{1-x}(b,a) otherwise.
    """
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_ITER):
        # Two terms per step: the even one, then the odd one.
        for coef in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + coef * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + coef / c
            c = c if abs(c) > _TINY else _TINY
            h *= c * d
        if abs(c * d - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def _log_beta(a: float, b: float) -> float:
    """ln B(a, b). For the t distribution b or a is 1/2; then, with the other large, lgamma(a + 1/2) - lgamma(a)
    cancels most of its digits, and the asymptotic series of that difference is used instead."""
    big = max(a, b)
    if min(a, b) == 0.5 and big >= 100:
        inv = 1.0 / big
        log_ratio = 0.5 * math.log(big) - inv / 8 + inv**3 / 192 - inv**5 / 640  # ln G(big + 1/2) - ln G(big)
        return 0.5 * math.log(math.pi) - log_ratio
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def betainc(a: float, b: float, x: float, y: float | None = None) -> float:
    """Regularized incomplete beta I_x(a, b); pass y = 1 - x when it is known more exactly than 1 - x."""
    y = 1.0 - x if y is None else y
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    # log1p of the smaller side keeps digits when x or y is close to 1 (t small against a large df).
    log_x = math.log(x) if x < 0.5 else math.log1p(-y)
    log_y = math.log(y) if y < 0.5 else math.log1p(-x)
    log_front = a * log_x + b * log_y - _log_beta(a, b)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, y) / b


def _check_df(df: float) -> None:
    if not df > 0:  # also rejects NaN
        raise ValueError(f"degrees of freedom must be > 0, got {df}")


def t_sf(x: float, df: float) -> float:
    """P(T > x) for Student's t with df (> 0, need not be an integer) degrees of freedom."""
    _check_df(df)
    if math.isnan(x):
        return math.nan
    if x < 0:
        return 1.0 - t_sf(-x, df)
    if math.isinf(x):
        return 0.0
    if df > _NORMAL_DF:
        return NormalDist().cdf(-x)
    # P(|T| > x) = I_{df/(df+x^2)}(df/2, 1/2); 1 - that argument is x^2/(df+x^2), passed exactly.
    x2 = x * x
    return 0.5 * betainc(df / 2.0, 0.5, df / (df + x2), x2 / (df + x2))


def t_pdf(x: float, df: float) -> float:
    """Density of Student's t."""
    _check_df(df)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))


@lru_cache(maxsize=4096)
def t_ppf(q: float, df: float) -> float:
    """The q quantile of Student's t with df degrees of freedom (inverse of the CDF)."""
    _check_df(df)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {q}")
    if q in (0.0, 0.5, 1.0):
        return {0.0: -math.inf, 0.5: 0.0, 1.0: math.inf}[q]
    if df > _NORMAL_DF:
        return NormalDist().inv_cdf(q)
    if df == 1:  # Cauchy, closed form; cot of the tail probability keeps digits far out
        return 1.0 / math.tan(math.pi * (1.0 - q)) if q > 0.5 else -1.0 / math.tan(math.pi * q)
    # Solve in the tail the quantile lies in, from its own probability: 1 - q would lose digits for small q.
    return _t_upper_quantile(1.0 - q, df) if q > 0.5 else -_t_upper_quantile(q, df)


def _t_upper_quantile(p: float, df: float) -> float:
    """x > 0 with t_sf(x, df) = p (p < 0.5): Newton from a Cornish-Fisher start, bisecting outside the bracket."""
    z = NormalDist().inv_cdf(1.0 - p)
    x = z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    lo, hi = 0.0, math.inf
    for _ in range(500):
        sf = t_sf(x, df)
        if sf > p:
            lo = x
        else:
            hi = x
        # sf is convex for x > 0, so Newton from the left never overshoots; from the right it may.
        step = (sf - p) / t_pdf(x, df)
        if abs(step) <= 1e-13 * max(1.0, x):
            return x + step
        x += step
        if not lo < x < hi:
            x = (lo + hi) / 2 if math.isfinite(hi) else 2 * lo + 1
    return x


# --- comparing two arms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One benchmark figure: its key in the results, a label for tables, and which way is better."""

    key: str
    label: str
    higher_is_better: bool = False


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


# --- rounds needed and minimum detectable effect -----------------------------------------------------


def _half_width(sd_log: float, n: float, level: float, power: float, df_per_round: float) -> float:
    """(t[1-level/2] + t[power]) * sd / sqrt(n) with df = df_per_round * (n - 1)."""
    df = df_per_round * (n - 1)
    if df <= 0:
        return math.inf
    return (t_ppf(1 - level / 2, df) + t_ppf(power, df)) * sd_log / math.sqrt(n)


def _check_power(power: float) -> None:
    # Below 0.5 the t term turns negative and the normal-theory start of the search is no longer a lower bound.
    if not 0.5 <= power < 1:
        raise ValueError(f"power must be in [0.5, 1), got {power}")


def mde_pct(
    sd_log: float, n: int, *, level: float = ALPHA, power: float = MDE_POWER, df_per_round: float = 1.0
) -> float:
    """Minimum detectable effect in %: the change a two-sided t test at `level` detects with `power` in n rounds.

    (t[1-level/2, df] + t[power, df]) * sd_log / sqrt(n), turned into a ratio: exp(that) - 1.
    sd_log is the SD of one round's log difference; df = df_per_round * (n - 1) (1 when paired).
    """
    _check_power(power)
    if not (math.isfinite(sd_log) and n >= 2):
        return math.nan
    return 100.0 * math.expm1(_half_width(sd_log, n, level, power, df_per_round))


def rounds_needed(
    mean_log: float,
    sd_log: float,
    *,
    n_now: int,
    level: float,
    alpha: float = ALPHA,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    power: float = ROUNDS_POWER,
    df_per_round: float = 1.0,
    max_rounds: int = MAX_ROUNDS,
) -> tuple[int | None, str | None]:
    """Total rounds after which, if mean and SD stayed as observed, a verdict would be reached.

    Returns (n, outcome) with outcome "difference" (the CI excludes 0 at `level`, the Holm threshold
    the comparison faces next) or "equivalence" (the 1-alpha CI fits inside +-margin), whichever
    needs fewer rounds; (None, None) when neither happens within max_rounds.
    """
    _check_power(power)
    if not (math.isfinite(mean_log) and math.isfinite(sd_log)):
        return None, None
    lo, hi = math.log1p(-margin_pct / 100), math.log1p(margin_pct / 100)
    targets = [("difference", abs(mean_log), level), ("equivalence", min(hi - mean_log, mean_log - lo), alpha)]
    best: tuple[int | None, str | None] = (None, None)
    for outcome, gap, lvl in targets:
        if gap <= 0:
            continue
        # t quantiles exceed normal ones, so no n below the normal-theory answer can do: start there.
        z = NormalDist().inv_cdf(1 - lvl / 2) + NormalDist().inv_cdf(power)
        n_normal = (z * sd_log / gap) ** 2
        if n_normal > max_rounds:
            continue

        def resolves(k: int, lvl: float = lvl, gap: float = gap) -> bool:
            return _half_width(sd_log, k, lvl, power, df_per_round) < gap

        n = _first_n(
            resolves,
            max(n_now + 1, 2, math.floor(n_normal)),
            max_rounds,
        )
        if n is not None and (best[0] is None or n < best[0]):
            best = (n, outcome)
    return best


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
    """The verdict on one comparison of a family, with the figures behind it (changes in %, B against A)."""

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
    resolves_to: str | None = None  # "difference" | "equivalence": what rounds_needed would show
    reason: str = ""

    @property
    def text(self) -> str:
        """One short line for a table cell or a log."""
        change = f"{self.change_pct:+.1f}% [{self.ci_low_pct:+.1f}%, {self.ci_high_pct:+.1f}%]"
        margin = f"±{self.margin_pct:g}%"
        if self.verdict in ("slower", "faster"):
            inside = -self.margin_pct < self.ci_low_pct and self.ci_high_pct < self.margin_pct
            return f"{self.verdict} by {change}" + (f", within {margin}" if inside else "")
        if self.verdict == "equivalent":
            return f"equivalent within {margin} ({change})"
        if self.verdict == "inconclusive":
            if self.rounds_needed is None:
                return f"inconclusive: {change}; over {MAX_ROUNDS} rounds would be needed"
            what = margin if self.resolves_to == "equivalence" else "the difference"
            return f"inconclusive: {change}; ≈{self.rounds_needed} rounds would resolve {what}"
        if self.verdict == "too few rounds":
            return f"too few rounds for a verdict ({self.n_rounds} < {self.min_rounds})"
        return f"not comparable: {self.reason}"


def judge(
    family: Sequence[PairStats | None],
    *,
    higher_is_better: Sequence[bool],
    alpha: float = ALPHA,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    min_rounds: int = MIN_ROUNDS,
) -> list[Verdict]:
    """Verdicts for one table's comparisons (every codec x figure), Holm-adjusted together.

    None stands for a comparison that could not be made (a figure missing on one side).
    """
    if len(higher_is_better) != len(family):
        raise ValueError(f"higher_is_better has {len(higher_is_better)} entries for {len(family)} comparisons")
    if min_rounds < 2:
        raise ValueError("min_rounds must be >= 2: one round has no spread to test against")
    tested_stats = {i: s for i, s in enumerate(family) if s is not None and s.comparable and s.n_rounds >= min_rounds}
    tested = list(tested_stats)
    adjusted = dict(zip(tested, holm([s.p_value for s in tested_stats.values()]), strict=True))
    rejected = {i for i, p in adjusted.items() if p < alpha}
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
        level = alpha / max(1, len(tested) - len(rejected - {i}))
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
            )
        )
    return verdicts


def _one_verdict(
    stats: PairStats,
    higher_is_better: bool,
    p_adj: float,
    rejected: bool,
    level: float,
    alpha: float,
    margin_pct: float,
    min_rounds: int,
) -> Verdict:
    n = stats.n_rounds
    half = t_ppf(1 - alpha / 2, stats.df) * stats.se_log if stats.df > 0 else math.nan
    low, high = stats.mean_log - half, stats.mean_log + half

    def pct(x: float) -> float:
        return 100.0 * math.expm1(x) if math.isfinite(x) else math.nan

    # Welch df per round relative to a paired design (1 when paired); with equal rounds per arm it lies in [1, 2].
    df_per_round = min(2.0, max(1.0, stats.df / (n - 1))) if n > 1 and math.isfinite(stats.df) else 1.0
    fields: dict[str, Any] = {
        "change_pct": pct(stats.mean_log),
        "ci_low_pct": pct(low),
        "ci_high_pct": pct(high),
        "p_value": stats.p_value,
        "p_adjusted": p_adj,
        "n_rounds": n,
        "margin_pct": margin_pct,
        "min_rounds": min_rounds,
    }
    if n < min_rounds:
        return Verdict("too few rounds", rounds_needed=None, mde_pct=math.nan, **fields)
    mde = mde_pct(stats.sd_log, n, level=level, df_per_round=df_per_round)
    if rejected:
        worse = stats.mean_log < 0 if higher_is_better else stats.mean_log > 0
        return Verdict("slower" if worse else "faster", rounds_needed=None, mde_pct=mde, **fields)
    if math.log1p(-margin_pct / 100) < low and high < math.log1p(margin_pct / 100):
        return Verdict("equivalent", rounds_needed=None, mde_pct=mde, **fields)
    needed, outcome = rounds_needed(
        stats.mean_log,
        stats.sd_log,
        n_now=n,
        level=level,
        alpha=alpha,
        margin_pct=margin_pct,
        df_per_round=df_per_round,
    )
    return Verdict("inconclusive", rounds_needed=needed, mde_pct=mde, resolves_to=outcome, **fields)
