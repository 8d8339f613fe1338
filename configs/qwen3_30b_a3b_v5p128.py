"""Qwen3-30B-A3B (MoE), SAO, 32K-token trajectories, on a v5p-128 slice (64 chips, 4x4x4).

Architecture from Hugging Face `Qwen/Qwen3-30B-A3B` config.json (48 layers, all
sparse; hidden 2048, 32 query / 4 kv heads of 128, 128 experts of width 768,
8 per token with renormalised top-k weights, vocab 151936, rope_theta 1e6,
untied LM head); bf16 params and compute. Trajectories (and the sampler's KV
cache) hold `sampler.max_seq_len` = 32,768 tokens, Qwen3's native context.

Memory: experts split 4 ways over `expert` (32 per shard), everything else
fsdp over 16; the batch splits over all 64 chips, one 32K-token trajectory
per chip in each of the 2 micro-batches; blocked attention and full remat.

Samplers: `sao-sampler` runs one engine per sampler host, sharded over that
host's 4 chips (`sampler.sharded`) on the sampler's own mesh `sampler.mesh` =
tensor 4: each chip holds one of the 4 KV heads' pages (the paged pool splits
KV heads over `tensor` and pages over data x fsdp, here 1;
docs/explanation/paged-engine.md) and a quarter of every expert's MLP width (Megatron style;
experts are not split over `expert` on this mesh). The paged KV engine
(`kv_layout="paged"`), pages of 256 tokens, the pool the memory of 64 dense
rows of 32K tokens (8,192 pages, 48 GiB per chip beside 14.2 GiB of params),
read by the Pallas ragged paged attention kernel: for a mean episode of 4,096
tokens that is 512 episodes, 8x the dense rows, and the engine runs 512 slots
(`kv_pages=8192`: sao-plan's dense row is that memory's 64 rows, its
`paged_decode` row the 512 slots). (128 dense rows per host
needed 112.6 GiB of the 95 on the learner's mesh.)

Prove it compiles and fits before paying for the slices (CPU + libtpu):

    .venv/bin/sao-plan --config configs/qwen3_30b_a3b_v5p128.py --topology v5p:4x4x4 \
        --sampler-topology v5p:2x2x1

It prints (abridged; GiB per chip; measured 2026-12-02 with libtpu 0.0.42.1, ~36 min
on a loaded 2-core machine) and exits 0:

    program      topology    mesh              args    temps  outputs  aliased  code   total  used
    train_step   v5p:4x4x4   fsdp=16,expert=4  5.82    43.08     5.82     5.82  0.22   49.12  51.7%
    decode_step  v5p:2x2x1   tensor=4         62.24     0.19    48.04    48.00  0.02   62.48  65.8%
    paged_decode v5p:2x2x1   tensor=4         62.24    13.83    48.00    48.00  0.02   76.09  80.1%
    train FLOPs/step: model 7.773e+17, with recompute 1.092e+18 (1.706e+16 per device); ...
    roofline on 64 x v5p (459 TFLOP/s bf16 each): step >= 37.17 s, MFU <= 71.2%,
      tokens/s <= 112,849 (compute bound; communication not modelled)
    decode step (batch 64, cache 32768): >= 37.76 ms ... -> <= 1,695 tokens/s
    paged decode (same KV memory, mean episode 4096 tokens, pages of 256): 512 episodes
      vs 64 dense, step >= 37.76 ms -> <= 13,560 tokens/s (estimated ...)
    fits: every program is within 95% of 95 GiB HBM per device

The paged call's 13.8 GiB of temporaries (2.0 for the 8B config) are not
analysed further: it fits with 14 GiB to spare. sao-plan compiles no prefill;
the batched prefill of 4 rows of the largest bucket (8,192 tokens) fits through
the Pallas kernel, 64.0 GiB per chip (temporaries 1.77), and would not gathered
(96.7 GiB of temporaries): `benchmarks/paged_prefill.py --config
configs/qwen3_30b_a3b_v5p128.py --chunks 8192`.

The train step needs 49.1 GiB per chip (5.8 args + 43.1 temporaries +
outputs/code; 51.7% of 95 GiB; 48.3 when first planned). Two fixes took it
from 411 GiB of temporaries to 42:
  1. Expert-parallel MoE (`sao_jax.models.moe`): each chip routes only its
     expert group's tokens under shard_map; the SPMD partitioner had replicated
     one global argsort of all 64 chips' routed pairs (411 -> 183 GiB).
  2. Blocked attention under the layer scan: JAX hoisted the per-block-pair
     causal/segment masks out of the loop as [16, 16, 1, 8, 4, 512, 512] arrays
     (8 GiB each); an optimization barrier keeps them per layer (183 -> 42).
Roofline: 7.8e17 model FLOPs per step, >= 37 s per step at <= 71% MFU (compute
bound; the expert all-gather/reduce-scatter traffic is not modelled).

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
"""

from sao_jax.config import (AlgorithmConfig, Config, LearnerConfig, MeshConfig, ModelConfig,
                            SamplerConfig)
from sao_jax.config.learner import READY_VALUE_PRETRAIN_STEPS


def get_config() -> Config:
  return Config(
      name="qwen3_30b_a3b_v5p128",
      mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=4),
      model=ModelConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                        head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                        max_position_embeddings=40960, tie_word_embeddings=False,
                        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                        norm_topk_prob=True, decoder_sparse_step=1,
                        param_dtype="bfloat16", compute_dtype="bfloat16", logits_chunk=1024,
                        attention_impl="blocked", attention_block=512, remat_policy="full",
                        scan_layers=True),
      algorithm=AlgorithmConfig.for_variant("sao_centered_gated"),
      learner=LearnerConfig(batch_trajectories=128, micro_batches=2, policy_lr=1e-6,
                            lr_warmup_steps=10, value_pretrain_steps=READY_VALUE_PRETRAIN_STEPS),
      # 512 episodes over the KV memory of 64 dense rows of 32K tokens (8,192 pages of 256).
      sampler=SamplerConfig(slots=512, max_seq_len=32768, prefill_buckets=(512, 2048, 8192),
                            sharded=True, mesh=MeshConfig(data=1, fsdp=1, tensor=4, expert=1),
                            kv_layout="paged", kv_page_size=256, kv_pages=8192,
                            expected_episode_tokens=4096),
  )
