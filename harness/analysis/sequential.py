"""Verdicts that stay valid however often a run looks and whenever it stops: ``--until-resolved``.

A fixed-sample t test (``harness.analysis.stats``) is valid only at the number of rounds fixed up
front; testing after every round and stopping at the first "slower" raises its false-alarm rate
far above alpha. A run that stops when the answer is known needs a test whose error rate holds
under optional stopping. This one is an anytime-valid t test:

- The data are paired log differences ``d_i = ln(B_i / A_i)``, one a round (the mean of its block
  pairs: the blocks of a round are not independent, ``harness.analysis.blocks``), assumed
  independent and normal with unknown mean ``mu`` and unknown SD ``sigma``.
- The evidence against ``mu = mu0`` after n differences is the Bayes factor of the scale-invariant
  t test, with the right-Haar prior 1/sigma on the SD and a normal prior N(0, tau^2) on the
  standardized effect (mu - mu0)/sigma. In closed form, with t the usual one-sample t statistic
  and nu = n - 1:

      E_n(tau) = (1 + n tau^2)^(-1/2) * [(1 + t^2/nu) / (1 + t^2 / (nu (1 + n tau^2)))]^((nu + 1)/2)

  Because its prior on the nuisance SD is the group's right-Haar measure, E_n is a likelihood
  ratio of the scale-invariant part of the data and so a nonnegative martingale of mean 1 when
  ``mu = mu0`` (Pérez-Ortiz, Lardy, de Heide & Grünwald, "E-statistics, group invariance and
  anytime-valid testing", Annals of Statistics 2024). Ville's inequality then bounds the chance
  that it *ever* reaches 1/alpha by alpha: look after every block, stop whenever, the error
  rate holds. An equal-weight mixture over a grid of tau (``TAUS``) is again such a martingale;
  it makes the test sensitive to both the small standardized effects of end-to-end TTFT and the
  large ones of a codec's own time.
- The confidence sequence is every mu0 the evidence does not reject: ``|mean - mu0| < t*_n s/√n``
  with ``t*_n`` the t at which the mixture reaches 1/alpha. It covers the true change at every n
  at once with probability 1 - alpha, and so does its running intersection over the prefixes,
  which never widens: "equivalent" (the interval inside the margin) and "slower"/"faster" (the
  interval off 0) may be read whenever the run stops, and do not flip back.
- The anytime p-value is 1 / (the largest evidence seen so far), a valid p-value at any stopping
  time; Holm over the arms' anytime p-values keeps the family's rate at alpha.

Pure functions, no I/O. The rates under optional stopping, simulated and replayed from recorded
blocks: ``scripts/studies/sequential_calibration/``; the procedure and the published figures:
docs/method.md ("Stopping when the answer is known").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from harness.analysis.stats import ALPHA, DEFAULT_MARGIN_PCT, holm, margin_bounds

# The prior scales of the standardized effect, mixed with equal weights: from an effect of 3% of a
# block's SD (end-to-end TTFT, many blocks) to 10 SDs (a codec's own time, a handful of blocks).
TAUS = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
MIN_PAIRS = 2  # a t statistic needs two differences


def log_evidence(t: float, n: int, taus: Sequence[float] = TAUS) -> float:
    """ln of the mixture evidence E_n against mu = mu0 at the t statistic ``t`` of n differences."""
    if n < MIN_PAIRS:
        return 0.0
    nu = n - 1
    t2 = t * t if math.isfinite(t) else math.inf
    terms = []
    for tau in taus:
        g = 1.0 + n * tau * tau
        if math.isinf(t2):  # every difference equal and non-zero: the ratio's limit
            ratio_log = math.log(g)
        else:
            ratio_log = math.log1p(t2 / nu) - math.log1p(t2 / (nu * g))
        terms.append(-0.5 * math.log(g) + 0.5 * (nu + 1) * ratio_log)
    top = max(terms)
    return top + math.log(math.fsum(math.exp(x - top) for x in terms) / len(terms))


@cache
def critical_t(n: int, alpha: float = ALPHA, taus: tuple[float, ...] = TAUS) -> float:
    """The |t| at which n differences' mixture evidence reaches 1/alpha (inf when it never can:
    the evidence is bounded for few differences)."""
    target = math.log(1.0 / alpha)
    if n < MIN_PAIRS or log_evidence(math.inf, n, taus) < target:
        return math.inf
    lo, hi = 0.0, 1.0
    while log_evidence(hi, n, taus) < target:  # the evidence rises with |t|
        lo, hi = hi, 2.0 * hi
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if log_evidence(mid, n, taus) < target else (lo, mid)
    return hi


def _t(mean: float, sd: float, n: int) -> float:
    if sd == 0.0:
        return 0.0 if mean == 0.0 else math.inf
    return mean / (sd / math.sqrt(n))


@dataclass(frozen=True)
class SequenceStats:
    """B against A over n paired log differences, in the order they were measured.

    ``ci_low``/``ci_high`` bound the ratio B/A: the running intersection of the anytime-valid confidence
    sequence at 1 - alpha over every prefix (still valid, and it never widens); NaN while it bounds
    nothing (n < 3). ``p_anytime`` is 1 / the largest evidence against no change over every prefix.
    """

    n: int
    mean_log: float
    sd_log: float
    ratio: float
    ci_low: float
    ci_high: float
    p_anytime: float

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.ratio - 1.0)

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.ci_low) and math.isfinite(self.ci_high)


def evaluate(diffs: Sequence[float], alpha: float = ALPHA, taus: tuple[float, ...] = TAUS) -> SequenceStats:
    """The anytime-valid estimate, interval and p-value of paired log differences (in measured order;
    a non-finite difference is left out)."""
    xs = [d for d in diffs if math.isfinite(d)]
    n = len(xs)
    nan = math.nan
    if n < MIN_PAIRS:
        mean = xs[0] if xs else nan
        return SequenceStats(n, mean, nan, math.exp(mean), nan, nan, 1.0)
    best = 0.0  # ln of the largest evidence over the prefixes: every look a run could have made
    low, high = -math.inf, math.inf
    total = squares = 0.0
    mean = sd = nan
    for k, x in enumerate(xs, 1):  # running sums: every prefix in one pass
        total, squares = total + x, squares + x * x
        if k < MIN_PAIRS:
            continue
        mean = total / k
        sd = math.sqrt(max(0.0, squares - k * mean * mean) / (k - 1))
        best = max(best, log_evidence(_t(mean, sd, k), k, taus))
        half = critical_t(k, alpha, taus) * sd / math.sqrt(k)
        # Narrowed by each prefix; one that shares nothing with it (data that broke the model's
        # assumptions, e.g. a shift mid-run) leaves it as it was rather than empty.
        if math.isfinite(half) and max(low, mean - half) <= min(high, mean + half):
            low, high = max(low, mean - half), min(high, mean + half)
    ci = (math.exp(low), math.exp(high)) if math.isfinite(low) and math.isfinite(high) else (nan, nan)
    return SequenceStats(n, mean, sd, math.exp(mean), *ci, min(1.0, math.exp(-best)))


@dataclass(frozen=True)
class SequentialVerdict:
    """One comparison's sequential verdict: slower, faster, equivalent, or "inconclusive" (the interval
    still holds 0 and reaches past the margin)."""

    verdict: str
    stats: SequenceStats
    p_adjusted: float
    margin_pct: float


def judge_sequential(
    family: Sequence[Sequence[float]],
    *,
    higher_is_better: bool | Sequence[bool] = False,
    alpha: float = ALPHA,
    margin_pct: float = DEFAULT_MARGIN_PCT,
    taus: tuple[float, ...] = TAUS,
) -> list[SequentialVerdict]:
    """Sequential verdicts for one family (each entry: one comparison's paired log differences against
    the reference, one a round), Holm over the anytime p-values: "slower"/"faster" when the adjusted
    p < alpha (the direction the interval lies in); "equivalent" when the 1 - alpha/k interval lies
    inside the margin, k the family's size (Bonferroni: a confidence sequence has no p-value for
    equivalence to step down with, so Holm's first step is taken for every member)."""
    better = [higher_is_better] * len(family) if isinstance(higher_is_better, bool) else list(higher_is_better)
    seqs = [evaluate(d, alpha, taus) for d in family]
    strict = seqs if len(family) < 2 else [evaluate(d, alpha / len(family), taus) for d in family]
    adjusted = holm([s.p_anytime for s in seqs])
    lo, hi = margin_bounds(margin_pct)
    out = []
    for s, e, p, up in zip(seqs, strict, adjusted, better, strict=True):
        if s.n >= MIN_PAIRS and p < alpha:
            # The interval's middle gives the direction (the mean of the latest prefix could cross 0 after
            # the evidence was gathered); without an interval yet, the mean.
            centre = math.log(s.ci_low * s.ci_high) / 2 if s.bounded else s.mean_log
            worse = centre < 0 if up else centre > 0
            verdict = "slower" if worse else "faster"
        elif e.bounded and lo < math.log(e.ci_low) and math.log(e.ci_high) < hi:
            verdict = "equivalent"
        else:
            verdict = "inconclusive"
        out.append(SequentialVerdict(verdict, s, p, margin_pct))
    return out
