"""E1 (issue #38): a weak warm-start where GRPO's groups mostly fail.

    nice -n 19 .venv/bin/python -m experiments.e1_single_vs_group --seeds 10 --jobs 1 \\
        --out /work/exp_runs/e1

The CPU demo's task and model (`configs/demo_cpu.py`: tool-integrated
arithmetic, difficulty 1, up to 3 turns, a 0.36M-parameter Qwen3-style
model, batch 16 trajectories, policy lr 1e-4 with a 5-step lr warm-up, 3
critic warm-up steps), with most demonstrations from the careless expert who
answers at once with the question's first number (`env.options.demo_guess_rate =
GUESS_RATE`, chosen by the one-seed pilot recorded in
`experiments/e1_single_vs_group.py`), so that the warm-start calls the tool, and
so earns a reward, on only a small share of its sampled episodes: sampled
reward ~0.05-0.15, where most of GRPO's groups of 8 are all-fail and carry no
gradient. The demo's fixed 400-step SFT of 32 demonstrations a step (no accuracy
target): a first pilot with a quarter of it (200 x 16) and a guess rate of 0.875
left a policy that rarely called the tool and failed when it did (sampled reward
~0.005), where neither estimator has anything to learn from. RL for `STEPS` learner
steps; held-out greedy accuracy on 256 tasks at step 0 and at the end.
Checkpoints every 20 steps so an interrupted run resumes. The algorithm
section is set per variant by the experiment (the demo's centring is not
inherited: `sao_centered_gated` carries it, the paper's variants do not).

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `learner.batch_trajectories` (16; the paper: 128), `learner.policy_lr` (1e-4; the
  paper: 1e-6), `learner.value_lr` (1e-4: 1x the policy's, the paper 5x),
  `learner.lr_warmup_steps` (5; the paper: none) and `learner.critic_warmup_steps`
  (3; the paper: 10): the CPU demo's (configs/demo_cpu.py), registered for E1 as they
  were; E1 so did not test SAO with the paper's critic schedule.
- No value pretraining (`learner.value_pretrain_steps` 0, `LearnerConfig`'s default; the
  paper pretrains the critic on the initial policy's returns, for a count it does not give).
"""

import dataclasses
import pathlib

from sao_jax.config import AlgorithmConfig, Config, load_config

DEMO = pathlib.Path(__file__).resolve().parents[1] / "demo_cpu.py"
GUESS_RATE = 0.85
STEPS = 100
SFT_STEPS, SFT_BATCH = 400, 32

QUICK_OVERRIDES = ("learner.steps=4", "learner.critic_warmup_steps=1", "run.sft_steps=10",
                   "run.sft_batch=8", "run.eval_every=4", "run.eval_episodes=8",
                   "checkpoint.save_every_steps=2")


def get_config() -> Config:
  base = load_config(DEMO)
  return dataclasses.replace(
      base, name="exp_weak_start", algorithm=AlgorithmConfig.for_variant("sao"),
      env=dataclasses.replace(base.env,
                              options={**base.env.options, "demo_guess_rate": GUESS_RATE}),
      learner=dataclasses.replace(base.learner, steps=STEPS),
      run=dataclasses.replace(base.run, run_dir="runs/exp_weak_start", sft_steps=SFT_STEPS,
                              sft_batch=SFT_BATCH, eval_every=STEPS, eval_episodes=256),
      checkpoint=dataclasses.replace(base.checkpoint, save_every_steps=20))
