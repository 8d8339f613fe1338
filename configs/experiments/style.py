"""Claim 5 of docs/algorithm.md §7 at small scale: re-aligning after preference switches.

    .venv/bin/python -m experiments.claim5_realignment --seeds 3

The style environment (reward = quality x style, rule judge): the preferred
style is academic for 50 learner steps, then cute, then chuunibyou (two
switches, 150 steps). Model and critic schedule as `configs/experiments/base.py`; the
learning rates are 5x the demo's (policy 1e-4, value 5e-4) for both variants,
as in `tool_math.py`: at the demo's 2e-5 the sampled reward did not move in 20
SAO steps, at 1e-4 it rose from ~0.2 to ~0.45 in 40. The warm-start
(`experiments.warm_start`, 300 SFT steps) teaches on-topic answers in all four
styles equally (`sao_jax.envs.style.demonstration`), so RL has to find the preferred one
and, after each switch, find the next. The experiment script applies each switch by
resuming the run from its checkpoint with the next style, so a switch lands
exactly on its learner step (an in-run schedule switches by policy version,
which trails the learner step by the critic warm-up). A run should show the
reward rising within each phase, dropping at each switch and recovering;
`docs/research/results.md` gives the steps to recover 90% of the pre-switch level.

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `learner.batch_trajectories` (16; the paper: 128): small batches for runs on a 2-core CPU.
- `learner.policy_lr` (1e-4; the paper: 1e-6) and `learner.value_lr` (5e-4, the
  paper's 5x ratio kept): learning rates scaled for a 0.36M-parameter model (the paper's are for
  billions of parameters; at 2e-5 the style task's reward did not move in 20 SAO
  steps, configs/experiments/style.py).
- `learner.critic_warmup_steps` (3; the paper: 10): base.py's, shortened for runs
  of 100-150 learner steps.
- No value pretraining (`learner.value_pretrain_steps` 0, `LearnerConfig`'s default; the
  paper pretrains the critic on the initial policy's returns, for a count it does not give).
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

BASE = pathlib.Path(__file__).resolve().parent / "base.py"
PHASE_STEPS = 50

QUICK_OVERRIDES = ("env.style_schedule=((0, 'academic'), (2, 'cute'), (4, 'chuunibyou'))",
                   "learner.steps=6", "learner.critic_warmup_steps=1", "run.sft_steps=10",
                   "run.sft_batch=8", "run.eval_every=2", "run.eval_episodes=8",
                   "checkpoint.save_every_steps=2")


def get_config() -> Config:
  base = load_config(BASE)
  schedule = ((0, "academic"), (PHASE_STEPS, "cute"), (2 * PHASE_STEPS, "chuunibyou"))
  return dataclasses.replace(
      base, name="exp_style",
      env=dataclasses.replace(base.env, name="style", style_schedule=schedule),
      data=dataclasses.replace(base.data, length_buckets=(192, 256)),
      sampler=dataclasses.replace(base.sampler, max_seq_len=256, prefill_buckets=(32, 128),
                                  max_new_tokens=128),
      learner=dataclasses.replace(base.learner, steps=3 * PHASE_STEPS, policy_lr=1e-4,
                                  value_lr=5e-4),
      run=dataclasses.replace(base.run, run_dir="runs/exp_style", sft_steps=300, sft_batch=16,
                              eval_every=PHASE_STEPS, eval_episodes=32),
      checkpoint=dataclasses.replace(base.checkpoint, save_every_steps=25))
