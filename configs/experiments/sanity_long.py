"""E2 (issue #38): the drift study's 4-token sanity task, 1000 learner steps, paper semantics.

    nice -n 19 .venv/bin/python -m experiments.e2_paper_stability --seeds 8 --jobs 1 \\
        --out /work/exp_runs/e2

The setting of `experiments/drift.py` (`SETTING`, `--steps 1000`) spelled out
as a claim setting so that the claim runner's warm-starts, resume and archive
(`experiments/runner.py`, `experiments/archive.py`) carry it: the sanity task
("Answer with the word red", reward 1 iff the reply is exactly the word),
replies of up to 4 tokens, a 60-step SFT warm-start that teaches the format
only (sampled reward starts at chance, ~0.25), policy lr 3e-3, batch 32
trajectories (GRPO: 4 groups of 8), 1000 learner steps, no lr warm-up, 3 critic
warm-up steps (the sanity setting's), no held-out evaluation (the collapse
criterion reads the training reward), checkpoints every 50 steps so an
interrupted run resumes. The algorithm section is the variant's preset alone:
none of the drift study's remedies.

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `learner.batch_trajectories` (32; the paper: 128), `learner.policy_lr` (3e-3; the
  paper: 1e-6), `learner.value_lr` (1e-3: 0.33x the policy's, the paper 5x) and
  `learner.critic_warmup_steps` (3; the paper: 10): the sanity setting's
  (configs/sanity_cpu.py: a 4-token bandit that a 64-wide model learns within 40
  steps at 3e-3), which the drift study and E2 registered as they were; at this lr
  the first full-rate Adam step can flatten the policy (docs/research/drift.md), so
  E2 does not test SAO at the paper's learning rates or critic schedule.
- No value pretraining (`learner.value_pretrain_steps` 0, `LearnerConfig`'s default; the
  paper pretrains the critic on the initial policy's returns, for a count it does not give).
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

SANITY = pathlib.Path(__file__).resolve().parents[1] / "sanity_cpu.py"

QUICK_OVERRIDES = ("learner.steps=6", "learner.critic_warmup_steps=1", "run.sft_steps=10",
                   "checkpoint.save_every_steps=3")


def get_config() -> Config:
  base = load_config(SANITY)
  return dataclasses.replace(
      base, name="exp_sanity_long",
      sampler=dataclasses.replace(base.sampler, max_new_tokens=4),
      learner=dataclasses.replace(base.learner, steps=1000),
      run=dataclasses.replace(base.run, run_dir="runs/exp_sanity_long", sft_steps=60),
      checkpoint=dataclasses.replace(base.checkpoint, save_every_steps=50))
