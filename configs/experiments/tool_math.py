"""Claims 1-4 of SAO.md §7 at small scale: multi-turn tool-integrated math (generated tasks).

    .venv/bin/python -m experiments.claim1_ordering --seeds 3     # every variant and seed
    .venv/bin/sao-train --config configs/experiments/tool_math.py  # one SAO run, SFT included

`configs/demo_cpu.py` (same 0.36M-parameter model, sampler, critic schedule)
with word problems mixed in and a smaller warm-start (300 SFT steps of 16
demonstrations instead of 32), so the starting policy (held-out accuracy ~0.25)
is not at the demo's ceiling (~0.86). Learning rates are 5x the demo's (policy
1e-4, value 5e-4) for every variant: from this start, at the demo's 2e-5 no
variant's reward or accuracy moved in 60 steps (KL to the behavior policy
~1e-4).
An episode is two action turns around an observation (a python block, the
tool's output, the boxed answer), so skip-observation GAE and plain GAE differ.

The experiment scripts (`experiments/`) run the SFT warm-start once per seed
(`experiments.warm_start`) and start every variant of that seed from it
(`run.init`, `run.tokenizer`, `run.sft_steps=0`): same model, tokenizer and
initial weights. Sample budget: every variant trains `learner.steps` batches of
`learner.batch_trajectories` trajectories (1,600 here); a GRPO batch holds
16 / 8 = 2 prompt groups, an SAO batch 16 prompts. A run should show held-out
accuracy (64 greedy episodes, every 25 steps) rising from its step-0 value.
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

BASE = pathlib.Path(__file__).resolve().parents[1] / "demo_cpu.py"

# `--quick` in the experiment scripts: a pipeline check, not a measurement.
QUICK_OVERRIDES = ("learner.steps=4", "learner.critic_warmup_steps=1", "run.sft_steps=10",
                   "run.sft_batch=8", "run.eval_every=4", "run.eval_episodes=8",
                   "checkpoint.save_every_steps=2")


def get_config() -> Config:
  base = load_config(BASE)
  return dataclasses.replace(
      base, name="exp_tool_math",
      env=dataclasses.replace(base.env, difficulty=1, problem_kind="mixed", max_turns=3),
      learner=dataclasses.replace(base.learner, steps=100, policy_lr=1e-4, value_lr=5e-4),
      run=dataclasses.replace(base.run, run_dir="runs/exp_tool_math", sft_steps=300,
                              sft_batch=16, eval_every=25, eval_episodes=64),
      checkpoint=dataclasses.replace(base.checkpoint, save_every_steps=25))
