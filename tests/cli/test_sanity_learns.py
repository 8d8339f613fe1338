"""RL alone lifts a policy from chance (configs/sanity_cpu.py), for every variant.

The sanity environment's warm-start teaches the answer format only, so the
sampled training reward starts at chance (~0.25, 4 words); everything above it
is RL's. Reward is the batch mean of sampled (temperature 1) episodes; start and
end are means over the first and last WINDOW policy-update steps, so one lucky
batch of 32 (standard error ~0.08) decides nothing.
"""

import dataclasses
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.jobs import train

ROOT = pathlib.Path(__file__).resolve().parents[2]
WINDOW = 5


def sanity_config(variant: str) -> C.Config:
  spec = importlib.util.spec_from_file_location("sanity_cpu", ROOT / "configs" / "sanity_cpu.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.sanity_config(variant)


def training_rewards(cfg: C.Config, run_dir: pathlib.Path) -> np.ndarray:
  """reward/mean of every step that updated the policy, in order."""
  cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, run_dir=str(run_dir)))
  summary = train.run(cfg)
  assert summary["steps_done"] == cfg.learner.steps
  rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  return np.array([r["reward/mean"] for r in rows if r.get("policy/updated") == 1.0])


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(C.VARIANTS))
def test_rl_alone_lifts_the_sampled_reward(variant, tmp_path):
  rewards = training_rewards(sanity_config(variant), tmp_path)
  start, end = rewards[:WINDOW].mean(), rewards[-WINDOW:].mean()
  assert start <= 0.45, rewards  # the warm-start is at chance, not already trained
  assert end >= 0.9 or end - start >= 0.5, rewards


def test_sanity_smoke_sao_learns(tmp_path):
  """The default suite's fast version: SAO, fewer steps, a weaker bar that still
  fails when learning is broken (chance is 0.25)."""
  cfg = sanity_config("sao")
  cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, steps=SMOKE_STEPS))
  rewards = training_rewards(cfg, tmp_path)
  assert rewards[-WINDOW:].mean() >= rewards[:WINDOW].mean() + 0.25, rewards


SMOKE_STEPS = 20


@pytest.mark.slow
def test_centring_and_lr_warmup_keep_the_first_updates_from_flattening_the_policy(tmp_path):
  """The drift setting of experiments/drift.py (replies of up to 4 tokens), seed 1:
  plain SAO's first Adam updates flatten the policy (peak entropy over its first
  4 updates 5.9 nats, uniform over the vocabulary being 5.95), the route by which it
  then collapses; with centred advantages and a 10-step learning-rate warm-up they
  keep it peaked (1.05 nats) (docs/research/drift.md, drift-recheck.md: 6 of 7 plain
  runs above 4 nats, none with the remedies). Fails if either remedy stops working.

  Whether a run collapses later is not checked here: it depends on the policy lag the
  asynchronous sampler happens to give, and the same seed of the remedied arm has
  collapsed in one run and learned in the next (the study reports the rates over
  seeds). The first updates come before lag differs, and the learning rate is
  constant after the warm-up, so 10 steps give the same first updates as 60."""
  from experiments import drift
  from sao_jax.config.loading import apply_overrides

  def early_entropy(arm: str) -> float:
    cfg = apply_overrides(sanity_config("sao"), [
        *drift.SETTING, "learner.steps=10", *drift.ARMS[arm][1], "seed=1", "env.seed=1",
        f"run.run_dir={tmp_path / arm}"])
    assert train.run(cfg)["steps_done"] == 10
    return drift.early_peak(tmp_path / arm, "policy/entropy")

  plain, remedied = early_entropy("sao"), early_entropy("sao_centred_lr_warmup")
  assert plain > 4.0 and remedied < 2.0, (plain, remedied)
