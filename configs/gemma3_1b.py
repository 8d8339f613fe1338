"""Gemma-3-1B(-it) from its Hugging Face checkpoint, SAO on the style environment, 4K episodes.

Architecture from `google/gemma-3-1b-it` config.json (26 layers, hidden 1152,
4 query / 1 kv head of 256, GELU-tanh MLP 6912, vocab 262144, tied embeddings,
bf16): every sixth layer global (rope_theta 1e6), the others local with a
512-token sliding window (RoPE base 1e4), attention scale 256^-1/2. Gemma 3's
chat template has no tool role, so the environment is `style` (one turn, no
tool results); math_tool and coding are refused at sampler start naming
env.name. Point the run at the local directory (weights and tokenizer):

    .venv/bin/sao-train --config configs/gemma3_1b.py \\
        --set run.init=/path/to/gemma-3-1b-it --set run.tokenizer=/path/to/gemma-3-1b-it

The learner refuses a directory whose config.json differs from the `model`
section. Plan it first (needs libtpu; tests/test_ready_configs.py runs this):

    .venv/bin/sao-plan --config configs/gemma3_1b.py --topology v5p:2x2x1

Algorithm: the base config's, `sao_centered_gated` with a 10-step lr warm-up rather than
the paper's `sao`; why, and the overrides that give the paper's SAO: the docstring of
configs/qwen3_0_6b.py.

Critic schedule: the base config's, the paper's (configs/qwen3_0_6b.py: 5x the policy's
lr, 20 value pretraining steps, then 10 warm-up steps).

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `algorithm.variant` (`sao_centered_gated`), `algorithm.advantage_centering`
  (`batch_mean`), `algorithm.require_reward_contrast` (true) and
  `learner.lr_warmup_steps` (10; the paper: none): the precautions against the
  collapses argued in configs/qwen3_0_6b.py (a precaution at this lr and scale, not a measurement).
- `learner.batch_trajectories` (32; the paper: 128): a batch for one host, the base
  config's (configs/qwen3_0_6b.py).
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

# The run setting (mesh, algorithm, learner, data, sampler, bf16 blocked-attention
# model with remat) is the one of configs/qwen3_0_6b.py, on the style environment.
# Layers are unrolled (scan_layers=False): local and global layers differ in mask
# and RoPE.
BASE = pathlib.Path(__file__).resolve().parent / "qwen3_0_6b.py"
# transformers' sliding_window_pattern: layer i is global iff (i + 1) % PATTERN == 0.
LAYERS, PATTERN = 26, 6


def get_config() -> Config:
  base = load_config(BASE)
  return dataclasses.replace(
      base, name="gemma3_1b",
      model=dataclasses.replace(
          base.model, family="gemma3", vocab_size=262144, hidden_size=1152,
          intermediate_size=6912, num_hidden_layers=LAYERS, num_attention_heads=4,
          num_key_value_heads=1, head_dim=256, rope_theta=1_000_000.0,
          rope_local_base_freq=10_000.0, sliding_window=512, query_pre_attn_scalar=256,
          layer_types=tuple("sliding_attention" if (i + 1) % PATTERN else "full_attention"
                            for i in range(LAYERS)),
          rms_norm_eps=1e-6, max_position_embeddings=32768, scan_layers=False),
      env=dataclasses.replace(base.env, name="style"),
      run=dataclasses.replace(base.run, run_dir="runs/gemma3_1b"))
