"""experiments.critic: the critic's explained variance after warm-up, per run and per arm,
and the verdict "the critic did not learn" in place of "SAO lost", on synthetic runs."""

import json

import numpy as np

from experiments import critic
from experiments.runs import load_run
from sao_jax import losses
from synthetic_runs import write_run

STEPS, WARMUP = 8, 3


def _moments(values, returns):
  mask = np.ones_like(returns, bool)
  return {"tokens/action": float(mask.sum()),
          "value/bias": float(np.mean(values - returns)),
          "value/explained_variance": float(losses.explained_variance(values, returns, mask)),
          **{f"value/{k}": float(v) for k, v in
             losses.critic_moments(values, returns, mask).items()}}


def _run(tmp_path, seed, noise, *, moments=True):
  """A run whose critic is garbage during warm-up, then V = G + noise * N(0, 1)."""
  rng = np.random.default_rng(seed)
  rows, batches = [], []
  for step in range(STEPS):
    returns = (rng.random((4, 16)) * (1 + step)).astype(np.float32)
    scale = 10.0 if step < WARMUP else noise
    values = (returns + scale * rng.normal(size=returns.shape)).astype(np.float32)
    rows.append(_moments(values, returns))
    batches.append((values, returns))
  keys = rows[0] if moments else ["value/explained_variance"]
  rel = write_run(tmp_path, "rollout_bound", "sao", seed, [0.1] * STEPS,
                  extra={k: [row[k] for row in rows] for k in keys})
  config_path = tmp_path / rel / "config.json"
  config = json.loads(config_path.read_text())
  config["learner"].update(critic_warmup_steps=WARMUP - 1, value_pretrain_steps=1)
  config_path.write_text(json.dumps(config))
  return load_run(tmp_path / rel), batches, rows


def test_a_runs_figure_pools_its_tokens_after_warm_up(tmp_path):
  run, batches, _ = _run(tmp_path, 0, noise=0.5)
  assert run.value_only_steps == WARMUP
  g = np.concatenate([r.ravel() for _, r in batches[WARMUP:]]).astype(np.float64)
  v = np.concatenate([v.ravel() for v, _ in batches[WARMUP:]]).astype(np.float64)
  value, basis = critic.run_explained_variance(run)
  np.testing.assert_allclose(value, 1 - np.var(g - v) / np.var(g), rtol=1e-5)
  assert basis == critic.POOLED


def test_a_run_without_the_moments_falls_back_to_the_median_per_step_figure(tmp_path):
  run, _, rows = _run(tmp_path, 1, noise=0.5, moments=False)
  value, basis = critic.run_explained_variance(run)
  np.testing.assert_allclose(
      value, np.median([row["value/explained_variance"] for row in rows[WARMUP:]]), rtol=1e-6)
  assert basis == critic.MEDIAN


def test_a_loss_with_a_critic_that_did_not_learn_says_so(tmp_path):
  # V = G + N(0, 2^2) against returns of variance ~(1 + step)^2 / 12: explained variance < 0.
  bad = [_run(tmp_path / f"bad{s}", s, noise=2.0)[0] for s in range(3)]
  good = [_run(tmp_path / f"good{s}", s, noise=0.05)[0] for s in range(3)]
  failed, passed = critic.critic_check(bad, threshold=0.3), critic.critic_check(good, 0.3)
  assert not failed.learned and passed.learned
  assert "BELOW the threshold 0.3" in failed.text and ">= the threshold 0.3" in passed.text
  assert critic.verdict_text("not supported", failed).startswith("the critic did not learn")
  assert critic.verdict_text("not supported", passed) == "not supported"
  # A win for SAO, or a setting that failed, is reported as registered.
  assert critic.verdict_text("supported", failed) == "supported"
  assert critic.verdict_text("setting failed", failed) == "setting failed"
  assert not critic.critic_check([], 0.3).learned
