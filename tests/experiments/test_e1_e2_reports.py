"""E1 and E2 (issue #38): their registered verdict rules, on synthetic runs."""

import pathlib

import numpy as np
import pytest

from experiments import e1_paper
from experiments import e1_single_vs_group as e1
from experiments import e2_paper_stability as e2
from synthetic_runs import write_manifest, write_run


def _e2(out, collapses, *, seeds=8, start=0.25, steps=60):
  """`collapses[variant]` of the seeds fall to reward 0 from step 40; the rest learn to 1."""
  runs = {}
  for variant in e2.EXPERIMENT.variants:
    for seed in range(seeds):
      rewards = np.concatenate([np.full(5, start), np.linspace(start, 1.0, steps - 5)])
      if seed < collapses[variant]:
        rewards[40:] = 0.0
      runs.setdefault(variant, {})[str(seed)] = write_run(
          out, "sanity_long", variant, seed, rewards.tolist())
  write_manifest(out, e2.EXPERIMENT.name, "sanity_long", runs, steps=steps)


def test_e2_supported_when_sao_collapses_significantly_less(tmp_path):
  _e2(tmp_path, {"sao": 0, "grpo": 6, "grpo_dis": 2})
  text = e2.report(tmp_path)
  # One-sided Fisher, 0 of 8 vs 6 of 8: C(8,6) / C(16,6) = 28 / 8008 = 0.0035.
  assert "**Verdict (paper SAO collapses less than the paper's GRPO): supported.**" in text
  assert f"collapses less than `grpo`: p = {28 / 8008:.4f} (primary)." in text
  # 0 of 8: Clopper-Pearson 95% upper bound 1 - 0.025 ** (1 / 8).
  assert f"`sao` collapsed in 0 of 8 seeds (95% Clopper-Pearson 0.000-{1 - 0.025 ** 0.125:.3f})" \
      in text
  # Reward 0 from step 40: the trailing 5-step mean is 0 first at step 44.
  assert "| `grpo` | 8 | 6 (0.35-0.97) | 44, 44, 44, 44, 44, 44 | 2 |" in text
  assert "registration commit:" in text


def test_e2_not_supported_without_a_significant_difference(tmp_path):
  _e2(tmp_path, {"sao": 3, "grpo": 4, "grpo_dis": 4})
  assert "GRPO): not supported.**" in e2.report(tmp_path)


def test_e2_with_fewer_than_the_registered_seeds_is_incomplete(tmp_path):
  _e2(tmp_path, {"sao": 0, "grpo": 3, "grpo_dis": 3}, seeds=3)
  assert "GRPO): incomplete (3 of 8 seeds).**" in e2.report(tmp_path)


def test_e2_setting_failed_when_runs_start_below_the_collapse_line(tmp_path):
  _e2(tmp_path, {"sao": 0, "grpo": 8, "grpo_dis": 8}, start=0.05)
  text = e2.report(tmp_path)
  assert "GRPO): setting failed.** Manipulation check failed: the mean training reward" in text


def test_e2_without_runs_is_not_tested(tmp_path):
  assert "GRPO): not tested.** No run has finished." in e2.report(tmp_path)


def _e1(out, gain, *, seeds=10, start=0.1, all_equal=0.8, skip=0.3, ev=0.5, design=e1.E1):
  """SAO's reward rises by `gain[seed]` more than GRPO's over the run (same start)."""
  runs, steps = {}, 40
  for variant in design.experiment.variants:
    for seed in range(seeds):
      extra_gain = gain[seed] if variant == design.subject else 0.0
      rewards = np.concatenate([np.full(5, start),
                                np.linspace(start, start + 0.2 + 2 * extra_gain, steps - 5)])
      extra = ({"advantage/zero_traj_frac": np.full(steps, all_equal)} if variant == "grpo"
               else {"policy/no_contrast_skip": (np.arange(steps) < skip * steps),
                     "value/explained_variance": np.full(steps, ev)})
      runs.setdefault(variant, {})[str(seed)] = write_run(
          out, "weak_start", variant, seed, rewards.tolist(), extra=extra,
          accuracies=[0.0, 0.1], eval_every=steps)
  write_manifest(out, design.experiment.name, "weak_start", runs, steps=steps)


def _verdict(text):
  return text.split("trajectories per step): ")[1].split(".**")[0]


def test_e1_supported_when_sao_gains_on_every_seed(tmp_path):
  _e1(tmp_path, [0.01 * (s + 1) for s in range(10)])
  text = e1.report(tmp_path)
  assert _verdict(text) == "supported"
  # Ten positive, distinct differences: the exact one-sided p is 1 / 2 ** 10.
  assert f"signed-rank p = {1 / 1024:.4f}" in text
  assert "Manipulation check passed: (a) warm-start reward over the first 5 steps 0.100" in text
  assert "| `sao_centered_gated` | 10 |" in text and "0.300 ± 0.000 |" in text  # gate skips
  # Per seed, each run's mean lag: the synthetic histogram puts half the batch at lag 0
  # and half at lag 1.
  assert "| difference | lag `sao_centered_gated` | lag `grpo` |" in text
  # Seed 0: SAO (5 x 0.1 + 35 steps from 0.1 to 0.32) / 40 = 0.196, GRPO (to 0.3) 0.1875.
  assert "| 0 | 0.196 | 0.188 | +0.009 | 0.50 | 0.50 |" in text


def test_e1_not_supported_states_what_it_could_detect(tmp_path):
  rng = np.random.default_rng(1)
  _e1(tmp_path, list(rng.normal(0.0, 0.05, 10)))
  text = e1.report(tmp_path)
  assert _verdict(text) == "not supported"
  assert "minimum detectable difference at 80% power" in text


@pytest.mark.parametrize("ev,reads", [(0.1, "the critic did not learn"),
                                      (0.5, "not supported")])
def test_e1_states_its_setting_and_whether_the_critic_learned(tmp_path, ev, reads):
  """Beside the registered verdict (unchanged), the setting from the runs' configs and
  the critic check added after the registration."""
  _e1(tmp_path, list(np.random.default_rng(1).normal(0.0, 0.05, 10)), ev=ev)
  text = e1.report(tmp_path)
  assert _verdict(text) == "not supported"
  assert ("The result holds for: `sao_centered_gated` (centred advantages and the contrast "
          "gate: not the paper's `sao`) with policy lr 1e-4 (no lr warm-up), critic lr 5e-4 "
          "(5x the policy's; the paper: 5x), 0 value pretraining steps, 0 critic warm-up steps "
          "(the paper: 10); `grpo` with policy lr 1e-4 (no lr warm-up); compared per learner "
          "step at equal trajectories per step (not wall-clock)") in text
  assert f"median over 10 seeds {ev:.2f} ({'BELOW' if ev < 0.3 else '>='} the threshold 0.3)" \
      in text
  assert f"By this check the verdict reads: **{reads}" in text


def test_e1_with_fewer_than_ten_seeds_is_incomplete(tmp_path):
  _e1(tmp_path, [0.05] * 4, seeds=4)
  assert _verdict(e1.report(tmp_path)) == "incomplete (4 of 10 seeds)"


@pytest.mark.parametrize("start,all_equal,what", [
    (0.5, 0.8, "OUTSIDE the registered"),  # not a weak start
    (0.1, 0.2, "BELOW 0.5"),  # GRPO's groups mostly have contrast: the contrast is moot
])
def test_e1_setting_failed_when_its_manipulation_check_fails(tmp_path, start, all_equal, what):
  _e1(tmp_path, [0.05] * 10, start=start, all_equal=all_equal)
  text = e1.report(tmp_path)
  assert _verdict(text) == "setting failed" and what in text


def test_e2_setting_is_the_drift_study_at_1000_steps_without_remedies():
  from experiments import runner
  from sao_jax.config import load_config
  cfg = load_config(runner.setting_path("sanity_long"))
  assert (cfg.sampler.max_new_tokens, cfg.run.sft_steps, cfg.learner.steps,
          cfg.learner.policy_lr, cfg.learner.lr_warmup_steps) == (4, 60, 1000, 3e-3, 0)
  for name in e2.EXPERIMENT.variants:  # each variant's preset, nothing else
    resolved = load_config(runner.setting_path("sanity_long"), runner.variant_overrides(
        cfg, e2.claims_lib.VARIANTS[name]))
    assert resolved.algorithm.advantage_centering == "none"
    assert not resolved.algorithm.require_reward_contrast


def test_e1_setting_compares_the_stable_sao_with_grpo_at_equal_trajectories():
  from experiments import runner
  from sao_jax.config import load_config
  cfg = load_config(runner.setting_path("weak_start"))
  assert cfg.env.options["demo_guess_rate"] > 0.5 and cfg.run.eval_episodes >= 256
  sao, grpo = (load_config(runner.setting_path("weak_start"), runner.variant_overrides(
      cfg, e1.claims_lib.VARIANTS[name])) for name in e1.EXPERIMENT.variants)
  assert sao.algorithm.variant == "sao_centered_gated" and grpo.algorithm.variant == "grpo"
  assert sao.learner == grpo.learner  # same trajectories per step, lr and schedule
  assert grpo.algorithm.group_size == 8 and grpo.learner.batch_trajectories % 8 == 0


@pytest.mark.parametrize("ev,reads", [
    (0.1, "the critic did not learn (not: SAO lost; registered outcome not supported)"),
    (0.5, "not supported")])
def test_e1_paper_registers_the_critic_check_in_its_verdict(tmp_path, ev, reads):
  """E1-paper: E1's rules, with the critic check registered: a loss with a critic below
  0.3 reads "the critic did not learn" in the verdict itself, not beside it."""
  _e1(tmp_path, list(np.random.default_rng(1).normal(0.0, 0.05, 10)), ev=ev,
      design=e1_paper.DESIGN)
  text = e1.report(tmp_path, tmp_path / "e1_paper.md", e1_paper.DESIGN)
  assert text.startswith("# E1-paper: the paper's SAO where groups fail (issue #50)")
  assert _verdict(text) == reads
  assert "Critic check (registered, sao_paper_critic): the critic's explained variance" in text
  assert "`experiments/e1_paper.py` (registration commit:" in text


def test_e1_paper_runs_the_papers_critic_schedule_and_e1s_grpo():
  from experiments import claims, runner
  from sao_jax.jobs import startup
  path = runner.setting_path("weak_start")
  base = startup.load(path, [])
  learners = {}
  for name in e1_paper.EXPERIMENT.variants:
    overrides = runner.run_overrides(base, [], claims.VARIANTS[name],
                                     pathlib.Path("/warm"), pathlib.Path("/run"))
    learners[name] = startup.load(path, [o for o in overrides if not o.startswith("run.")])
  sao, grpo = learners["sao_paper_critic"], learners["grpo"]
  assert (sao.algorithm.advantage_centering, sao.algorithm.require_reward_contrast) == (
      "none", False)
  assert (sao.learner.critic_lr, sao.learner.critic_warmup_steps,
          sao.learner.value_pretrain_steps, sao.learner.lr_warmup_steps) == (5e-4, 10, 5, 0)
  assert grpo.learner == base.learner and grpo.algorithm.group_size == 8
