"""Llama-3.2-1B(-Instruct) from its Hugging Face checkpoint, SAO on math_tool, 4K-token episodes.

Architecture from `meta-llama/Llama-3.2-1B` config.json (16 layers, hidden
2048, 32 query / 8 kv heads of 64, SwiGLU 8192, vocab 128256, rms_norm_eps
1e-5, rope_theta 5e5 with llama3 scaling: factor 32, low/high frequency
factors 1/4 over an original 8192-token context; tied embeddings, bf16). Point
the run at the local directory (weights and tokenizer):

    .venv/bin/sao-train --config configs/llama3_2_1b.py \\
        --set run.init=/path/to/Llama-3.2-1B --set run.tokenizer=/path/to/Llama-3.2-1B

The learner refuses a directory whose config.json differs from the `model`
section. On one TPU VM or GPU box, pass the machine (`:v6e-8`, `:v5p-8`, `:h100-8`,
`:h100-1`; sao_jax/config/hosts.py, docs/guides/single-host.md) and plan it first
(needs libtpu, no TPU):

    .venv/bin/sao-plan --config configs/llama3_2_1b.py:v6e-8

sao-plan's figures for each host (GiB per device; libtpu 0.0.42.1;
tests/test_ready_configs.py compiles each and checks them; GPU hosts are
estimates, docs/guides/single-host.md):

    host    program       topology    mesh       total     HBM
    v6e-8   train_step    v6e:1x4     fsdp=4      12.77   32.00
    v6e-8   decode_step   v6e:1x4     tensor=4     1.69   32.00
    v6e-8   paged_decode  v6e:1x4     tensor=4     4.14   32.00
    v5p-8   train_step    v5p:1x2x1   fsdp=2      21.56   95.00
    v5p-8   decode_step   v5p:1x2x1   tensor=2     3.57   95.00
    v5p-8   paged_decode  v5p:1x2x1   tensor=2     8.27   95.00
    v6e-8   roofline: MFU <= 75.8%, train tokens/s <= 117,340, paged decode tokens/s <= 40,399
    v5p-8   roofline: MFU <= 75.8%, train tokens/s <= 29,335, paged decode tokens/s <= 39,416

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
- `learner.batch_trajectories` (32; the paper: 128): a batch for one host; the
  sao-plan figures above are at this batch.
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
      base, name="llama3_2_1b",
      model=dataclasses.replace(
          base.model, family="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
          num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
          rope_theta=500_000.0, rope_type="llama3", rope_factor=32.0, rope_low_freq_factor=1.0,
          rope_high_freq_factor=4.0, rope_original_max_position_embeddings=8192, rms_norm_eps=1e-5,
          max_position_embeddings=131072),
      run=dataclasses.replace(base.run, run_dir="runs/llama3_2_1b"))
