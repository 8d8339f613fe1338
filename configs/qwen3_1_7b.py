"""Qwen3-1.7B from its Hugging Face checkpoint, SAO on math_tool, 4K-token episodes.

Architecture from `Qwen/Qwen3-1.7B` config.json (28 layers, hidden 2048, 16
query / 8 kv heads of 128, SwiGLU 6144, vocab 151936, rope_theta 1e6, tied
embeddings, bf16). The run setting is configs/qwen3_0_6b.py's; on a ready host
(`configs/qwen3_1_7b.py:v6e-8`, sao_jax/config/hosts.py) its layout and the
figures sao-plan gives for it: docs/guides/single-host.md.
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

BASE = pathlib.Path(__file__).resolve().parent / "qwen3_0_6b.py"


def get_config(host: str = "") -> Config:
  base = load_config(f"{BASE}:{host}" if host else BASE)
  return dataclasses.replace(
      base, name="qwen3_1_7b",
      model=dataclasses.replace(base.model, hidden_size=2048, intermediate_size=6144),
      run=dataclasses.replace(base.run, run_dir="runs/qwen3_1_7b"))
