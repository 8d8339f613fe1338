"""A reward function over a verl-style Parquet file, on the tiny CPU model.

    .venv/bin/python examples/verl_reward/make_data.py runs/verl_reward/train.parquet
    PYTHONPATH=examples/verl_reward .venv/bin/python -m sao_jax.cli.make_tokenizer \
        --config examples/verl_reward/config.py --out runs/verl_reward/tok
    PYTHONPATH=examples/verl_reward .venv/bin/sao-train --config examples/verl_reward/config.py \
        --set run.tokenizer=runs/verl_reward/tok

The built-in "single_turn" environment plays each row's chat prompt; the reply is
graded by `arith_reward.compute_score` (env.reward_fn). Dataset rows hold no
demonstrations, so there is no SFT warm-start and the run needs a tokenizer
(`run.tokenizer`: a model's directory, e.g. Qwen2.5-0.5B-Instruct, with
`run.init` that model and `model` its config for a real run).
"""

import dataclasses
import pathlib

from sao_jax.config import EnvConfig, load_config
from sao_jax.config.dataset import DatasetConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]


def get_config():
  base = load_config(ROOT / "configs" / "demo_cpu.py")
  return dataclasses.replace(
      base, name="verl_reward",
      env=EnvConfig(name="single_turn", task_source="parquet",
                    dataset=DatasetConfig.verl("runs/verl_reward/train.parquet"),
                    reward_fn="arith_reward:compute_score", reward_timeout_s=5.0),
      run=dataclasses.replace(base.run, run_dir="runs/verl_reward", sft_steps=0))
