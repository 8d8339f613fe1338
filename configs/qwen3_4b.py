"""Qwen3-4B from its Hugging Face checkpoint, SAO on math_tool, 4K-token episodes.

Architecture from `Qwen/Qwen3-4B` config.json (36 layers, hidden 2560, 32
query / 8 kv heads of 128, SwiGLU 9728, vocab 151936, rope_theta 1e6, tied
embeddings, bf16). The run setting (algorithm, learner, data, sampler) is
configs/qwen3_0_6b.py's. On one TPU VM or GPU box, pass the machine (`:v6e-8`,
`:v5p-8`, `:h100-8`, `:h100-1`; sao_jax/config/hosts.py, docs/guides/single-host.md),
plan it (needs libtpu, no TPU) and point it at the checkpoint directory:

    .venv/bin/sao-plan --config configs/qwen3_4b.py:v6e-8
    .venv/bin/sao-train --config configs/qwen3_4b.py:v6e-8 \\
        --set run.init=/path/to/Qwen3-4B --set run.tokenizer=/path/to/Qwen3-4B

sao-plan's figures for each host (GiB per device; libtpu 0.0.42.1;
tests/test_ready_configs.py compiles each and checks them; GPU hosts are
estimates, docs/guides/single-host.md):

    host    program       topology    mesh       total     HBM
    v6e-8   train_step    v6e:1x4     fsdp=4      26.54   32.00
    v6e-8   decode_step   v6e:1x4     tensor=4     6.44   32.00
    v6e-8   paged_decode  v6e:1x4     tensor=4     7.43   32.00
    v5p-8   train_step    v5p:1x2x1   fsdp=2      56.29   95.00
    v5p-8   decode_step   v5p:1x2x1   tensor=2    12.89   95.00
    v5p-8   paged_decode  v5p:1x2x1   tensor=2    14.41   95.00
    h100-8  train_step    v5p:2x2x1   fsdp=4      30.77   79.65
    h100-8  decode_step   v5p:2x2x1   tensor=4     6.50   79.65
    h100-8  paged_decode  v5p:2x2x1   tensor=4     7.50   79.65
    v6e-8   roofline: MFU <= 75.7%, train tokens/s <= 31,905, paged decode tokens/s <= 31,553
    v5p-8   roofline: MFU <= 75.7%, train tokens/s <= 7,976, paged decode tokens/s <= 36,056
    h100-8  roofline: MFU <= 75.7%, train tokens/s <= 34,372, paged decode tokens/s <= 72,948

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
# Micro-batches per host where the base's 4 do not fit: on a v6e-8's 4 learner chips
# (32 GiB each) 4 need 30.8 GiB per chip, over the 30.4 GiB sao-plan allows.
MICRO_BATCHES = {"v6e-8": 8}


def get_config(host: str = "") -> Config:
  base = load_config(f"{BASE}:{host}" if host else BASE)
  return dataclasses.replace(
      base, name="qwen3_4b",
      model=dataclasses.replace(base.model, hidden_size=2560, intermediate_size=9728,
                                num_hidden_layers=36, num_attention_heads=32),
      learner=dataclasses.replace(base.learner, micro_batches=MICRO_BATCHES.get(
          host, base.learner.micro_batches)),
      run=dataclasses.replace(base.run, run_dir="runs/qwen3_4b"))
