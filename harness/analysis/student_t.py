"""Student's t distribution (survival function, quantiles) and the t-interval of a sample.

Written out (a continued fraction for the incomplete beta function) so the
statistics need neither scipy nor numpy; checked against scipy in tests/test_stats.py.
``interval`` is the one t-interval of per-round values the project uses (sweep points).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import Any

CONFIDENCE = 0.95


# --- the distribution ------------------------------------------------------------------------

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


def t_test_power(ncp: float, df: float, level: float, grid: int = 2000) -> float:
    """Power of a two-sided t test at ``level``: P(|T'| > t[1-level/2, df]) for T' noncentral t(df, ncp).

    T' = (Z + ncp) / S with S = sqrt(V/df), V chi-square(df); integrated over S's density on a
    midpoint grid, so the power a round count promises is the test's own, not a normal approximation.
    """
    _check_df(df)
    crit = t_ppf(1 - level / 2, df)
    s_max = max(8.0, 1.0 + 12.0 / math.sqrt(df))
    step = s_max / grid
    half_df = df / 2.0
    log_norm = math.log(2.0 * df) - half_df * math.log(2.0) - math.lgamma(half_df)
    total = 0.0
    for i in range(grid):
        s = (i + 0.5) * step
        v = df * s * s
        log_density = log_norm + math.log(s) + (half_df - 1.0) * math.log(v) - v / 2.0
        # P(Z + ncp > crit*s) + P(Z + ncp < -crit*s)
        tails = 0.5 * math.erfc((crit * s - ncp) / math.sqrt(2.0)) + 0.5 * math.erfc((crit * s + ncp) / math.sqrt(2.0))
        total += math.exp(log_density) * tails
    return min(1.0, total * step)


@lru_cache(maxsize=4096)
def ncp_for_power(df: float, level: float, target: float) -> float:
    """The noncentrality at which the two-sided t test at ``level`` has power ``target`` (secant steps
    from the normal-theory value, which is a lower bound); cached: verdicts ask for few distinct ones."""
    normal = NormalDist().inv_cdf(1 - level / 2) + NormalDist().inv_cdf(target)
    x0, x1 = normal, normal * (1 + 1 / df)
    f0, f1 = t_test_power(x0, df, level) - target, t_test_power(x1, df, level) - target
    for _ in range(60):
        if f1 == f0 or abs(f1) < 1e-7:
            break
        x0, x1 = x1, max(normal, x1 - f1 * (x1 - x0) / (f1 - f0))
        f0, f1 = f1, t_test_power(x1, df, level) - target
    return x1


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


# --- the interval --------------------------------------------------------------------------------


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Mean of the per-round values with its t-interval (NaN bounds below two rounds).

    Also the geometric mean with the t-interval of the log values (``gmean``, ``gci_low``, ``gci_high``;
    NaN unless every value is positive): noise between rounds is multiplicative, and on log axes (where the
    plots draw it) that interval is symmetric and never reaches zero, as an arithmetic one with 3 rounds can.
    """
    xs = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    n = len(xs)
    t = t_ppf(0.5 + confidence / 2, n - 1) if n > 1 else math.nan
    mean = math.fsum(xs) / n if n else math.nan
    sd = statistics.stdev(xs) if n > 1 else math.nan
    half = t * sd / math.sqrt(n) if n > 1 else math.nan
    gmean = g_low = g_high = math.nan
    if n and all(x > 0 for x in xs):
        logs = [math.log(x) for x in xs]
        centre = math.fsum(logs) / n
        gmean = math.exp(centre)
        if n > 1:
            g_half = t * statistics.stdev(logs) / math.sqrt(n)
            g_low, g_high = math.exp(centre - g_half), math.exp(centre + g_half)
    return {
        "values": xs,
        "n": n,
        "mean": mean,
        "median": statistics.median(xs) if n else math.nan,
        "sd": sd,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "gmean": gmean,
        "gci_low": g_low,
        "gci_high": g_high,
        "confidence": confidence,
    }
