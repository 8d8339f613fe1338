"""The critic's explained variance and bias over a window of steps (sao_jax.run.critic_window):
pooled from each step's moments, they equal the figures over the window's tokens as one
batch (not the mean of the steps' figures); and the progress line shows them."""

import math

import numpy as np

from sao_jax import losses
from sao_jax.run import critic_window
from sao_jax.run.metrics import MetricsLogger


def _step_metrics(values, returns, mask):
  """What the learner step logs for one batch (sao_jax.learner.step)."""
  moments = losses.critic_moments(values, returns, mask)
  return {"tokens/action": float(mask.sum()),
          "value/bias": float(losses.aggregate.masked_mean(values - returns, mask)),
          **{f"value/{k}": float(v) for k, v in moments.items()}}


def _batches(count, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(count):
    # Steps differ in their returns' level and in the critic's error, so that the pooled
    # figure and the mean of the steps' figures differ.
    returns = (rng.normal(size=(2, 30)) * (1 + i) + i).astype(np.float32)
    values = (returns + rng.normal(size=(2, 30)) * 0.5 + 0.2 * i).astype(np.float32)
    out.append((values, returns, rng.random((2, 30)) < 0.6))
  return out


def _by_hand(batches):
  g = np.concatenate([r[m] for _, r, m in batches]).astype(np.float64)
  v = np.concatenate([v[m] for v, _, m in batches]).astype(np.float64)
  return 1 - np.var(g - v) / np.var(g), np.mean(v - g)


def test_the_step_moments_match_a_hand_computation_on_action_tokens():
  [(values, returns, mask)] = _batches(1)
  metrics = _step_metrics(values, returns, mask)
  g, v = returns[mask].astype(np.float64), values[mask].astype(np.float64)
  np.testing.assert_allclose(metrics["value/return_mean"], g.mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["value/return_var"], np.var(g), rtol=1e-5)
  np.testing.assert_allclose(metrics["value/residual_var"], np.var(g - v), rtol=1e-5)
  np.testing.assert_allclose(metrics["value/bias"], np.mean(v - g), rtol=1e-5, atol=1e-6)


def test_a_window_pools_its_steps_as_one_batch_not_the_mean_of_their_figures():
  batches = _batches(5)
  rows = [_step_metrics(*b) for b in batches]
  pooled = critic_window.pool(rows)
  ev, bias = _by_hand(batches)
  np.testing.assert_allclose(pooled["explained_variance"], ev, rtol=1e-5)
  np.testing.assert_allclose(pooled["bias"], bias, rtol=1e-5)
  assert pooled["tokens"] == sum(m.sum() for _, _, m in batches)
  mean_of_steps = np.mean([float(losses.explained_variance(*b)) for b in batches])
  assert abs(mean_of_steps - ev) > 0.05  # the shortcut would have been wrong here


def test_the_running_window_keeps_the_last_steps_and_skips_steps_without_a_critic():
  batches = _batches(5, seed=1)
  window = critic_window.CriticWindow(steps=3)
  assert window.update({"reward/mean": 0.5, "tokens/action": 10.0}) == {}  # grpo: no critic
  for b in batches:
    out = window.update(_step_metrics(*b))
  ev, bias = _by_hand(batches[-3:])
  np.testing.assert_allclose(out[critic_window.EV_WINDOW], ev, rtol=1e-5)
  np.testing.assert_allclose(out[critic_window.BIAS_WINDOW], bias, rtol=1e-5)


def test_a_window_whose_returns_do_not_vary_has_no_explained_variance():
  values = np.array([[0.1, 0.3, 0.0]], np.float32)
  returns = np.zeros((1, 3), np.float32)
  pooled = critic_window.pool([_step_metrics(values, returns, np.ones((1, 3), bool))] * 2)
  assert math.isnan(pooled["explained_variance"])
  np.testing.assert_allclose(pooled["bias"], 0.4 / 3, rtol=1e-6)
  assert math.isnan(critic_window.pool([])["bias"])


def test_the_progress_line_shows_the_windowed_critic(tmp_path):
  logger = MetricsLogger(tmp_path, total_steps=10, loggers=())
  line = logger.progress(0, {"reward/mean": 0.5, critic_window.EV_WINDOW: 0.314,
                             critic_window.BIAS_WINDOW: -0.052})
  assert "| critic EV 0.31 bias -0.05 |" in line
  line = logger.progress(1, {"reward/mean": 0.5, critic_window.EV_WINDOW: math.nan,
                             critic_window.BIAS_WINDOW: 0.0})
  assert "| critic EV -- bias +0.00 |" in line
  assert "critic" not in logger.progress(2, {"reward/mean": 0.5})  # grpo
  logger.close()
