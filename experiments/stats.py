"""Statistics for the experiment report: CIs across seeds, verdicts, recovery, collapse.

- `summarize(values)`: mean and the half-width of the two-sided 95% confidence
  interval of the mean, `t_{0.975, n-1} * s / sqrt(n)` with `s` the sample
  standard deviation (ddof 1); NaN half-width for n < 2.
- `paired_difference(better, worse)`: the per-seed differences
  `better[s] - worse[s]` summarised like any quantity. Every variant of a seed
  starts from that seed's warm-start, so the difference cancels what the seeds
  share (the starting policy), which varies far more between seeds than
  variants differ within one.
- `verdict(difference)`: "agrees" when the 95% CI of the paired difference lies
  above 0 (the paper's direction), "disagrees" when below, "inconclusive" when
  it contains 0 (or n < 2), "not measurable" without a pair.
- `intervals_overlap(a, b)`: whether the per-variant intervals overlap (stated
  alongside: unpaired, they are wider than the paired one).
- `recovery_steps(steps, rewards, switch)`: after a preference switch, how many
  learner steps until the trailing mean of the post-switch reward is back at
  90% of the pre-switch level.
- `collapsed(rewards)`: the trailing mean at the end fell below half its best.
- `trailing_mean`, `trailing_median`: the smoothing of curves and diagnostics.
- `fisher_fewer_collapses`: one-sided Fisher's exact test that one arm collapses
  less often than another; `clopper_pearson`: the exact binomial interval of a
  count (0 of 8 collapses allows a true rate up to 0.37).
- `wilcoxon_greater`: one-sided exact Wilcoxon signed-rank p of paired differences.
- `minimum_detectable_difference`: the smallest mean paired difference the seeds
  would detect at 80% power, printed beside "inconclusive".
- `SETTING_FAILED`, `NOT_TESTED`, `INCOMPLETE`: verdicts that say the claim was not
  put to the test (its manipulation check failed, nothing ran, too few seeds).
- `registration_commit(module)`: the commit that added an experiment's module.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import subprocess
from typing import Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE  # one-sided tests of a registered direction
AGREES, DISAGREES, INCONCLUSIVE, NOT_MEASURABLE = (
    "agrees", "disagrees", "inconclusive", "not measurable")
# The claim was not put to the test: its setting's manipulation check failed (the
# contrast the claim is about never arose), or nothing ran; and too few seeds.
SETTING_FAILED, NOT_TESTED, INCOMPLETE = "setting failed", "not tested", "incomplete"


@dataclasses.dataclass(frozen=True)
class Summary:
  """Mean and 95% CI half-width of one quantity across seeds."""

  mean: float
  half_width: float  # NaN when n < 2
  n: int

  @property
  def low(self) -> float:
    return self.mean - self.half_width

  @property
  def high(self) -> float:
    return self.mean + self.half_width

  def format(self, digits: int = 3) -> str:
    if self.n == 0 or math.isnan(self.mean):
      return "n/a"
    if math.isnan(self.half_width):
      return f"{self.mean:.{digits}f} (n={self.n}, no CI)"
    return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
  """Two-sided Student-t critical value, e.g. 4.303 for df 2 at 95%."""
  return float(scipy_stats.t.ppf(0.5 + confidence / 2, df))


def summarize(values: Sequence[float]) -> Summary:
  """Mean ± t-interval half-width over the finite `values`."""
  data = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
  if data.size == 0:
    return Summary(math.nan, math.nan, 0)
  if data.size == 1:
    return Summary(float(data[0]), math.nan, 1)
  half = t_quantile(data.size - 1) * data.std(ddof=1) / math.sqrt(data.size)
  return Summary(float(data.mean()), float(half), int(data.size))


def band(matrix_SxN: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-column mean and 95% half-width of a [seeds, points] array (NaN half-width for 1 seed)."""
  columns = [summarize(matrix_SxN[:, j]) for j in range(matrix_SxN.shape[1])]
  return (np.array([c.mean for c in columns]), np.array([c.half_width for c in columns]))


def paired_difference(better: Mapping[int, float], worse: Mapping[int, float]) -> Summary:
  """Mean ± 95% half-width of `better[s] - worse[s]` over the seeds both have."""
  return summarize([better[s] - worse[s] for s in sorted(set(better) & set(worse))
                    if better[s] is not None and worse[s] is not None])


def verdict(difference: Summary) -> str:
  """Whether the paper's `better > worse` holds, from the CI of the paired difference."""
  if difference.n == 0 or math.isnan(difference.mean):
    return NOT_MEASURABLE
  if difference.n < 2:
    return INCONCLUSIVE
  if difference.low > 0:
    return AGREES
  if difference.high < 0:
    return DISAGREES
  return INCONCLUSIVE


def intervals_overlap(a: Summary, b: Summary) -> bool:
  """True when the two 95% intervals share a point (or either has none)."""
  if a.n < 2 or b.n < 2:
    return True
  return not (a.low > b.high or b.low > a.high)


def overall(verdicts: Sequence[str]) -> str:
  """A claim with several comparisons: disagrees if any does, agrees only if all do."""
  if not verdicts or all(v == NOT_MEASURABLE for v in verdicts):
    return NOT_MEASURABLE
  if DISAGREES in verdicts:
    return DISAGREES
  if all(v == AGREES for v in verdicts):
    return AGREES
  return INCONCLUSIVE


def finite_mean(values: Sequence[float]) -> float:
  """Mean of the finite values; NaN when there are none."""
  data = np.asarray(values, np.float64)
  finite = data[np.isfinite(data)]
  return float(finite.mean()) if finite.size else math.nan


def trailing_mean(values: Sequence[float], window: int) -> np.ndarray:
  """Mean of the last `window` values up to each position (fewer at the start)."""
  data = np.asarray(values, np.float64)
  sums = np.cumsum(np.concatenate([[0.0], data]))
  ends = np.arange(1, data.size + 1)
  starts = np.maximum(ends - window, 0)
  return (sums[ends] - sums[starts]) / (ends - starts)


def trailing_median(values: Sequence[float], window: int) -> np.ndarray:
  """Median of the last `window` finite values up to each position: robust to the
  rare huge diagnostic and to undefined (NaN) ones, such as the explained variance
  of a batch whose returns do not vary."""
  data = np.asarray(values, np.float64)
  out = np.full(data.size, math.nan)
  for end in range(1, data.size + 1):
    recent = data[max(0, end - window):end]
    recent = recent[np.isfinite(recent)]
    if recent.size:
      out[end - 1] = np.median(recent)
  return out


@dataclasses.dataclass(frozen=True)
class Recovery:
  """Re-alignment after one switch. `steps`: post-switch steps until the trailing
  mean reached `fraction` of `pre_level` (None: not within the phase)."""

  pre_level: float
  steps: int | None
  phase_steps: int


def recovery_steps(steps: Sequence[int], rewards: Sequence[float], switch: int, end: int, *,
                   pre_window: int, window: int, fraction: float = 0.9) -> Recovery:
  """Steps after `switch` until the reward is back at `fraction` of its pre-switch level.

  Pre-switch level: mean reward over the `pre_window` steps before `switch`.
  Post-switch, at each step t in [switch, end) the trailing mean over the last
  `window` post-switch steps (only those) is compared with `fraction * pre`;
  the answer counts steps switch..t inclusive. A pre-switch level <= 0 has
  nothing to recover: `steps` is None and `pre_level` says why.
  """
  steps_N = np.asarray(steps)
  rewards_N = np.asarray(rewards, np.float64)
  before = rewards_N[(steps_N >= switch - pre_window) & (steps_N < switch)]
  pre = float(before.mean()) if before.size else math.nan
  after = (steps_N >= switch) & (steps_N < end)
  if not pre > 0:
    return Recovery(pre, None, end - switch)
  post_steps, post = steps_N[after], trailing_mean(rewards_N[after], window)
  hit = np.nonzero(post >= fraction * pre)[0]
  return Recovery(pre, int(post_steps[hit[0]] - switch + 1) if hit.size else None, end - switch)


def collapsed(rewards: Sequence[float], *, window: int, fraction: float = 0.5) -> bool:
  """True if the final trailing mean is below `fraction` of the best trailing mean."""
  smooth = trailing_mean(rewards, window)
  return bool(smooth.size and smooth.max() > 0 and smooth[-1] < fraction * smooth.max())


def fisher_collapses(collapsed_a: int, runs_a: int, collapsed_b: int, runs_b: int) -> float:
  """Two-sided Fisher's exact p-value that two arms' collapse counts (collapsed of runs)
  come from one collapse rate: the test that suits counts of a few runs, where a t-interval
  of 0/1 outcomes does not."""
  table = [[collapsed_a, runs_a - collapsed_a], [collapsed_b, runs_b - collapsed_b]]
  return float(scipy_stats.fisher_exact(table).pvalue)


def growth(values: Sequence[float], *, min_points: int = 8) -> float:
  """Median over the last quarter of the finite values / median over the first quarter.

  How much a diagnostic (KL, gradient norm) grew over a run: ~1 for a steady run,
  >> 1 for one drifting toward instability. NaN with fewer than `min_points`
  finite values or a first-quarter median of 0 (no scale to compare against).
  """
  finite = np.asarray(values, dtype=float)
  finite = finite[np.isfinite(finite)]
  if finite.size < min_points:
    return math.nan
  quarter = finite.size // 4
  first, last = float(np.median(finite[:quarter])), float(np.median(finite[-quarter:]))
  return last / first if first != 0 else math.nan


def fisher_fewer_collapses(collapsed_a: int, runs_a: int, collapsed_b: int,
                           runs_b: int) -> float:
  """One-sided Fisher's exact p-value for "arm a collapses less often than arm b": the
  probability, with both arms' runs drawn from one collapse rate and the margins fixed,
  of a table with a's collapse count as small as observed or smaller."""
  table = [[collapsed_a, runs_a - collapsed_a], [collapsed_b, runs_b - collapsed_b]]
  return float(scipy_stats.fisher_exact(table, alternative="less").pvalue)


def clopper_pearson(successes: int, trials: int,
                    confidence: float = CONFIDENCE) -> tuple[float, float]:
  """Exact two-sided `confidence` interval of a binomial rate (Clopper-Pearson):
  low = Beta^-1(alpha/2; k, n-k+1), high = Beta^-1(1-alpha/2; k+1, n-k), with
  low = 0 at k = 0 and high = 1 at k = n. "0 collapses in 8 runs" is compatible
  with any true collapse rate below `high` (0.369 at 95%)."""
  if trials < 1 or not 0 <= successes <= trials:
    raise ValueError(f"clopper_pearson({successes}, {trials}): need 0 <= successes <= trials "
                     "and trials >= 1")
  alpha = 1 - confidence
  low = 0.0 if successes == 0 else float(
      scipy_stats.beta.ppf(alpha / 2, successes, trials - successes + 1))
  high = 1.0 if successes == trials else float(
      scipy_stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
  return low, high


def wilcoxon_greater(differences: Sequence[float]) -> float:
  """One-sided exact Wilcoxon signed-rank p-value that the paired `differences` are
  centred above 0 (scipy: zero differences dropped, `method="exact"`; with ties among
  the |differences| scipy falls back to its normal approximation). NaN with no
  non-zero difference."""
  data = np.asarray([d for d in differences if math.isfinite(d) and d != 0], np.float64)
  if data.size == 0:
    return math.nan
  method = "exact" if np.unique(np.abs(data)).size == data.size else "approx"
  return float(scipy_stats.wilcoxon(data, alternative="greater", method=method).pvalue)


def minimum_detectable_difference(differences: Sequence[float], *, power: float = 0.8,
                                  alpha: float = 1 - CONFIDENCE) -> float:
  """The smallest true mean paired difference that a two-sided one-sample t-test at
  `alpha` on these seeds would detect with probability `power`, taking the observed
  SD as the truth: (t_{1-alpha/2, n-1} + t_{power, n-1}) * s / sqrt(n). What
  "inconclusive" can rule out: nothing smaller than this. NaN for n < 2."""
  data = np.asarray([d for d in differences if d is not None and math.isfinite(d)], np.float64)
  if data.size < 2:
    return math.nan
  df = data.size - 1
  spread = (float(scipy_stats.t.ppf(1 - alpha / 2, df)) + float(scipy_stats.t.ppf(power, df)))
  return spread * float(data.std(ddof=1)) / math.sqrt(data.size)


def registration_commit(module: pathlib.Path) -> str:
  """The commit that added `module` (an experiment's pre-registration is its docstring,
  committed before any of its multi-seed runs): its short hash and date, from git."""
  try:
    result = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h (%cs)", "--",
                             module.name], cwd=module.parent, capture_output=True, text=True,
                            check=False)
  except FileNotFoundError:
    return "unknown (no git)"
  lines = result.stdout.split()
  return " ".join(result.stdout.strip().splitlines()[-1:]) if lines else "not committed yet"
