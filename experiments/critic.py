"""Did SAO's critic learn? A manipulation check with a registered threshold.

SAO's advantages come from its critic. Where the critic's explained variance after
its warm-up stays below a threshold, SAO ran on noise for advantages, and a loss
for SAO says "the critic did not learn", not "SAO lost". An experiment registers
the threshold (E3, E1-paper); `critic_check(runs, threshold)` applies it and
`verdict_text(outcome, check)` words the verdict.

A run's figure: the explained variance of V against G over every action token of
its steps after the value-only ones (`value_pretrain_steps + critic_warmup_steps`),
pooled as one batch (`sao_jax.run.critic_window.pool`) where the run logged each
step's moments (`value/return_var`, ...). Runs from before those metrics (the E1
and E2 archives) logged only each step's figure; there the run's figure is the
median of its per-step explained variances after warm-up, and the check says so.
An arm's figure is the median over its seeds; the arm's critic learned when that
median reaches the threshold.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from experiments.runs import Run
from sao_jax.config.learner import PAPER_VALUE_LR_SCALE, LearnerConfig
from sao_jax.run.critic_window import MOMENT_KEYS, pool

EV_KEY = "value/explained_variance"
POOLED = "pooled over the action tokens of its steps after warm-up"
MEDIAN = "median of its per-step figures after warm-up: runs from before the pooled moments"
# E1 and E2 were registered without a critic check: their reports show this one beside
# the registered verdict, chosen after the fact (a critic that knew only which path an
# episode took explains 0.02-0.45 of E1's returns), never in place of it.
DIAGNOSTIC_THRESHOLD = 0.3
# The registered verdicts a critic that did not learn replaces: SAO did not win.
SAO_LOST = ("not supported",)


def run_explained_variance(run: Run) -> tuple[float, str]:
  """(the run's critic explained variance after warm-up, how it was computed: POOLED or
  MEDIAN); NaN without a critic's metrics after warm-up."""
  after = run.steps >= run.value_only_steps
  if all(key in run.metrics for key in MOMENT_KEYS):
    rows = [{key: float(run.metrics[key][i]) for key in MOMENT_KEYS}
            for i in np.nonzero(after)[0]]
    rows = [row for row in rows if all(math.isfinite(v) for v in row.values())]
    if rows:
      return pool(rows)["explained_variance"], POOLED
  values = run.metrics.get(EV_KEY, np.zeros(run.steps.size) + math.nan)[after]
  values = values[np.isfinite(values)]
  return (float(np.median(values)) if values.size else math.nan), MEDIAN


@dataclasses.dataclass(frozen=True)
class CriticCheck:
  learned: bool
  text: str


def critic_check(runs: Sequence[Run], threshold: float) -> CriticCheck:
  """Whether the arm's critic learned: the median over its runs of
  `run_explained_variance` is >= `threshold` (an arm without a figure did not)."""
  figures = [run_explained_variance(run) for run in runs]
  values = np.array([value for value, _ in figures], np.float64)
  finite = values[np.isfinite(values)]
  median = float(np.median(finite)) if finite.size else math.nan
  learned = math.isfinite(median) and median >= threshold
  how = sorted({basis for _, basis in figures})
  per_seed = ", ".join(f"{run.seed}: {value:.2f}" for run, value in zip(runs, values))
  text = (f"the critic's explained variance after warm-up (per run: {'; '.join(how) or '-'}), "
          f"median over {finite.size} seeds {median:.2f} "
          f"({'>=' if learned else 'BELOW'} the threshold {threshold}); per seed {per_seed}")
  return CriticCheck(learned, text)


def verdict_text(outcome: str, check: CriticCheck) -> str:
  """The verdict, with "the critic did not learn" in place of a loss for SAO
  (`SAO_LOST`) when the critic check failed; any other outcome unchanged."""
  if not check.learned and outcome in SAO_LOST:
    return f"the critic did not learn (not: SAO lost; registered outcome {outcome})"
  return outcome


def _lr(value: float) -> str:
  return f"{value:.0e}".replace("e-0", "e-")


def schedule(run: Run) -> str:
  """The run's learning rates and critic schedule from its config.json, in words:
  `policy lr 1e-4 (5-step lr warm-up), critic lr 1e-4 (1x the policy's), 0 value
  pretraining steps, 3 critic warm-up steps`; the critic's part only for a run that
  trained one (a `value/*` metric)."""
  learner = run.learner
  policy_lr = learner["policy_lr"]
  warmup = learner.get("lr_warmup_steps", 0)
  text = f"policy lr {_lr(policy_lr)} ({f'{warmup}-step' if warmup else 'no'} lr warm-up)"
  if not any(key.startswith("value/") for key in run.metrics):
    return text
  value_lr = learner.get("value_lr")
  value_lr = PAPER_VALUE_LR_SCALE * policy_lr if value_lr is None else value_lr
  return (f"{text}, critic lr {_lr(value_lr)} ({value_lr / policy_lr:.2g}x the policy's; "
          f"the paper: {PAPER_VALUE_LR_SCALE:g}x), {learner.get('value_pretrain_steps', 0)} "
          f"value pretraining steps, {learner.get('critic_warmup_steps', 0)} critic warm-up "
          f"steps (the paper: {LearnerConfig().critic_warmup_steps})")
