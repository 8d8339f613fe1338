"""Qwen3-4B from its Hugging Face checkpoint, SAO on math_tool, 4K-token episodes.

Architecture from `Qwen/Qwen3-4B` config.json (36 layers, hidden 2560, 32
query / 8 kv heads of 128, SwiGLU 9728, vocab 151936, rope_theta 1e6, tied
embeddings, bf16). The run setting is configs/qwen3_0_6b.py's; on a ready host
(`configs/qwen3_4b.py:v6e-8`, sao_jax/config/hosts.py) its layout and the
figures sao-plan gives for it: docs/guides/single-host.md.
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

BASE = pathlib.Path(__file__).resolve().parent / "qwen3_0_6b.py"


def get_config(host: str = "") -> Config:
  base = load_config(f"{BASE}:{host}" if host else BASE)
  return dataclasses.replace(
      base, name="qwen3_4b",
      model=dataclasses.replace(base.model, hidden_size=2560, intermediate_size=9728,
                                num_hidden_layers=36, num_attention_heads=32),
      run=dataclasses.replace(base.run, run_dir="runs/qwen3_4b"))
