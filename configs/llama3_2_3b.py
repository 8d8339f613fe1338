"""Llama-3.2-3B(-Instruct) from its Hugging Face checkpoint, SAO on math_tool, 4K-token episodes.

Architecture from `meta-llama/Llama-3.2-3B` config.json: configs/llama3_2_1b.py's
(rope_theta 5e5 with llama3 scaling, rms_norm_eps 1e-5, vocab 128256, tied
embeddings, bf16) with 28 layers, hidden 3072, 24 query / 8 kv heads of 128,
SwiGLU 8192. The run setting (algorithm, learner, data, sampler) is
configs/qwen3_0_6b.py's. On one TPU VM or GPU box, pass the machine (`:v6e-8`,
`:v5p-8`, `:h100-8`, `:h100-1`; sao_jax/config/hosts.py, docs/guides/single-host.md),
plan it (needs libtpu, no TPU) and point it at the checkpoint directory:

    .venv/bin/sao-plan --config configs/llama3_2_3b.py:v6e-8
    .venv/bin/sao-train --config configs/llama3_2_3b.py:v6e-8 \\
        --set run.init=/path/to/Llama-3.2-3B --set run.tokenizer=/path/to/Llama-3.2-3B

sao-plan's figures for each host (GiB per device; libtpu 0.0.42.1;
tests/test_ready_configs.py compiles each and checks them; GPU hosts are
estimates, docs/guides/single-host.md):

    host    program       topology    mesh       total     HBM
    v6e-8   train_step    v6e:1x4     fsdp=4      25.19   32.00
    v6e-8   decode_step   v6e:1x4     tensor=4     5.05   32.00
    v6e-8   paged_decode  v6e:1x4     tensor=4     5.39   32.00
    v5p-8   train_step    v5p:1x2x1   fsdp=2      46.12   95.00
    v5p-8   decode_step   v5p:1x2x1   tensor=2    10.09   95.00
    v5p-8   paged_decode  v5p:1x2x1   tensor=2    10.85   95.00
    v6e-8   roofline: MFU <= 75.9%, train tokens/s <= 42,376, paged decode tokens/s <= 40,153
    v5p-8   roofline: MFU <= 75.9%, train tokens/s <= 10,594, paged decode tokens/s <= 46,362

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

BASE = pathlib.Path(__file__).resolve().parent / "llama3_2_1b.py"


def get_config(host: str = "") -> Config:
  base = load_config(f"{BASE}:{host}" if host else BASE)
  return dataclasses.replace(
      base, name="llama3_2_3b",
      model=dataclasses.replace(base.model, hidden_size=3072, num_hidden_layers=28,
                                num_attention_heads=24, head_dim=128),
      run=dataclasses.replace(base.run, run_dir="runs/llama3_2_3b"))
