"""E3 (issue #50): a rollout-bound, long-tailed setting, judged by wall-clock.

    nice -n 0 .venv/bin/python -m experiments.e3_wall_clock --seeds 8 \\
        --out /work/exp_runs/e3

The CPU demo's task and model (`configs/demo_cpu.py`: tool-integrated arithmetic, a
0.36M-parameter Qwen3-style model, its 400 x 32 SFT warm-start with half the
demonstrations from the careless expert, batch 16 trajectories), put where the paper
says single rollouts win: every environment step returns after a log-normal delay
(median `LATENCY_MEDIAN_S`, sigma `LATENCY_SIGMA`, cut at `LATENCY_MAX_S`; the step
thread sleeps, no CPU), a share of hard tasks (`HARD_SHARE` at difficulty
`HARD_DIFFICULTY`: a task's value differs by prompt, and GRPO's all-fail groups
gather on the hard ones), up to `MAX_TURNS` assistant turns, and `SLOTS` sampler
slots, so that the learner waits on rollouts (`learner/idle_frac`), not the reverse.
Each run stops at a wall-clock budget of `BUDGET_S` seconds (`run.max_wall_s`), not
at a step count (`learner.steps` is set far beyond what the budget reaches). No
held-out evaluation during the run: it would spend the budget; the primary measure
is the sampled training reward.

The critic is the paper's: value lr 5 x the policy's (`learner.value_lr` None), 10
value-only warm-up steps, `VALUE_PRETRAIN_STEPS` value-pretraining steps on the
initial policy's rollouts, and no lr warm-up. The algorithm section is set per
variant by the experiment (`sao` and `grpo`, the paper's); the policy lr per arm by
the registered pilot (experiments/e3_wall_clock.py).

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `learner.batch_trajectories` (16; the paper: 128): the CPU demo's, so that a step
  takes a second or two on a 2-core machine.
- `learner.policy_lr` (the pilot's choice per arm; the paper: 1e-6): a 0.36M-parameter
  model trained for minutes needs a far larger step than a 30B one trained for days.
- `learner.value_pretrain_steps` (5; the paper names no count): enough value-only
  steps on the initial policy's rollouts to move a fresh value head off zero, few
  enough to leave most of the budget to RL.
"""

import dataclasses
import pathlib

from sao_jax.config import AlgorithmConfig, Config, load_config
from sao_jax.config.env import StepLatency

DEMO = pathlib.Path(__file__).resolve().parents[1] / "demo_cpu.py"
BUDGET_S = 300.0
LATENCY_MEDIAN_S, LATENCY_SIGMA, LATENCY_MAX_S = 1.0, 1.0, 10.0
HARD_SHARE, HARD_DIFFICULTY = 0.3, 3
MAX_TURNS = 4
BATCH = 8  # one GRPO group of 8 (the paper's group size) per step
SLOTS = 8
VALUE_PRETRAIN_STEPS = 5
POLICY_LR = 1e-4  # the setting's default; each arm's is the pilot's choice
STEPS_CEILING = 100_000  # never reached: the wall-clock budget ends every run

QUICK_OVERRIDES = ("run.max_wall_s=40", "learner.value_pretrain_steps=1",
                   "learner.critic_warmup_steps=1", "run.sft_steps=10", "run.sft_batch=8",
                   "checkpoint.save_every_steps=2")


def get_config() -> Config:
  base = load_config(DEMO)
  return dataclasses.replace(
      base, name="exp_rollout_bound", algorithm=AlgorithmConfig.for_variant("sao"),
      env=dataclasses.replace(
          base.env, max_turns=MAX_TURNS,
          latency=StepLatency(kind="lognormal", median_s=LATENCY_MEDIAN_S,
                              sigma=LATENCY_SIGMA, max_s=LATENCY_MAX_S),
          options={**base.env.options, "hard_share": HARD_SHARE,
                   "hard_difficulty": HARD_DIFFICULTY}),
      learner=dataclasses.replace(base.learner, steps=STEPS_CEILING, policy_lr=POLICY_LR,
                                  batch_trajectories=BATCH,
                                  value_lr=None, lr_warmup_steps=0, critic_warmup_steps=10,
                                  value_pretrain_steps=VALUE_PRETRAIN_STEPS),
      sampler=dataclasses.replace(base.sampler, slots=SLOTS),
      run=dataclasses.replace(base.run, run_dir="runs/exp_rollout_bound", max_wall_s=BUDGET_S,
                              eval_every=0),
      checkpoint=dataclasses.replace(base.checkpoint, save_every_steps=50))
