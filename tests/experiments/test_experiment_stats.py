"""experiments.stats: t-intervals against table values, verdicts, recovery, collapse."""

import math

import numpy as np
import pytest

from experiments import stats

# Two-sided 95% Student-t critical values from a printed t-table (NIST/SEMATECH
# e-Handbook, 4 decimals), independent of the scipy call under test.
T_TABLE_975 = {1: 12.7062, 2: 4.3027, 4: 2.7764, 9: 2.2622}


@pytest.mark.parametrize("df", sorted(T_TABLE_975))
def test_t_quantile_matches_the_table(df):
  assert stats.t_quantile(df) == pytest.approx(T_TABLE_975[df], abs=1e-4)


def test_summarize_by_hand():
  # [1, 2, 3]: mean 2, s = 1, half-width = 4.3027 * 1 / sqrt(3) = 2.4842.
  s = stats.summarize([1.0, 2.0, 3.0])
  assert (s.mean, s.n) == (2.0, 3)
  assert s.half_width == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
  # [1, ..., 5]: s = sqrt(2.5), half-width = 2.7764 * 1.5811 / sqrt(5) = 1.9632.
  s = stats.summarize([1, 2, 3, 4, 5])
  assert s.half_width == pytest.approx(2.7764 * math.sqrt(2.5) / math.sqrt(5), rel=1e-4)
  assert (s.low, s.high) == pytest.approx((3 - s.half_width, 3 + s.half_width))


def test_summarize_small_and_non_finite():
  one = stats.summarize([0.7])
  assert one.mean == 0.7 and one.n == 1 and math.isnan(one.half_width)
  assert "no CI" in one.format()
  empty = stats.summarize([])
  assert empty.n == 0 and math.isnan(empty.mean) and empty.format() == "n/a"
  assert stats.summarize([1.0, math.nan, None, 3.0]) == stats.summarize([1.0, 3.0])


def test_band_is_columnwise():
  matrix = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
  mean, half = stats.band(matrix)
  np.testing.assert_allclose(mean, [2.0, 0.0])
  np.testing.assert_allclose(half, [4.3027 / math.sqrt(3), 0.0], rtol=1e-4)


def _s(mean, half, n=3):
  return stats.Summary(mean, half, n)


@pytest.mark.parametrize("difference, expected", [
    (_s(0.2, 0.1), stats.AGREES),
    (_s(-0.2, 0.1), stats.DISAGREES),
    (_s(0.05, 0.1), stats.INCONCLUSIVE),
    (_s(-0.05, 0.1), stats.INCONCLUSIVE),  # wrong direction, but the CI contains 0
    (_s(0.25, 0.25), stats.INCONCLUSIVE),  # touching 0
    (_s(0.4, math.nan, 1), stats.INCONCLUSIVE),  # one seed: no interval
    (_s(math.nan, math.nan, 0), stats.NOT_MEASURABLE),
])
def test_verdict(difference, expected):
  assert stats.verdict(difference) == expected


def test_paired_difference_cancels_what_seeds_share():
  # Starting points differ by seed (0.2, 0.9, 0.1); A is 0.05 above B on every seed.
  better = {0: 0.25, 1: 0.95, 2: 0.15, 3: 0.5}
  worse = {0: 0.2, 1: 0.9, 2: 0.1}
  difference = stats.paired_difference(better, worse)  # seed 3 has no pair
  assert difference.n == 3 and difference.mean == pytest.approx(0.05)
  assert difference.half_width == pytest.approx(0.0, abs=1e-12)
  assert stats.verdict(difference) == stats.AGREES
  unpaired = [stats.summarize(list(v.values())) for v in (better, worse)]
  assert stats.intervals_overlap(*unpaired)  # the same data, unpaired: overlapping


def test_intervals_overlap():
  assert not stats.intervals_overlap(_s(0.9, 0.05), _s(0.5, 0.1))
  assert stats.intervals_overlap(_s(0.75, 0.25), _s(0.25, 0.25))  # touching at 0.5
  assert stats.intervals_overlap(_s(0.9, math.nan, 1), _s(0.1, 0.01))


@pytest.mark.parametrize("verdicts, expected", [
    ([stats.AGREES, stats.AGREES], stats.AGREES),
    ([stats.AGREES, stats.INCONCLUSIVE], stats.INCONCLUSIVE),
    ([stats.AGREES, stats.DISAGREES, stats.INCONCLUSIVE], stats.DISAGREES),
    ([stats.NOT_MEASURABLE], stats.NOT_MEASURABLE),
    ([], stats.NOT_MEASURABLE),
])
def test_overall(verdicts, expected):
  assert stats.overall(verdicts) == expected


def test_trailing_mean_matches_a_loop():
  values = np.random.default_rng(0).random(17)
  for window in (1, 3, 5, 40):
    expected = [values[max(0, i - window + 1):i + 1].mean() for i in range(values.size)]
    np.testing.assert_allclose(stats.trailing_mean(values, window), expected)


def test_trailing_median_matches_a_loop_and_skips_non_finite():
  values = np.random.default_rng(1).random(15)
  values[4] = -7e8  # one outlier barely moves a median
  values[9] = np.nan
  for window in (1, 4, 30):
    expected = []
    for i in range(values.size):
      recent = values[max(0, i - window + 1):i + 1]
      recent = recent[np.isfinite(recent)]
      expected.append(np.median(recent) if recent.size else np.nan)
    np.testing.assert_allclose(stats.trailing_median(values, window), expected)
  assert np.isnan(stats.trailing_median([np.nan, 1.0], 1)[0])


def _switch_curve():
  """Reward 1.0 for steps 0-9, 0 for 10-14, 1.0 from step 15 on (switch at 10)."""
  steps = np.arange(30)
  return steps, np.where((steps >= 10) & (steps < 15), 0.0, 1.0)


def test_recovery_steps_on_a_synthetic_switch():
  steps, rewards = _switch_curve()
  one = stats.recovery_steps(steps, rewards, 10, 30, pre_window=5, window=1)
  assert one == stats.Recovery(pre_level=1.0, steps=6, phase_steps=20)  # steps 10..15
  # Trailing mean of 3 post-switch steps: 1/3 at 15, 2/3 at 16, 1 at 17 -> 8 steps.
  assert stats.recovery_steps(steps, rewards, 10, 30, pre_window=5, window=3).steps == 8
  # 90% of the pre-switch level: a partial recovery to 0.95 counts, 0.85 does not.
  partial = np.where(steps >= 15, 0.95, rewards)
  assert stats.recovery_steps(steps, partial, 10, 30, pre_window=5, window=1).steps == 6
  short = np.where(steps >= 15, 0.85, rewards)
  assert stats.recovery_steps(steps, short, 10, 30, pre_window=5, window=1).steps is None


def test_recovery_ignores_steps_after_the_phase_and_zero_levels():
  steps, rewards = _switch_curve()
  # The phase ends at step 14, before the reward comes back.
  assert stats.recovery_steps(steps, rewards, 10, 15, pre_window=5, window=1).steps is None
  # No drop at all: recovered at the first post-switch step.
  assert stats.recovery_steps(steps, np.ones(30), 10, 30, pre_window=5, window=1).steps == 1
  # Nothing learned before the switch: nothing to recover.
  nothing = stats.recovery_steps(steps, np.zeros(30), 10, 30, pre_window=5, window=1)
  assert nothing.steps is None and nothing.pre_level == 0.0


def test_collapsed():
  rising = np.linspace(0.0, 1.0, 50)
  assert not stats.collapsed(rising, window=5)
  peaked = np.concatenate([np.linspace(0.0, 1.0, 25), np.zeros(25)])
  assert stats.collapsed(peaked, window=5)
  assert not stats.collapsed(np.zeros(20), window=5)  # never learned: nothing to collapse


def test_growth_compares_the_last_quarter_with_the_first():
  assert stats.growth([2.0] * 12) == 1.0
  # NaN steps (value-only updates) are skipped: the finite values are 1..16, quarters of 4.
  values = [math.nan, math.nan, *range(1, 17)]
  assert stats.growth(values) == pytest.approx(np.median([13, 14, 15, 16])
                                               / np.median([1, 2, 3, 4]))
  assert math.isnan(stats.growth([1.0] * 7))  # too few points to split into quarters
  assert math.isnan(stats.growth([0.0] * 4 + [1.0] * 8))  # no first-quarter scale


def test_clopper_pearson_matches_its_closed_forms_at_the_ends():
  # k = 0: upper = 1 - (alpha/2)^(1/n); k = n: lower = (alpha/2)^(1/n).
  assert stats.clopper_pearson(0, 8) == pytest.approx((0.0, 1 - 0.025 ** (1 / 8)))
  assert stats.clopper_pearson(8, 8) == pytest.approx((0.025 ** (1 / 8), 1.0))
  low, high = stats.clopper_pearson(3, 10)
  assert low < 0.3 < high
  with pytest.raises(ValueError, match=r"clopper_pearson\(9, 8\)"):
    stats.clopper_pearson(9, 8)


def test_wilcoxon_greater_is_the_exact_signed_rank_tail():
  """By enumeration of the 2^n sign patterns: P(W+ >= observed) under H0."""
  import itertools
  differences = [0.3, -0.1, 0.25, 0.05, 0.4, -0.2]
  ranks = np.argsort(np.argsort(np.abs(differences))) + 1
  observed = sum(r for r, d in zip(ranks, differences) if d > 0)
  tail = np.mean([sum(r for r, s in zip(ranks, signs) if s) >= observed
                  for signs in itertools.product([0, 1], repeat=len(ranks))])
  assert stats.wilcoxon_greater(differences) == pytest.approx(tail)
  assert stats.wilcoxon_greater([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(1 / 32)
  assert math.isnan(stats.wilcoxon_greater([0.0, 0.0]))


def test_fisher_fewer_collapses_is_the_hypergeometric_lower_tail():
  from math import comb
  # 1 of 8 vs 5 of 8 collapsed, 6 in all: P(X <= 1), X ~ Hypergeom(16, 6, 8).
  tail = sum(comb(6, k) * comb(10, 8 - k) for k in (0, 1)) / comb(16, 8)
  assert stats.fisher_fewer_collapses(1, 8, 5, 8) == pytest.approx(tail)
  assert stats.fisher_fewer_collapses(5, 8, 1, 8) > 0.9  # the wrong direction


def test_minimum_detectable_difference_follows_the_t_power_formula():
  from scipy import stats as scipy_stats
  differences = [0.1, -0.2, 0.3, 0.05, -0.1]
  sd = np.std(differences, ddof=1)
  expected = (scipy_stats.t.ppf(0.975, 4) + scipy_stats.t.ppf(0.8, 4)) * sd / math.sqrt(5)
  assert stats.minimum_detectable_difference(differences) == pytest.approx(expected)
  # The figure: 5 seeds, paired SD 0.21 -> about 0.35.
  assert stats.minimum_detectable_difference(
      [0.21 * x for x in (1.2649, -1.2649, 0.6325, -0.6325, 0.0)]) == pytest.approx(0.35, abs=0.01)
  assert math.isnan(stats.minimum_detectable_difference([0.1]))
