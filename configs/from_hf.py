"""RL from any supported Hugging Face checkpoint: the model section comes from run.init.

    .venv/bin/sao-train --config configs/from_hf.py --set run.init=/path/to/Qwen3-0.6B

Sizes, heads, RoPE, vocabulary, tying, family and dtype are read from the
directory's config.json, its tokenizer and chat template from the same directory
(docs/get-started/first-real-run.md). Only the run's choices are here:
the paper's `sao` and learner (`LearnerConfig`'s defaults: policy lr 1e-6, the critic at
5x, batches of 128, 1000 steps) with the paper's critic schedule, whose value
pretraining (`learner.value_pretrain_steps`, a count the paper does not give) is the
ready model configs' `READY_VALUE_PRETRAIN_STEPS` (20, why: sao_jax/config/learner.py),
before the paper's 10 critic warm-up steps. A few steps on a tiny model need
`--set learner.value_pretrain_steps=0` (or every step is value-only).
"""

from sao_jax.config import AlgorithmConfig, Config, EnvConfig, LearnerConfig, RunConfig
from sao_jax.config.learner import READY_VALUE_PRETRAIN_STEPS


def get_config() -> Config:
  return Config(name="from_hf", algorithm=AlgorithmConfig.for_variant("sao"),
                learner=LearnerConfig(value_pretrain_steps=READY_VALUE_PRETRAIN_STEPS),
                env=EnvConfig(name="math_tool", options={"problem_kind": "arithmetic"}),
                run=RunConfig(run_dir="runs/from_hf", sft_steps=0))
