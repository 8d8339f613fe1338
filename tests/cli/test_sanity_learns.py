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
def test_centred_sao_with_lr_warmup_does_not_drift_where_plain_sao_collapses(tmp_path):
  """The drift setting of experiments/drift.py (replies of up to 4 tokens), seed 1:
  plain SAO fell from chance to reward 0 by step 7 and stayed there, and so did
  SAO with centred advantages alone (its first Adam update flattened the
  policy); with centred advantages and a 10-step learning-rate warm-up the same
  seed learns (docs/research/drift.md). Fails if either remedy stops working."""
  from experiments import drift
  from sao_jax.config.loading import apply_overrides
  cfg = apply_overrides(sanity_config("sao"), [
      *drift.SETTING, f"learner.steps={drift.STEPS}", *drift.ARMS["sao_centred_lr_warmup"][1],
      "seed=1", "env.seed=1"])
  rewards = training_rewards(cfg, tmp_path)
  smooth = np.convolve(rewards, np.ones(WINDOW) / WINDOW, mode="valid")
  assert smooth.min() >= drift.COLLAPSED_BELOW, rewards
  assert rewards[-WINDOW:].mean() >= drift.LEARNED_AT, rewards
