"""Claim 6 of SAO.md §7 at small scale: a long (1000-step) run of SAO and of GRPO.

    .venv/bin/python -m experiments.claim6_stability --seeds 3

`configs/experiments/tool_math.py` (same model, learning rates and sampler) on
that setting's first version, where its runs were made: mixed arithmetic and
word problems, a fixed 300-step warm-start (no accuracy target), trained for
1000 learner steps (16,000 trajectories per run), evaluated every 100 steps,
checkpointed every 50 so a killed run loses little. The report plots reward,
KL to the behavior policy, entropy, policy and value gradient norms, DIS mask
fractions, PPO clip fraction and value explained variance, and counts runs
whose reward collapses (trailing mean ending below half its best). A stable
run keeps its reward and shows no growth in KL or gradient norms.
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

BASE = pathlib.Path(__file__).resolve().parent / "tool_math.py"

QUICK_OVERRIDES = ("learner.steps=6", "learner.critic_warmup_steps=1", "run.sft_steps=10",
                   "run.sft_batch=8", "run.eval_every=6", "run.eval_episodes=8",
                   "checkpoint.save_every_steps=3")


def get_config() -> Config:
  base = load_config(BASE)
  return dataclasses.replace(
      base, name="exp_stability",
      env=dataclasses.replace(base.env, problem_kind="mixed"),
      learner=dataclasses.replace(base.learner, steps=1000),
      run=dataclasses.replace(base.run, run_dir="runs/exp_stability", eval_every=100,
                              sft_target_accuracy=0.0, sft_check_every=25),
      checkpoint=dataclasses.replace(base.checkpoint, save_every_steps=50))
