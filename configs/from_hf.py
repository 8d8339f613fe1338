"""RL from any supported Hugging Face checkpoint: the model section comes from run.init.

    .venv/bin/sao-train --config configs/from_hf.py --set run.init=/path/to/Qwen3-0.6B

Sizes, heads, RoPE, vocabulary, tying, family and dtype are read from the
directory's config.json, its tokenizer and chat template from the same directory
(docs/get-started/first-real-run.md). Only the run's choices are here.
"""

from sao_jax.config import AlgorithmConfig, Config, EnvConfig, RunConfig


def get_config() -> Config:
  return Config(name="from_hf", algorithm=AlgorithmConfig.for_variant("sao"),
                env=EnvConfig(name="math_tool", options={"problem_kind": "arithmetic"}),
                run=RunConfig(run_dir="runs/from_hf", sft_steps=0))
