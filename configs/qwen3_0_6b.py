"""Qwen3-0.6B from its Hugging Face checkpoint, SAO on math_tool, 4K-token episodes.

Architecture from `Qwen/Qwen3-0.6B` config.json (28 layers, hidden 1024, 16
query / 8 kv heads of 128, SwiGLU 3072, vocab 151936, rope_theta 1e6, tied
embeddings, bf16). Download the checkpoint elsewhere and point the run at the
local directory (weights and tokenizer):

    .venv/bin/sao-train --config configs/qwen3_0_6b.py \\
        --set run.init=/path/to/Qwen3-0.6B --set run.tokenizer=/path/to/Qwen3-0.6B

The learner refuses a directory whose config.json differs from the `model`
section. On one TPU VM or GPU box, pass the machine (`:v6e-8`, `:v5p-8`, `:h100-8`,
`:h100-1`; sao_jax/config/hosts.py, docs/guides/single-host.md) and plan it first
(needs libtpu, no TPU):

    .venv/bin/sao-plan --config configs/qwen3_0_6b.py:v6e-8

sao-plan's figures for each host (GiB per device; libtpu 0.0.42.1;
tests/test_ready_configs.py compiles each and checks them; GPU hosts are
estimates, docs/guides/single-host.md):

    host    program       topology    mesh       total     HBM
    v6e-8   train_step    v6e:1x4     fsdp=4      10.05   32.00
    v6e-8   decode_step   v6e:1x4     tensor=4     3.86   32.00
    v6e-8   paged_decode  v6e:1x4     tensor=4     4.54   32.00
    v5p-8   train_step    v5p:1x2x1   fsdp=2      15.43   95.00
    v5p-8   decode_step   v5p:1x2x1   tensor=2     7.67   95.00
    v5p-8   paged_decode  v5p:1x2x1   tensor=2     8.74   95.00
    h100-8  train_step    v5p:2x2x1   fsdp=4      10.06   79.65
    h100-8  decode_step   v5p:2x2x1   tensor=4     3.88   79.65
    h100-8  paged_decode  v5p:2x2x1   tensor=4     4.64   79.65
    h100-1  train_step    v5p:1x1x1   one         19.46   79.65
    h100-1  decode_step   v5p:1x1x1   one         15.21   79.65
    h100-1  paged_decode  v5p:1x1x1   one         16.18   79.65
    v6e-8   roofline: MFU <= 74.0%, train tokens/s <= 188,243, paged decode tokens/s <= 73,104
    v5p-8   roofline: MFU <= 74.0%, train tokens/s <= 47,061, paged decode tokens/s <= 65,781
    h100-8  roofline: MFU <= 74.0%, train tokens/s <= 202,802, paged decode tokens/s <= 157,104
    h100-1  roofline: MFU <= 74.0%, train tokens/s <= 50,701, paged decode tokens/s <= 41,681

Algorithm: `sao_centered_gated` (batch-mean-centred advantages, no policy step on a
batch whose rewards are all equal) with a 10-step lr warm-up, not the paper's `sao`.
Why (docs/research/variants.md has the numbers): in this project's own runs the
paper's SAO collapsed from weak starts (7 of 8 seeds on the 4-token sanity task at lr
3e-3, docs/research/drift.md; 1 of 3 on tool_math at lr 1e-4), through two routes that are Adam
normalising tiny, one-signed gradients into full-size steps (a critic's bias pushing
every sampled token; the critic's residual error on all-equal batches); centring and
the warm-up removed the first (0 of 8 in 60 steps; 2 of 8 in a later recheck,
docs/research/drift-recheck.md), the gate the second (1 of 8
collapsed, then recovered, over 1000 steps against 7 of 8 without it,
docs/research/drift1000.md), and `sao_stable` (the same two fields) ran 1000 tool_math steps
on 8 of 8 seeds without collapse (docs/research/claim6.md) at no measured cost in learning
speed. The gate only drops updates whose advantages are critic error (no outcome
contrast); on a large, diverse batch it rarely fires (claim 6: 2.7% of steps). No run
here was at this config's lr (1e-6) or scale, so this is a precaution, not a
measurement. The paper's SAO: `--set algorithm.variant=sao --set
algorithm.advantage_centering=none --set algorithm.require_reward_contrast=false --set
learner.lr_warmup_steps=0`.

Critic schedule: the paper's (docs/algorithm.md §4). The critic learns at 5x the
policy's rate (`learner.value_lr` None: 5e-6), first for `learner.value_pretrain_steps`
= 20 value-only steps on the initial policy's rollouts (value pretraining; the paper gives
no count: why 20 at `READY_VALUE_PRETRAIN_STEPS`, sao_jax/config/learner.py), then for
the paper's 10 warm-up steps (`learner.critic_warmup_steps`), so the first policy update
is learner step 30. The lr warm-up above ramps the policy only; the critic learns at its
full rate from its first step. `value/bias` and the critic's explained variance in the
progress line say whether it learned before the policy moves.

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `algorithm.variant` (`sao_centered_gated`), `algorithm.advantage_centering`
  (`batch_mean`), `algorithm.require_reward_contrast` (true) and
  `learner.lr_warmup_steps` (10; the paper: none): the precautions against the
  collapses argued above (a precaution at this lr and scale, not a measurement).
- `learner.batch_trajectories` (32; the paper: 128): a batch for one host; the
  sao-plan figures above are at this batch.
"""

import dataclasses

from sao_jax.config import (AlgorithmConfig, Config, DataConfig, LearnerConfig, MeshConfig,
                            ModelConfig, RunConfig, SamplerConfig, hosts)
from sao_jax.config.learner import READY_VALUE_PRETRAIN_STEPS


def get_config(host: str = "") -> Config:
  cfg = Config(
      name="qwen3_0_6b",
      mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=1),
      model=ModelConfig(family="qwen3", vocab_size=151936, hidden_size=1024,
                        intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0,
                        rms_norm_eps=1e-6, max_position_embeddings=40960,
                        tie_word_embeddings=True, param_dtype="bfloat16",
                        compute_dtype="bfloat16", attention_impl="blocked",
                        remat_policy="full", scan_layers=True),
      algorithm=AlgorithmConfig.for_variant("sao_centered_gated"),
      learner=LearnerConfig(batch_trajectories=32, micro_batches=4, policy_lr=1e-6,
                            lr_warmup_steps=10, value_pretrain_steps=READY_VALUE_PRETRAIN_STEPS),
      data=DataConfig(length_buckets=(1024, 2048, 4096)),
      sampler=SamplerConfig(slots=32, max_seq_len=4096, prefill_buckets=(512, 2048)),
      run=RunConfig(run_dir="runs/qwen3_0_6b"),
  )
  if not host:
    return cfg
  return hosts.on_host(cfg, host)
