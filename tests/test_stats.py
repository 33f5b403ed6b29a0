"""harness.analysis.stats: t distribution, Holm, paired/Welch comparisons and verdicts (pure functions, fast)."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats

from harness.analysis.figures import Figure
from harness.analysis.stats import (
    DEFAULT_MARGIN_PCT,
    DEFAULT_ROUNDS,
    MIN_ROUNDS,
    PairStats,
    compare_arms,
    holm,
    judge,
    margin_bounds,
    mde_pct,
    power,
    rounds_needed,
)
from harness.analysis.student_t import ncp_for_power, t_ppf, t_sf, t_test_power

# --- Student t (thin wrappers over scipy.special: checked against scipy.stats, the documented API) -----


@pytest.mark.parametrize(
    ("q", "df", "expected"),
    [
        (0.975, 1, 12.706),
        (0.975, 2, 4.303),
        (0.975, 4, 2.776),
        (0.975, 9, 2.262),
        (0.975, 29, 2.045),
        (0.95, 2, 2.920),
        (0.995, 10, 3.169),
        (0.999, 5, 5.893),
        (0.9, 120, 1.289),
    ],
)
def test_t_ppf_matches_table_values(q: float, df: int, expected: float) -> None:
    assert t_ppf(q, df) == pytest.approx(expected, abs=6e-4)
    assert t_ppf(1 - q, df) == pytest.approx(-expected, abs=6e-4)


def test_t_sf_closed_forms() -> None:
    assert t_sf(0.0, 3) == 0.5
    assert t_sf(math.inf, 3) == 0.0 and t_sf(-math.inf, 3) == 1.0
    assert math.isnan(t_sf(math.nan, 3))
    for x in (0.1, 1.0, 3.0, 40.0):
        assert t_sf(x, 1) == pytest.approx(0.5 - math.atan(x) / math.pi, rel=1e-10)  # Cauchy
        assert t_sf(x, 2) == pytest.approx(0.5 - x / (2 * math.sqrt(2 + x * x)), rel=1e-10)
        assert t_sf(-x, 7) == pytest.approx(1 - t_sf(x, 7), rel=1e-12)


@pytest.mark.parametrize("df", [0.7, 1.0, 2.5, 3.0, 7.3, 15.8, 60.0, 1e4, 1e9])
def test_t_sf_and_t_ppf_are_scipys(df: float) -> None:
    for x in (-8.0, -1.5, 0.3, 2.0, 5.0, 30.0):
        assert t_sf(x, df) == pytest.approx(scipy_stats.t.sf(x, df), rel=1e-9, abs=0)
    for q in (1e-6, 0.01, 0.2, 0.6, 0.975, 0.9977, 1 - 1e-7):
        assert t_ppf(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), rel=1e-9, abs=0)


def test_t_ppf_edges_and_large_df() -> None:
    assert t_ppf(0.5, 4) == 0.0
    assert t_ppf(1.0, 4) == math.inf and t_ppf(0.0, 4) == -math.inf
    assert t_ppf(0.975, 1e9) == pytest.approx(1.959964, abs=1e-6)
    assert t_ppf(0.975, 3.5) < t_ppf(0.975, 3)  # fewer df, heavier tails
    with pytest.raises(ValueError):
        t_ppf(0.9, 0)
    with pytest.raises(ValueError):
        t_ppf(1.5, 3)
    with pytest.raises(ValueError):
        t_sf(1.0, math.nan)


@pytest.mark.parametrize(("df", "level"), [(2.0, 0.05), (6.0, 0.05 / 3), (6.37, 0.04), (19.0, 0.01), (1998.0, 1e-4)])
def test_t_test_power_is_the_noncentral_t_tails(df: float, level: float) -> None:
    crit = scipy_stats.t.ppf(1 - level / 2, df)
    assert t_test_power(0.0, df, level) == pytest.approx(level, rel=1e-9)
    for ncp in (0.5, 1.0, 2.5, 4.0):
        expected = scipy_stats.nct.sf(crit, df, ncp) + scipy_stats.nct.cdf(-crit, df, ncp)
        assert t_test_power(ncp, df, level) == pytest.approx(expected, rel=1e-9)


def test_t_test_power_where_scipys_noncentral_t_answers_nan() -> None:
    # scipy's noncentral t CDF is NaN here (its far lower tail, below 1e-13): the power is the upper tail alone.
    df, level, ncp = 6.0, 0.04 / 3, 8.0
    crit = scipy_stats.t.ppf(1 - level / 2, df)
    got = t_test_power(ncp, df, level)
    assert got == pytest.approx(scipy_stats.nct.sf(crit, df, ncp), rel=1e-9)
    assert ncp_for_power(df, level, 0.8) < ncp


@pytest.mark.parametrize(("df", "level", "target"), [(2.0, 0.05, 0.8), (6.0, 0.05 / 3, 0.8), (12.74, 0.01, 0.9)])
def test_ncp_for_power_delivers_its_power(df: float, level: float, target: float) -> None:
    assert t_test_power(ncp_for_power(df, level, target), df, level) == pytest.approx(target, abs=1e-9)
    with pytest.raises(ValueError):
        ncp_for_power(df, level, level / 2)  # power never falls below the level


# --- Holm -----------------------------------------------------------------------------------------


def test_holm_textbook_example() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_monotone_clipped_and_empty() -> None:
    assert holm([]) == []
    assert holm([0.5, 0.9, 0.2]) == pytest.approx([1.0, 1.0, 0.6])
    p = [0.001, 0.02, 0.019, 0.3, 0.04]
    adj = holm(p)
    order = sorted(range(len(p)), key=p.__getitem__)
    assert all(adj[a] <= adj[b] for a, b in itertools.pairwise(order))
    assert all(x >= y for x, y in zip(adj, p, strict=True))


# --- compare_arms ---------------------------------------------------------------------------------


def test_paired_ratio_ci_and_p_value() -> None:
    a = [100.0, 102.0, 98.0, 101.0, 99.0]
    b = [104.0, 107.0, 101.0, 106.0, 102.0]
    s = compare_arms(a, b, paired=True)
    d = [math.log(y / x) for x, y in zip(a, b, strict=True)]
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    assert (s.n_a, s.n_b, s.df, s.paired) == (5, 5, 4.0, True)
    assert s.ratio == pytest.approx(math.exp(mean))
    assert s.sd_log == pytest.approx(sd)
    half = scipy_stats.t.ppf(0.975, 4) * sd / math.sqrt(5)
    assert (s.ci_low, s.ci_high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-9)
    assert s.p_value == pytest.approx(scipy_stats.ttest_rel(np.log(b), np.log(a)).pvalue, rel=1e-9)


def test_paired_needs_equal_lengths() -> None:
    with pytest.raises(ValueError, match="same number of rounds"):
        compare_arms([1.0, 2.0, 3.0], [1.0, 2.0], paired=True)


def test_welch_on_logs() -> None:
    rng = np.random.default_rng(3)
    a = list(np.exp(rng.normal(0.0, 0.03, 6)))
    b = list(np.exp(rng.normal(0.1, 0.06, 9)))
    s = compare_arms(a, b, paired=False)
    va, vb = np.var(np.log(a), ddof=1) / 6, np.var(np.log(b), ddof=1) / 9
    assert s.se_log == pytest.approx(math.sqrt(va + vb))
    assert s.df == pytest.approx((va + vb) ** 2 / (va**2 / 5 + vb**2 / 8))
    assert 5 < s.df < 13
    assert s.ratio == pytest.approx(math.exp(np.mean(np.log(b)) - np.mean(np.log(a))))
    welch = scipy_stats.ttest_ind(np.log(b), np.log(a), equal_var=False)
    assert (s.p_value, s.df) == pytest.approx((welch.pvalue, welch.df), rel=1e-9)
    ci = welch.confidence_interval(0.95)
    assert (s.ci_low, s.ci_high) == pytest.approx((math.exp(ci.low), math.exp(ci.high)), rel=1e-9)
    # Equal n and equal spread: Welch df is the pooled 2n - 2.
    same = compare_arms([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], paired=False)
    assert same.df == pytest.approx(4.0)


@pytest.mark.parametrize("bad", [math.nan, 0.0, -1.0, math.inf])
def test_bad_values_are_not_comparable(bad: float) -> None:
    s = compare_arms([1.0, 1.1, bad], [1.0, 1.2, 1.1], paired=True)
    assert not s.comparable and s.reason
    assert math.isnan(s.ratio) and math.isnan(s.p_value)


# --- judge ----------------------------------------------------------------------------------------


def _arms(n: int, change: float, noise: float, seed: int = 0) -> tuple[list[float], list[float]]:
    rng = np.random.default_rng(seed)
    a = 20.0 * np.exp(rng.normal(0, noise, n))
    b = 20.0 * (1 + change) * np.exp(rng.normal(0, noise, n))
    return a.tolist(), b.tolist()


def _one(a: list[float], b: list[float], higher: bool = False, **kw: Any):
    return judge([compare_arms(a, b, paired=True)], higher_is_better=[higher], **kw)[0]


def test_clear_effect_direction_follows_the_figure() -> None:
    a, b = _arms(8, 0.10, 0.01)
    latency = _one(a, b, higher=False)
    assert latency.verdict == "slower"
    assert 7 < latency.change_pct < 13 and latency.ci_low_pct > 0 and latency.p_adjusted < 0.05
    assert re.fullmatch(r"slower by \+\d+\.\d% \[\+\d+\.\d%, \+\d+\.\d%\]", latency.text)
    assert _one(a, b, higher=True).verdict == "faster"  # B higher throughput
    assert _one(b, a, higher=False).verdict == "faster"  # B lower latency
    assert _one(b, a, higher=True).verdict == "slower"  # B lower throughput
    assert _one(b, a).text.startswith("faster by -")


def test_significant_but_small_difference_says_within_margin() -> None:
    a, b = _arms(10, 0.01, 0.001)
    v = _one(a, b)
    assert v.verdict == "slower"
    assert v.text.endswith(f"within ±{DEFAULT_MARGIN_PCT:g}%")


def test_identical_arms_are_equivalent() -> None:
    a = [20.0, 21.0, 19.5, 20.4, 20.1]
    v = _one(a, list(a))
    assert v.verdict == "equivalent"
    assert (v.change_pct, v.p_value) == (0.0, 1.0)
    assert v.text == f"equivalent within ±{DEFAULT_MARGIN_PCT:g}% (+0.0% [+0.0%, +0.0%])"
    a, b = _arms(8, 0.0, 0.003, seed=4)
    assert _one(a, b, margin_pct=3.0).text.startswith("equivalent within ±3% (")


def test_noisy_small_n_is_inconclusive_with_rounds_needed() -> None:
    a, b = _arms(4, 0.03, 0.05, seed=1)
    v = _one(a, b)
    assert v.verdict == "inconclusive"
    assert v.n_rounds == 4 and v.rounds_needed is not None
    # The rounds for the stated effect (the margin) at 80% power, from the observed SD: not the observed effect.
    pair = compare_arms(a, b, paired=True)
    assert v.rounds_needed == rounds_needed(pair.sd_log, DEFAULT_MARGIN_PCT, level=0.05)
    assert v.mde_pct > abs(v.change_pct)
    assert re.fullmatch(
        r"inconclusive: [+-]\d+\.\d% \[[+-]\d+\.\d%, [+-]\d+\.\d%\]; "
        r"a new run of ≈\d+ rounds would detect ±5%",
        v.text,
    )


def test_too_few_rounds() -> None:
    a, b = _arms(2, 0.2, 0.01)
    v = _one(a, b)
    assert v.verdict == "too few rounds"
    assert v.text == f"too few rounds for a verdict (2 < {MIN_ROUNDS})"
    assert v.change_pct == pytest.approx(20, abs=5) and math.isnan(v.p_adjusted)


def test_empty_and_single_rounds_are_too_few() -> None:
    assert _one([], []).verdict == "too few rounds"
    assert _one([1.0], [2.0]).text == f"too few rounds for a verdict (1 < {MIN_ROUNDS})"
    assert judge([compare_arms([1.0], [2.0, 3.0, 4.0], paired=False)], higher_is_better=[False])[0].n_rounds == 1


def test_not_comparable_are_left_out_of_the_holm_family() -> None:
    a, b = _arms(6, 0.05, 0.02)
    good = compare_arms(a, b, paired=True)
    family = [good, compare_arms([*a[:5], math.nan], b, paired=True), None, compare_arms(a[:2], b[:2], paired=True)]
    verdicts = judge(family, higher_is_better=[False] * 4)
    assert [v.verdict for v in verdicts[1:]] == ["not comparable", "not comparable", "too few rounds"]
    assert verdicts[0].p_adjusted == pytest.approx(good.p_value)  # a family of one
    assert verdicts[2].text == "not comparable: missing on one side"
    assert "nan" in verdicts[1].text


def test_holm_applies_across_the_family() -> None:
    a, b = _arms(6, 0.05, 0.02)
    s = compare_arms(a, b, paired=True)
    alone = judge([s], higher_is_better=[False])[0]
    among_nulls = judge(
        [s] + [compare_arms(*_arms(6, 0.0, 0.02, seed=k), paired=True) for k in range(1, 11)],
        higher_is_better=[False] * 11,
    )[0]
    assert among_nulls.p_adjusted == pytest.approx(min(1.0, 11 * s.p_value))
    assert alone.p_adjusted == pytest.approx(s.p_value)


def test_unpaired_verdicts() -> None:
    a, _ = _arms(5, 0.0, 0.01, seed=2)
    _, b = _arms(9, 0.15, 0.01, seed=3)
    v = judge([compare_arms(a, b, paired=False)], higher_is_better=[False])[0]
    assert v.verdict == "slower" and v.n_rounds == 5


def test_judge_rejects_bad_arguments() -> None:
    s = compare_arms([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], paired=True)
    with pytest.raises(ValueError):
        judge([s], higher_is_better=[])
    with pytest.raises(ValueError):
        judge([s], higher_is_better=[False], min_rounds=1)


def test_figure_spec() -> None:
    f = Figure("output_throughput", "out tok/s", higher_is_better=True)
    assert (f.key, f.label, f.higher_is_better) == ("output_throughput", "out tok/s", True)
    assert Figure("mean_ttft_ms", "TTFT mean").higher_is_better is False


# --- rounds needed and MDE ------------------------------------------------------------------------


def test_power_is_the_t_tests_own() -> None:
    # Textbook: a one-sample t test, n = 10, effect = 1 SD, two-sided 5%: power 0.803.
    assert power(1.0, 1.0, 10, level=0.05) == pytest.approx(0.8031, abs=2e-4)
    assert power(0.0, 1.0, 7, level=0.05) == pytest.approx(0.05, abs=1e-6)
    # Against simulation of the paired test itself.
    rng = np.random.default_rng(3)
    d = rng.normal(0.03, 0.04, (40_000, 7))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(7))
    assert power(0.03, 0.04, 7, level=0.05) == pytest.approx(float((abs(t) > t_ppf(0.975, 6)).mean()), abs=0.01)


def test_rounds_needed_is_the_first_n_with_the_power() -> None:
    sd, level = 0.04, 0.05 / 3
    n = rounds_needed(sd, 3.0, level=level)
    assert n is not None
    assert power(math.log(1.03), sd, n, level=level) >= 0.8 > power(math.log(1.03), sd, n - 1, level=level)
    assert (rounds_needed(sd, 3.0, level=level, power_target=0.9) or 0) > n
    assert rounds_needed(0.5, 1.0, level=level) is None  # beyond MAX_ROUNDS


def test_mde_delivers_its_power() -> None:
    sd, n = 0.05, 7
    mde = mde_pct(sd, n, level=0.05)
    assert power(math.log1p(mde / 100), sd, n, level=0.05) == pytest.approx(0.8, abs=1e-3)


def test_equivalence_margin_is_symmetric_in_log_space() -> None:
    low, high = margin_bounds(5.0)
    assert math.exp(high) == pytest.approx(1.05) and math.exp(low) == pytest.approx(1 / 1.05)


def test_mde_shrinks_with_rounds() -> None:
    mdes = [mde_pct(0.03, n, level=0.05 / 11) for n in (3, 5, 8, 20)]
    assert all(x > y > 0 for x, y in itertools.pairwise(mdes))
    assert math.isnan(mde_pct(0.03, 1))


# --- Monte-Carlo properties (seeded, so deterministic) ----------------------------------------------


def _families(rng: np.random.Generator, sims: int, n: int, effect: np.ndarray, sigma: float) -> list[list]:
    """Independent log-normal noise per figure, arm and round: the hardest case for Holm's family-wise rate."""
    figures = len(effect)
    a = np.exp(rng.normal(0, sigma, (sims, figures, n)))
    b = np.exp(rng.normal(0, sigma, (sims, figures, n)) + effect[None, :, None])
    return [
        judge(
            [compare_arms(x, y, paired=True) for x, y in zip(ta.tolist(), tb.tolist(), strict=True)],
            higher_is_better=[False] * figures,
        )
        for ta, tb in zip(a, b, strict=True)
    ]


def test_family_wise_false_positive_rate_of_aa_tables() -> None:
    rng = np.random.default_rng(20240601)
    families = _families(rng, 400, 5, np.zeros(11), 0.03)
    fwer = np.mean([any(v.verdict in ("slower", "faster") for v in vs) for vs in families])
    assert fwer <= 0.08


def test_power_at_default_rounds_for_a_three_sigma_change() -> None:
    rng = np.random.default_rng(20240602)
    sigma = 0.03
    effect = np.zeros(11)
    effect[0] = 3 * sigma
    families = _families(rng, 400, DEFAULT_ROUNDS, effect, sigma)
    power = np.mean([vs[0].verdict == "slower" for vs in families])
    assert power >= 0.7


def test_pair_stats_n_rounds() -> None:
    s = PairStats(4, 7, False, 0.0, 0.1, 0.2, 8.0, 1.0, 0.9, 1.1, 0.5)
    assert s.n_rounds == 4 and s.comparable


def test_equivalence_in_a_family_holds_its_rate_across_the_family():
    """Five rounds whose 95% interval lies just inside ±5% but whose 97.5% one does not: "equivalent"
    alone, "inconclusive" as one of two comparisons (each faces alpha/2, Bonferroni)."""
    z = [-1.2649, -0.6325, 0.0, 0.6325, 1.2649]  # mean 0, SD 1
    pair = compare_arms([1.0] * 5, [math.exp(0.035 * x) for x in z], paired=True)
    (alone,) = judge([pair], higher_is_better=[False])
    assert alone.verdict == "equivalent"
    assert [v.verdict for v in judge([pair, pair], higher_is_better=[False, False])] == ["inconclusive"] * 2


def test_the_verdict_header_states_the_run_wide_rate():
    from harness.analysis.verdicts import run_wide_clause

    assert run_wide_clause(0.05, families=1) == "; with no true change, any false verdict ≤ 5%"
    assert "≤ 5% a family, ≤ 10% in the run" in run_wide_clause(0.05, families=2)
