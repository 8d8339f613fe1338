"""Claim 6 of docs/algorithm.md §7 at small scale: a long (1000-step) run of SAO and of GRPO.

    .venv/bin/python -m experiments.claim6_stability --seeds 3 --jobs 2

The first version of `configs/experiments/tool_math.py`, spelled out here so that
later changes to that setting leave these runs (and their warm-starts) alone:
`configs/experiments/base.py`'s model, sampler and critic schedule on mixed arithmetic
and word problems (difficulty 1, up to 3 turns), a fixed 300-step SFT
warm-start of 16 demonstrations per step (no accuracy target), policy lr 1e-4
and value lr 5e-4, trained for 1000 learner steps (16,000 trajectories per
run), evaluated every 100 steps on 64 held-out episodes, checkpointed every 50
so a killed run loses little. The report plots reward, KL to the behavior
policy, entropy, policy and value gradient norms, DIS mask fractions, PPO clip
fraction and value explained variance, and counts runs whose reward collapses
(trailing mean ending below half its best). A stable run keeps its reward and
shows no growth in KL or gradient norms.

The runs in docs/research/results.md before the drift study (docs/research/drift-notes.md)
trained the paper's SAO here, without an lr warm-up and with the critic warm-up
of 3 steps that base.py sets; SAO collapsed on 1 of 3 seeds. Claim 6 now runs
the remedies that study chose: SAO as the `sao_stable` variant
(`experiments/claims.py`: batch-mean-centred advantages, no policy step on an
all-equal-reward batch), and for every variant a 10-step lr warm-up and the 10
critic warm-up steps docs/algorithm.md §4 gives (policy frozen while the critic fits the
warm-start's returns). The warm-starts are unchanged (they depend on the model,
task and SFT fields only).

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `learner.batch_trajectories` (16; the paper: 128): runs of an hour on a 2-core CPU.
- `learner.policy_lr` (1e-4; the paper: 1e-6) and `learner.value_lr` (5e-4, the
  paper's 5x ratio kept): learning rates scaled for a 0.36M-parameter model (the paper's are for
  billions of parameters; at 2e-5 the style task's reward did not move in 20 SAO
  steps, configs/experiments/style.py).
- `learner.lr_warmup_steps` (10; the paper: none): the drift study's remedy, above.
- No value pretraining (`learner.value_pretrain_steps` 0, `LearnerConfig`'s default; the
  paper pretrains the critic on the initial policy's returns, for a count it does not give).
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

BASE = pathlib.Path(__file__).resolve().parent / "base.py"

QUICK_OVERRIDES = ("learner.steps=6", "learner.critic_warmup_steps=1", "run.sft_steps=10",
                   "run.sft_batch=8", "run.eval_every=6", "run.eval_episodes=8",
                   "checkpoint.save_every_steps=3")


def get_config() -> Config:
  base = load_config(BASE)
  return dataclasses.replace(
      base, name="exp_stability",
      env=dataclasses.replace(base.env, difficulty=1, problem_kind="mixed", max_turns=3),
      learner=dataclasses.replace(base.learner, steps=1000, policy_lr=1e-4, value_lr=5e-4,
                                  lr_warmup_steps=10, critic_warmup_steps=10),
      run=dataclasses.replace(base.run, run_dir="runs/exp_stability", sft_steps=300,
                              sft_batch=16, eval_every=100, eval_episodes=64),
      checkpoint=dataclasses.replace(base.checkpoint, save_every_steps=50))
