"""Says when the policy's gradient has been exactly 0 for `WINDOW` learner steps in a
row, and why, as far as the steps' metrics show it.

    watch = ZeroGradientWatch(value_only_steps=10, total_steps=1000)
    line = watch.observe(step, metrics)   # each learner step's metrics row: a line or None

A policy whose `policy/grad_norm` is exactly 0 does not change: a run of such steps
trains nothing while its progress lines look normal (a short run under the critic's
warm-up with a reward that is always 0 ended with `policy/grad_norm` 0.0 on every
step). Each zero step is put down to the first cause its metrics show (`CAUSES`),
and the line counts them. The critic's value-only steps (`step.value_only_steps`)
are expected: they count only when the whole run ends inside them (the start-up
line, `jobs.startup.no_policy_update`, says so too), else a run of policy steps does.
The line is logged once per run of zero steps.
"""

from __future__ import annotations

import collections
from typing import Mapping

WINDOW = 5  # zero-gradient steps in a row that make a warning

# A zero-gradient step's cause, by the first of its metrics that shows one:
# (test of the metrics row, what it means and what to do).
CAUSES = (
    (lambda m: m.get("policy/no_contrast_skip") == 1.0,
     "every trajectory of the batch earned the same reward, so "
     "algorithm.require_reward_contrast skipped the update"),
    (lambda m: m.get("tokens/action") == 0.0,
     "the batch held no action tokens (everything masked)"),
    (lambda m: m.get("advantage/zero_traj_frac") == 1.0,
     "every action token's advantage was 0: the rewards were all equal (within each group "
     "for group variants); an environment or env.reward_fn that always gives the same "
     "reward teaches nothing"),
    (lambda m: m.get("policy/kept_frac") == 0.0,
     "the DIS band masked every action token (policy/mask_low_frac, policy/mask_high_frac: "
     "the policy moved far from the samplers' behaviour policy)"),
    (lambda m: m.get("policy/clip_frac") == 1.0,
     "the PPO clip stopped every action token's gradient"),
)


class ZeroGradientWatch:
  """Fed each learner step's metrics row in order (`observe`); returns the warning line
  (module docstring) at the step that completes a run of zero-gradient steps."""

  def __init__(self, *, value_only_steps: int, total_steps: int):
    self._value_only, self._total = value_only_steps, total_steps
    self._steps: list[int] = []  # the current run of zero-gradient steps
    self._causes: collections.Counter[str] = collections.Counter()
    self._rewards: list[float] = []
    self._warned = False

  def observe(self, step: int, metrics: Mapping[str, float]) -> str | None:
    """The warning line when learner step `step` (from 0) completes a run of
    zero-gradient steps, else None. A row without `policy/grad_norm` is passed over."""
    norm = metrics.get("policy/grad_norm")
    if norm is None:
      return None
    if norm != 0.0:
      self._steps, self._causes, self._rewards, self._warned = [], collections.Counter(), [], False
      return None
    self._steps.append(step)
    self._causes[self._cause(step, metrics)] += 1
    if "reward/mean" in metrics:
      self._rewards.append(metrics["reward/mean"])
    value_only = self._causes[self._value_only_cause()]
    counted = len(self._steps) if self._value_only >= self._total else len(self._steps) - value_only
    if self._warned or counted < WINDOW:
      return None
    self._warned = True
    return self._line()

  def _value_only_cause(self) -> str:
    return (f"value-only steps of the critic's warm-up (the first {self._value_only}: "
            "learner.value_pretrain_steps + learner.critic_warmup_steps)"
            + (f", which outlast the run's learner.steps={self._total}; raise learner.steps "
               "or lower learner.critic_warmup_steps" if self._value_only >= self._total else ""))

  def _cause(self, step: int, metrics: Mapping[str, float]) -> str:
    if step < self._value_only:
      return self._value_only_cause()
    for shows, meaning in CAUSES:
      if shows(metrics):
        return meaning
    return "no cause the step's metrics show (policy/loss " + (
        f"{metrics['policy/loss']:g})" if "policy/loss" in metrics else "absent)")

  def _line(self) -> str:
    first, last = self._steps[0], self._steps[-1]
    causes = "; ".join(f"{count} x {cause}" for cause, count in self._causes.most_common())
    line = (f"warning: policy/grad_norm has been exactly 0 on the {len(self._steps)} learner "
            f"steps {first}..{last} (metrics rows): the policy did not change. Why: {causes}")
    if self._rewards:
      low, high = min(self._rewards), max(self._rewards)
      line += (f". reward/mean was {low:.3f} on each" if low == high
               else f". reward/mean ranged {low:.3f} to {high:.3f}")
    return line
