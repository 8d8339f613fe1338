"""Qwen3-1.7B from its Hugging Face checkpoint, SAO on math_tool, 4K-token episodes.

Architecture from `Qwen/Qwen3-1.7B` config.json (28 layers, hidden 2048, 16
query / 8 kv heads of 128, SwiGLU 6144, vocab 151936, rope_theta 1e6, tied
embeddings, bf16). The run setting (algorithm, learner, data, sampler) is
configs/qwen3_0_6b.py's. On one TPU VM or GPU box, pass the machine (`:v6e-8`,
`:v5p-8`, `:h100-8`, `:h100-1`; sao_jax/config/hosts.py, docs/guides/single-host.md),
plan it (needs libtpu, no TPU) and point it at the checkpoint directory:

    .venv/bin/sao-plan --config configs/qwen3_1_7b.py:v6e-8
    .venv/bin/sao-train --config configs/qwen3_1_7b.py:v6e-8 \\
        --set run.init=/path/to/Qwen3-1.7B --set run.tokenizer=/path/to/Qwen3-1.7B

sao-plan's figures for each host (GiB per device; libtpu 0.0.42.1;
tests/test_ready_configs.py compiles each and checks them; GPU hosts are
estimates, docs/guides/single-host.md):

    host    program       topology    mesh       total     HBM
    v6e-8   train_step    v6e:1x4     fsdp=4      17.03   32.00
    v6e-8   decode_step   v6e:1x4     tensor=4     4.36   32.00
    v6e-8   paged_decode  v6e:1x4     tensor=4     5.15   32.00
    v5p-8   train_step    v5p:1x2x1   fsdp=2      29.44   95.00
    v5p-8   decode_step   v5p:1x2x1   tensor=2     8.72   95.00
    v5p-8   paged_decode  v5p:1x2x1   tensor=2     9.92   95.00
    v6e-8   roofline: MFU <= 75.6%, train tokens/s <= 79,926, paged decode tokens/s <= 54,232
    v5p-8   roofline: MFU <= 75.6%, train tokens/s <= 19,982, paged decode tokens/s <= 54,102

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

BASE = pathlib.Path(__file__).resolve().parent / "qwen3_0_6b.py"


def get_config(host: str = "") -> Config:
  base = load_config(f"{BASE}:{host}" if host else BASE)
  return dataclasses.replace(
      base, name="qwen3_1_7b",
      model=dataclasses.replace(base.model, hidden_size=2048, intermediate_size=6144),
      run=dataclasses.replace(base.run, run_dir="runs/qwen3_1_7b"))
