"""E3 (issue #50): its registered verdict rules and measures, on synthetic runs."""

import importlib.util

import numpy as np

from experiments import e3_wall_clock as e3
from experiments import runner
from synthetic_runs import write_manifest, write_run

STEPS = 100  # 3 s a step: 300 s, the budget


def _rows(rewards, *, idle, ev=None):
  steps = len(rewards)
  extra = {"time/elapsed_s": 3.0 * (np.arange(steps) + 1),
           "learner/idle_frac_total": np.full(steps, idle),
           "data/trajectories_total": 16.0 * (np.arange(steps) + 1)}
  if ev is not None:
    extra["value/explained_variance"] = np.full(steps, ev)
  return extra


def _e3(out, gains, *, idle=0.7, ev=0.5, base=0.3):
  """Seed k: GRPO's reward is `base` throughout; SAO's is `base` over the first 80 steps
  (240 s) and `base + gains[k]` over the last 20 (the last 60 s of the budget)."""
  runs = {"sao": {}, "grpo": {}}
  for seed, gain in enumerate(gains):
    sao = np.full(STEPS, base)
    sao[80:] += gain
    runs["sao"][str(seed)] = write_run(out, "rollout_bound", "sao", seed, sao.tolist(),
                                       extra=_rows(sao, idle=idle, ev=ev))
    grpo = np.full(STEPS, base)
    runs["grpo"][str(seed)] = write_run(out, "rollout_bound", "grpo", seed, grpo.tolist(),
                                        extra=_rows(grpo, idle=idle))
  write_manifest(out, e3.EXPERIMENT.name, "rollout_bound", runs, steps=STEPS)


def test_the_primary_is_the_reward_over_the_last_60_seconds_of_the_budget(tmp_path):
  _e3(tmp_path, [0.2])
  sao = e3.load_groups(tmp_path)["sao"][0]
  # Steps 80..99 end at 243 s .. 300 s: exactly the 20 steps after 240 s.
  assert np.isclose(e3.primary(sao), 0.5)
  assert np.isclose(e3.start_reward(sao), 0.3)
  # Trajectories consumed 16 .. 1600; the second half of 1600 is steps 50..99.
  assert np.isclose(e3.reward_per_trajectory(sao, 1600.0), (30 * 0.3 + 20 * 0.5) / 50)
  assert e3.idle_fraction(sao) == 0.7


def test_supported_when_sao_wins_on_every_seed(tmp_path):
  _e3(tmp_path, [0.01 * (k + 1) for k in range(8)])
  text = e3.report(tmp_path, tmp_path / "e3.md")
  # All 8 differences positive and distinct: exact one-sided p = 1 / 2**8.
  assert "budget): supported.**" in text
  assert f"signed-rank p = {1 / 256:.4f}" in text
  assert "(a) GRPO's learner idle fraction over the run, median over 8 seeds 0.70 (>=" in text
  assert (tmp_path / "results" / e3.PLOT).is_file()


def test_setting_failed_when_the_learner_did_not_wait_on_rollouts(tmp_path):
  _e3(tmp_path, [0.1] * 8, idle=0.2)
  text = e3.report(tmp_path, tmp_path / "e3.md")
  assert "budget): setting failed.**" in text
  assert "0.20 (BELOW the registered 0.5: the setting is NOT rollout-bound)" in text


def test_a_loss_with_a_critic_that_did_not_learn_says_so(tmp_path):
  _e3(tmp_path, [-0.01 * (k + 1) for k in range(8)], ev=0.1)
  text = e3.report(tmp_path, tmp_path / "e3.md")
  assert "the critic did not learn (not: SAO lost; registered outcome not supported)" in text


def test_fewer_than_the_registered_seeds_is_incomplete(tmp_path):
  _e3(tmp_path, [0.1, 0.2, 0.3])
  assert "budget): incomplete (3 of 8 seeds).**" in e3.report(tmp_path, tmp_path / "e3.md")


def test_the_pilot_takes_each_arms_best_lr_and_the_smaller_on_a_tie():
  results = {"sao": {3e-5: 0.2, 1e-4: 0.4, 3e-4: 0.4}, "grpo": {3e-5: 0.5, 1e-4: 0.1,
                                                                 3e-4: 0.3}}
  assert e3.pilot_choice(results) == {"sao": 1e-4, "grpo": 3e-5}


def test_the_registered_budget_is_the_settings():
  path = runner.setting_path(e3.EXPERIMENT.setting)
  spec = importlib.util.spec_from_file_location("rollout_bound", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.BUDGET_S == e3.BUDGET_S
  assert module.get_config().run.max_wall_s == e3.BUDGET_S


def test_reward_is_binned_by_seconds_and_by_trajectories(tmp_path):
  from experiments import plots
  _e3(tmp_path, [0.2])
  sao = e3.load_groups(tmp_path)["sao"][0]
  # 3 s a step: a 60 s bin holds 20 steps; steps 80..99 (elapsed 243..300) carry +0.2.
  assert np.allclose(plots.binned(sao, "time/elapsed_s", 60.0, 300.0),
                     [0.3, 0.3, 0.3, 0.3, 0.5])
  # 16 trajectories a step: a 400-trajectory bin holds 25 steps.
  assert np.allclose(plots.binned(sao, "data/trajectories_total", 400.0, 1600.0),
                     [0.3, 0.3, 0.3, (5 * 0.3 + 20 * 0.5) / 25])
