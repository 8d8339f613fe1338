"""Llama-3.2-3B(-Instruct) from its Hugging Face checkpoint, SAO on math_tool, 4K-token episodes.

Architecture from `meta-llama/Llama-3.2-3B` config.json (28 layers, hidden
3072, 24 query / 8 kv heads of 128, SwiGLU 8192, vocab 128256, rms_norm_eps
1e-5, rope_theta 5e5 with llama3 scaling: factor 32, low/high frequency
factors 1/4 over an original 8192-token context; tied embeddings, bf16). Point
the run at the local directory (weights and tokenizer):

    .venv/bin/sao-train --config configs/llama3_2_3b.py \\
        --set run.init=/path/to/Llama-3.2-3B --set run.tokenizer=/path/to/Llama-3.2-3B

The learner refuses a directory whose config.json differs from the `model`
section. Plan it first (needs libtpu; tests/test_ready_configs.py runs this):

    .venv/bin/sao-plan --config configs/llama3_2_3b.py --topology v5p:2x2x1

Algorithm: the base config's, `sao_centered_gated` with a 10-step lr warm-up rather than
the paper's `sao`; why, and the overrides that give the paper's SAO: the docstring of
configs/qwen3_0_6b.py.
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

# The run setting (mesh, algorithm, learner, data, sampler, bf16 blocked-attention
# model with remat and scanned layers) is the one of configs/qwen3_0_6b.py.
BASE = pathlib.Path(__file__).resolve().parent / "qwen3_0_6b.py"


def get_config(host: str = "") -> Config:
  base = load_config(f"{BASE}:{host}" if host else BASE)
  return dataclasses.replace(
      base, name="llama3_2_3b",
      model=dataclasses.replace(
          base.model, family="llama", vocab_size=128256, hidden_size=3072, intermediate_size=8192,
          num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8, head_dim=128,
          rope_theta=500_000.0, rope_type="llama3", rope_factor=32.0, rope_low_freq_factor=1.0,
          rope_high_freq_factor=4.0, rope_original_max_position_embeddings=8192, rms_norm_eps=1e-5,
          max_position_embeddings=131072),
      run=dataclasses.replace(base.run, run_dir="runs/llama3_2_3b"))
