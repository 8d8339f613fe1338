"""Qwen3-8B, SAO, 32K-token trajectories, on a v5p-32 slice (16 chips, topology 2x2x4).

Architecture from Hugging Face `Qwen/Qwen3-8B` config.json (36 layers, hidden
4096, 32 query / 8 kv heads of 128, SwiGLU 12288, vocab 151936, rope_theta 1e6,
untied LM head); bf16 params and compute. Trajectories (and the sampler's KV
cache) hold `sampler.max_seq_len` = 32,768 tokens, Qwen3's native context.

Memory: fsdp over all 16 chips shards params and Adam moments of policy and
critic; each of the 4 micro-batches puts one 32K-token trajectory on each chip;
blocked (flash) attention and full remat keep activations to one layer input
per layer plus one layer's working set; the 36 layers run as one `lax.scan`
(`scan_layers`), which compiles in minutes and needs less memory than unrolled
(88.0 GiB, 92.7%, and 13 minutes to compile).

Samplers: one engine per sampler host, sharded over its 4 chips
(`sampler.sharded`) on the sampler's own mesh `sampler.mesh` = tensor 4 (a
sampler process lays its mesh over its own host's chips; tensor splits the
paged pool's KV heads, data x fsdp, here 1, its pages), with the paged KV engine
(`kv_layout="paged"`) in pages of 256 tokens: a pool of the memory of 64 dense
rows of 32K tokens (8,192 pages), read by the Pallas ragged paged attention
kernel on TPU. 3.8 GiB of params and 72 GiB of pool per chip; for a mean
episode of 4,096 tokens (seq_len / 8) that pool holds 512 episodes, 8x the 64
dense rows, and the engine runs 512 slots (`kv_pages=8192`; sao-plan's dense
row is that memory's 64 rows, its `paged_decode` row compiles the decode call at
the 512 slots over that pool). Pages of 16 would not compile: the kernel keeps 512 slots x
2,048 page indices (4 MiB) in SMEM, 1 MiB on v5p (docs/explanation/paged-engine.md).

Prove it compiles and fits before paying for the slices (CPU + libtpu; ~9 min on
2 quiet cores, ~40 on a heavily loaded machine):

    .venv/bin/sao-plan --config configs/qwen3_8b_v5p32.py --topology v5p:2x2x4 \
        --sampler-topology v5p:2x2x1

It prints (abridged; GiB per chip; measured 2026-12-02 with libtpu 0.0.42.1) and exits 0:

    program      topology    mesh        args    temps  outputs  aliased  code   total    HBM   used
    train_step   v5p:2x2x4   fsdp=16     5.16    71.47     5.16     5.16  0.47   77.10  95.00  81.2%
    decode_step  v5p:2x2x1   tensor=4   75.81     0.12    72.04    72.00  0.08   76.05  95.00  80.0%
    paged_decode v5p:2x2x1   tensor=4   75.81     2.02    72.00    72.00  0.16   77.99  95.00  82.1%
    train FLOPs/step: model 5.018e+17, with recompute 6.830e+17 (4.269e+16 per device); ...
    roofline on 16 x v5p (459 TFLOP/s bf16 each): step >= 93.00 s, MFU <= 73.5%,
      tokens/s <= 22,549 (compute bound; communication not modelled)
    decode step (batch 64, cache 32768): >= 39.38 ms ... -> <= 1,625 tokens/s
    paged decode (same KV memory, mean episode 4096 tokens, pages of 256): 512 episodes
      vs 64 dense, step >= 33.47 ms -> <= 15,297 tokens/s (estimated ...)
    fits: every program is within 95% of 95 GiB HBM per device

The train step's temporaries (71.5 GiB) leave ~13 GiB: a longer sequence or more
trajectories per micro-batch needs a larger slice (more fsdp shards).

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

Critic schedule: the paper's, as in configs/qwen3_0_6b.py (5x the policy's lr, 20 value
pretraining steps, `READY_VALUE_PRETRAIN_STEPS`, then 10 warm-up steps; the lr warm-up
ramps the policy only).

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `algorithm.variant` (`sao_centered_gated`), `algorithm.advantage_centering`
  (`batch_mean`), `algorithm.require_reward_contrast` (true) and
  `learner.lr_warmup_steps` (10; the paper: none): the precautions against the
  collapses argued in configs/qwen3_0_6b.py (a precaution at this lr and scale, not a measurement).
- `learner.batch_trajectories` (64; the paper: 128): one 32K-token trajectory per
  chip in each micro-batch on this slice; the paper's batch needs a larger slice.
"""

from sao_jax.config import (AlgorithmConfig, Config, LearnerConfig, MeshConfig, ModelConfig,
                            SamplerConfig)
from sao_jax.config.learner import READY_VALUE_PRETRAIN_STEPS


def get_config() -> Config:
  return Config(
      name="qwen3_8b_v5p32",
      mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=1),
      model=ModelConfig(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                        max_position_embeddings=40960, tie_word_embeddings=False,
                        param_dtype="bfloat16", compute_dtype="bfloat16", logits_chunk=1024,
                        attention_impl="blocked", attention_block=512, remat_policy="full",
                        scan_layers=True),
      algorithm=AlgorithmConfig.for_variant("sao_centered_gated"),
      learner=LearnerConfig(batch_trajectories=64, micro_batches=4, policy_lr=1e-6,
                            lr_warmup_steps=10, value_pretrain_steps=READY_VALUE_PRETRAIN_STEPS),
      # 512 episodes over the KV memory of 64 dense rows of 32K tokens (8,192 pages of 256).
      sampler=SamplerConfig(slots=512, max_seq_len=32768, prefill_buckets=(512, 2048, 8192),
                            sharded=True, mesh=MeshConfig(data=1, fsdp=1, tensor=4, expert=1),
                            kv_layout="paged", kv_page_size=256, kv_pages=8192,
                            expected_episode_tokens=4096),
  )
