"""The anytime-valid verdicts of --until-resolved (harness.analysis.sequential) and the block pairs
they judge (harness.analysis.blocks)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.analysis.blocks import block_values, intra_round_correlation, paired_log_diffs, round_means
from harness.analysis.runs import RunEntry
from harness.analysis.sequential import TAUS, critical_t, evaluate, judge_sequential, log_evidence
from harness.analysis.student_t import t_ppf
from harness.analysis.verdicts import Arm, compare


def test_the_evidence_is_the_closed_form_t_test_bayes_factor():
    # One prior scale, worked by hand: n = 5, t = 3, tau = 1 → (1+5)^-1/2 · ((1+9/4)/(1+9/24))^(5/2).
    expected = 6**-0.5 * ((1 + 9 / 4) / (1 + 9 / 24)) ** 2.5
    assert math.exp(log_evidence(3.0, 5, taus=(1.0,))) == pytest.approx(expected)
    assert log_evidence(0.0, 5, taus=(1.0,)) < 0  # no effect seen: evidence for "no change"
    assert log_evidence(5.0, 1) == 0.0  # one difference: no spread, no evidence


def test_critical_t_is_stricter_than_the_fixed_test_and_falls_with_n():
    crits = [critical_t(n) for n in (5, 10, 50, 200)]
    assert crits == sorted(crits, reverse=True)
    assert all(c > t_ppf(0.975, n - 1) for c, n in zip(crits, (5, 10, 50, 200)))
    assert critical_t(2) == math.inf  # two differences can never reach 1/alpha
    assert math.exp(log_evidence(critical_t(20), 20)) == pytest.approx(20.0, rel=1e-6)


def test_optional_stopping_keeps_the_false_alarm_rate_under_alpha():
    # Look after every pair up to 200, stop at the first "different": the fixed t test would alarm in
    # roughly two runs of five; the anytime-valid test stays under alpha (Ville's inequality).
    rng = np.random.default_rng(7)
    runs, pairs = 400, 200
    x = rng.standard_normal((runs, pairs))
    n = np.arange(1, pairs + 1)
    mean = np.cumsum(x, 1) / n
    var = (np.cumsum(x * x, 1) - n * mean**2) / np.maximum(n - 1, 1)
    t = np.abs(mean[:, 1:]) / np.sqrt(var[:, 1:] / n[1:])
    alarms = (t >= np.array([critical_t(int(k)) for k in n[1:]])).any(1).mean()
    naive = (t >= np.array([t_ppf(0.975, int(k) - 1) for k in n[1:]])).any(1).mean()
    assert alarms <= 0.05 < 0.2 < naive


def test_a_clear_change_is_found_and_its_interval_covers_it():
    rng = np.random.default_rng(3)
    diffs = list(math.log(1.2) + 0.05 * rng.standard_normal(30))
    s = evaluate(diffs)
    assert s.p_anytime < 0.05 and s.ci_low < 1.2 < s.ci_high
    [v] = judge_sequential([diffs])
    assert v.verdict == "slower"
    [v] = judge_sequential([diffs], higher_is_better=True)  # a throughput that rose
    assert v.verdict == "faster"


def test_equivalent_when_the_interval_lies_inside_the_margin_and_inconclusive_before():
    rng = np.random.default_rng(5)
    diffs = list(0.01 * rng.standard_normal(200))
    assert judge_sequential([diffs[:3]])[0].verdict == "inconclusive"
    assert judge_sequential([diffs], margin_pct=5.0)[0].verdict == "equivalent"
    short = evaluate(diffs[:2])
    assert math.isnan(short.ci_low) and math.isnan(short.ci_high)  # two pairs bound nothing
    assert evaluate([math.nan, *diffs[:5]]).n == 5  # a pair without a figure is left out


def test_the_interval_never_widens_and_a_found_change_keeps_its_direction():
    rng = np.random.default_rng(11)
    # A clear rise first, then noise around no change: the evidence gathered early stands.
    diffs = [math.log(1.3) + 0.02 * x for x in rng.standard_normal(12)] + list(0.2 * rng.standard_normal(40))
    widths = []
    for n in range(3, len(diffs) + 1):
        s = evaluate(diffs[:n])
        widths.append(math.log(s.ci_high / s.ci_low))
    assert all(b <= a + 1e-12 for a, b in zip(widths, widths[1:]))
    [v] = judge_sequential([diffs])
    assert v.verdict == "slower" and v.stats.ci_low > 1.0


def test_holm_across_arms_and_taus_cover_big_and_small_effects():
    big = [math.log(3.0) + 0.01 * k for k in range(-2, 3)]  # five pairs of a codec's own time, 3x
    verdicts = judge_sequential([big, [0.001, -0.002, 0.0015, -0.001, 0.0005]])
    assert [v.verdict for v in verdicts][0] == "slower"
    assert verdicts[0].p_adjusted >= verdicts[0].stats.p_anytime
    assert len(TAUS) > 1


def _doc(ttfts: list[float | None], block_size: int, codec_us: float = 50.0) -> dict:
    records = [
        {"index": i, "ttft": t, "success": t is not None, "codec_us": codec_us, "codec_wire_us": 2 * codec_us}
        for i, t in enumerate(ttfts)
    ]
    return {"records": records, "metadata": {"flags": {"block_size": block_size}}}


def test_block_values_are_block_means_and_a_failed_request_voids_its_block():
    doc = _doc([0.010, 0.012, 0.020, None, 0.030], block_size=2)
    blocks = block_values(doc)
    assert blocks is not None
    assert blocks["mean_ttft_ms"][0] == pytest.approx(11.0)
    assert math.isnan(blocks["mean_ttft_ms"][1])  # a failed request: no figure for the block
    assert blocks["mean_ttft_ms"][2] == pytest.approx(30.0)
    assert blocks["first_token_path_us"][0] == pytest.approx(50.0)
    assert block_values(_doc([0.01], block_size=0)) is None  # not run in blocks


def test_block_pairs_follow_rounds_then_blocks_and_skip_what_one_side_lacks():
    ref = [(1, {"mean_ttft_ms": [10.0, 10.0]}), (0, {"mean_ttft_ms": [10.0, math.nan]})]
    cand = [(0, {"mean_ttft_ms": [11.0, 12.0]}), (1, {"mean_ttft_ms": [12.0, 13.0]}), (2, {"mean_ttft_ms": [9.0]})]
    rounds = paired_log_diffs(ref, cand, "mean_ttft_ms")
    assert len(rounds) == 2 and rounds[0] == pytest.approx([math.log(1.1)])
    assert rounds[1] == pytest.approx([math.log(1.2), math.log(1.3)])
    # The sequential test's unit: one difference a round, the mean of its block pairs.
    assert round_means(rounds) == pytest.approx([math.log(1.1), (math.log(1.2) + math.log(1.3)) / 2])


def test_the_intra_round_correlation_is_the_share_of_variance_between_rounds():
    assert intra_round_correlation([[1.0, 1.0], [3.0, 3.0]]) == pytest.approx(1.0)  # rounds move as one
    assert math.isnan(intra_round_correlation([[1.0, 2.0]]))  # one round: no between-round spread
    rng = np.random.default_rng(7)
    for rho in (0.0, 0.1, 0.3):
        offsets = np.sqrt(rho) * rng.standard_normal((4000, 1))
        blocks = offsets + np.sqrt(1 - rho) * rng.standard_normal((4000, 10))
        assert intra_round_correlation(blocks.tolist()) == pytest.approx(rho, abs=0.02)
    unequal = [list(rng.standard_normal(rng.integers(2, 12))) for _ in range(3000)]
    assert intra_round_correlation(unequal) == pytest.approx(0.0, abs=0.02)


def _arm(label: str, ttft_ms: float, codec_us: float, rounds: int = 4, noise: float = 0.03) -> Arm:
    rng = np.random.default_rng(len(label))
    runs = []
    for r in range(rounds):
        ttfts = list(ttft_ms / 1000 * np.exp(noise * rng.standard_normal(40)))
        doc = _doc(ttfts, block_size=10, codec_us=codec_us)
        blocks = block_values(doc)
        figures = {
            "mean_ttft_ms": float(np.mean(ttfts) * 1000),
            "first_token_path_us": codec_us,
            "first_token_codec_wire_us": 2 * codec_us,
            "request_rate": 10.0,
        }
        runs.append(RunEntry(label, r, "ok", "", None, None, figures, blocks))
    return Arm(label, runs)


def test_a_sequential_comparison_judges_block_figures_and_shows_the_rest():
    comparison = compare([_arm("a", 20.0, 50.0), _arm("bb", 20.0, 150.0)], sequential=True)
    cells = {c.figure.key: c for c in comparison.cells}
    assert cells["mean_ttft_ms"].role == "primary" and cells["mean_ttft_ms"].verdict.sequential
    assert cells["first_token_path_us"].role == "codec"
    assert cells["first_token_path_us"].verdict.verdict == "slower"  # 3x in every block
    assert comparison.sequential
    fixed = compare([_arm("a", 20.0, 50.0), _arm("bb", 20.0, 150.0)])
    # Without stopping, the codec family is judged by rounds at the whole alpha whatever TTFT found.
    assert fixed.cell("bb", "first_token_path_us").verdict.verdict == "slower"
    assert not fixed.cell("bb", "first_token_path_us").verdict.sequential


def test_a_run_stops_when_every_primary_is_resolved_or_the_next_round_would_overrun():
    from harness.experiment.flow import progress_line, why_stop

    slower = compare([_arm("a", 20.0, 50.0, noise=0.001), _arm("bb", 24.0, 150.0, noise=0.001)], sequential=True)
    assert slower.cell("bb", "mean_ttft_ms").verdict.verdict == "slower"
    assert why_stop(slower, left_s=500, round_s=30) == "resolved"
    noisy = [_arm("a", 20.0, 50.0, rounds=1, noise=0.5), _arm("bb", 20.0, 50.0, rounds=1, noise=0.5)]
    unsure = compare(noisy, sequential=True)
    assert unsure.cell("bb", "mean_ttft_ms").verdict.verdict == "inconclusive"
    assert why_stop(unsure, left_s=500, round_s=30) is None  # time for another round
    assert why_stop(unsure, left_s=20, round_s=30) == "time"
    assert why_stop(None, left_s=500, round_s=30) == "no comparison"
    line = progress_line(unsure, rounds=1, used_min=0.5, minutes=10)
    assert line.startswith("[until resolved] 1 round(s), 0.5 of 10 min used, 9.5 left:")
    assert "bb (4 block pairs): TTFT mean" in line and "inconclusive" in line and "codec 1st tok" in line


def test_the_gate_judges_a_run_made_until_resolved_from_its_block_pairs():
    from harness.analysis.gate import run_gate

    arms = [_arm("a", 20.0, 50.0, noise=0.001), _arm("bb", 26.0, 50.0, noise=0.001)]
    for arm in arms:
        for run in arm.runs:
            run.until_resolved = 10.0  # as a run file made with --until-resolved 10 records it
    result = run_gate(arms, threshold_pct=5.0)
    assert result.comparison.sequential
    assert result.arms[0].primary.verdict.sequential and result.exit_code() == 1  # +30%: a regression


def test_calibrate_is_answered_when_the_aa_arm_is_resolved_and_every_injected_cost_found():
    from harness.commands.calibrate import costs_found

    ref, aa = _arm("a", 20.0, 50.0, noise=0.001), _arm("a2", 20.0, 50.0, noise=0.001)
    found = compare([ref, aa, _arm("cost", 21.0, 50.0, noise=0.001)], sequential=True, margin_pct=10.0)
    assert found.cell("cost", "mean_ttft_ms").verdict.verdict == "slower" and costs_found(found)
    # A 1% cost inside a ±5% margin is "equivalent": resolved for bench run, not found for calibrate.
    noisy = [  # one difference a round: 8 rounds for an interval inside ±5%
        _arm("a", 20.0, 50.0, rounds=8, noise=0.05),
        _arm("a2", 20.0, 50.0, rounds=8, noise=0.05),
        _arm("cost", 20.2, 50.0, rounds=8, noise=0.05),
    ]
    hidden = compare(noisy, sequential=True, margin_pct=5.0)
    assert hidden.cell("cost", "mean_ttft_ms").verdict.verdict == "equivalent" and not costs_found(hidden)


def test_the_round_unit_holds_the_false_alarm_rate_where_blocks_of_a_round_move_together():
    # 200 A/A runs of 20 rounds, 10 block pairs a round, a round offset carrying 10% of the variance
    # (recorded runs showed 0.02-0.06): judged after every round, as --until-resolved would.
    rng = np.random.default_rng(11)
    rho, runs, rounds, blocks = 0.1, 200, 20, 10
    offsets = math.sqrt(rho) * rng.standard_normal((runs, rounds, 1))
    data = offsets + math.sqrt(1 - rho) * rng.standard_normal((runs, rounds, blocks))

    def false_alarms(units_of_run) -> float:
        said = [judge_sequential([units_of_run(run)])[0].verdict for run in data]
        return sum(v in ("slower", "faster") for v in said) / runs

    by_round = false_alarms(lambda run: round_means(run.tolist()))
    by_block = false_alarms(lambda run: run.ravel().tolist())  # the old unit: every block pair
    assert by_round <= 0.08  # alpha 5%, with room for 200 runs' sampling error
    assert by_block > 2 * by_round and by_block > 0.08  # taking clustered blocks as independent errs
