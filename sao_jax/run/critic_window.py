"""The critic's explained variance and bias over a window of learner steps.

    window = CriticWindow()                       # the last WINDOW_STEPS steps
    metrics.update(window.update(step_metrics))   # + value/explained_variance_window, /bias_window

A window's explained variance is NOT the mean of its steps' explained variances:
it is `1 - Var(G - V) / Var(G)` over every action token of the window's steps, as
if they were one batch. Each step logs the moments that make this exact
(`losses.critic_moments`: `value/return_mean`, `/return_var`, `/residual_var`,
with `tokens/action` its token count and `value/bias` = -mean(G - V)); `pool`
combines them (the pooled variance of groups with counts n_i, means m_i and
variances v_i is `sum n_i (v_i + (m_i - m)^2) / sum n_i`, m the pooled mean), in
float64 on the host. NaN, as per step, when the window's returns do not vary
(`losses.value.MIN_RETURN_VARIANCE`).

The window holds the steps this process trained: a resumed run starts it afresh.
`experiments.critic` pools a run's steps after its critic warm-up the same way.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable, Mapping

from sao_jax.losses.value import MIN_RETURN_VARIANCE

WINDOW_STEPS = 20  # steps pooled by the running window (about two paper warm-ups)
# The per-step keys a window pools; a row without every one (no critic) is skipped.
MOMENT_KEYS = ("tokens/action", "value/bias", "value/return_mean", "value/return_var",
               "value/residual_var")
EV_WINDOW, BIAS_WINDOW = "value/explained_variance_window", "value/bias_window"


def pool(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
  """Explained variance and bias over the action tokens of all `rows` (per-step
  metrics holding `MOMENT_KEYS`; others are skipped): `{"explained_variance",
  "bias", "tokens"}`; NaN figures (and 0 tokens) when no row has a token."""
  groups = [(row["tokens/action"], row["value/return_mean"], row["value/return_var"],
             -row["value/bias"], row["value/residual_var"]) for row in rows
            if all(key in row for key in MOMENT_KEYS) and row["tokens/action"] > 0]
  total = sum(n for n, *_ in groups)
  if not total:
    return {"explained_variance": math.nan, "bias": math.nan, "tokens": 0.0}

  def pooled_var(mean_at: int, var_at: int) -> tuple[float, float]:
    mean = sum(g[0] * g[mean_at] for g in groups) / total
    return mean, sum(g[0] * (g[var_at] + (g[mean_at] - mean) ** 2) for g in groups) / total

  _, return_var = pooled_var(1, 2)
  residual_mean, residual_var = pooled_var(3, 4)
  ev = 1.0 - residual_var / return_var if return_var > MIN_RETURN_VARIANCE else math.nan
  return {"explained_variance": ev, "bias": -residual_mean, "tokens": float(total)}


class CriticWindow:
  """The last `steps` learner steps' critic moments; `update` adds one step's metrics
  and returns the window's figures (`EV_WINDOW`, `BIAS_WINDOW`), or {} for a step
  without a critic."""

  def __init__(self, steps: int = WINDOW_STEPS):
    self._rows: collections.deque = collections.deque(maxlen=steps)

  def update(self, metrics: Mapping[str, float]) -> dict[str, float]:
    if not all(key in metrics for key in MOMENT_KEYS):
      return {}
    self._rows.append({key: float(metrics[key]) for key in MOMENT_KEYS})
    pooled = pool(self._rows)
    return {EV_WINDOW: pooled["explained_variance"], BIAS_WINDOW: pooled["bias"]}
