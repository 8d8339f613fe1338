"""Gemma-3-4B(-it)'s language model, SAO on the style environment, 4K-token episodes.

Architecture from the `text_config` of `google/gemma-3-4b-it` config.json (34 layers,
hidden 2560, 8 query / 4 kv heads of 256, GELU-tanh MLP 10240, vocab 262208, tied
embeddings, bf16): every sixth layer global (rope_theta 1e6, linear RoPE scaling by
8), the others local with a 1024-token sliding window (RoPE base 1e4), attention
scale 256^-1/2. The published checkpoint is the multimodal
Gemma3ForConditionalGeneration (vision tower + language model); sao_jax reads a
text-only Gemma3ForCausalLM directory (`sao_jax.config.families`), so `run.init` must
be the language model saved on its own. Gemma 3's chat template has no tool role, so
the environment is `style` (configs/gemma3_1b.py).

On one TPU VM, pass the machine (`:v6e-8`, `:v5p-8`; sao_jax/config/hosts.py,
docs/guides/single-host.md), plan it (needs libtpu, no TPU) and point it at the
checkpoint directory:

    .venv/bin/sao-plan --config configs/gemma3_4b.py:v6e-8
    .venv/bin/sao-train --config configs/gemma3_4b.py:v6e-8 \\
        --set run.init=/path/to/gemma-3-4b-text --set run.tokenizer=/path/to/gemma-3-4b-text

Paged attention (`sampler.paged_attention="auto"`): on a v6e-8 the sampler's 4 chips
hold one KV head of 256 each and run the Pallas kernel; on a v5p-8 its 2 chips hold 2
each, which libtpu cannot compile the kernel for, so the sampler takes the reference
path and says why (docs/explanation/paged-engine.md, "Attention paths"). The
`paged_decode` rows below are those paths.

sao-plan's figures for each host (GiB per device; libtpu 0.0.42.1;
tests/test_ready_configs.py compiles each and checks them):

    host    program       topology    mesh       total     HBM
    v6e-8   train_step    v6e:1x4     fsdp=4      23.13   32.00
    v6e-8   decode_step   v6e:1x4     tensor=4     6.17   32.00
    v6e-8   paged_decode  v6e:1x4     tensor=4     7.52   32.00
    v5p-8   train_step    v5p:1x2x1   fsdp=2      49.49   95.00
    v5p-8   decode_step   v5p:1x2x1   tensor=2    12.29   95.00
    v5p-8   paged_decode  v5p:1x2x1   tensor=2    14.32   95.00
    v6e-8   roofline: MFU <= 76.1%, train tokens/s <= 37,830, paged decode tokens/s <= 31,228
    v5p-8   roofline: MFU <= 76.1%, train tokens/s <= 9,457, paged decode tokens/s <= 42,888

On a v6e-8 the learner runs 8 micro-batches (`MICRO_BATCHES`): the base's 4 need
30.7 GiB per chip. The unrolled 34-layer train step compiles for far longer than a
scanned one, and libtpu needs about 20 GB of host memory for it: the v6e-8 plan took
13 minutes at 19.3 GB of RSS on a quiet 2-core machine (the v5p-8 one about 35
minutes on a loaded one).

Critic schedule: the base config's, the paper's (configs/qwen3_0_6b.py: 5x the policy's
lr, 20 value pretraining steps, then 10 warm-up steps).

Departs from the paper (each algorithm and learner field whose value differs from
the paper's `sao` and `LearnerConfig` defaults; tests/test_config_departures.py
checks the list):
- `algorithm.variant` (`sao_centered_gated`), `algorithm.advantage_centering`
  (`batch_mean`), `algorithm.require_reward_contrast` (true) and
  `learner.lr_warmup_steps` (10; the paper: none): the precautions against the
  collapses argued in configs/qwen3_0_6b.py (a precaution at this lr and scale, not a measurement).
- `learner.batch_trajectories` (32; the paper: 128): a batch for one host, the base
  config's (configs/qwen3_0_6b.py).
"""

import dataclasses
import pathlib

from sao_jax.config import Config, load_config

# The run setting (mesh, algorithm, learner, data, sampler, bf16 blocked-attention
# model with remat) is configs/qwen3_0_6b.py's, on the style environment. Layers are
# unrolled (scan_layers=False): local and global layers differ in mask and RoPE.
BASE = pathlib.Path(__file__).resolve().parent / "qwen3_0_6b.py"
# transformers' sliding_window_pattern: layer i is global iff (i + 1) % PATTERN == 0.
LAYERS, PATTERN = 34, 6
# Micro-batches per host where the base's 4 do not fit: on a v6e-8's 4 learner chips
# (32 GiB each) 4 need 30.7 GiB per chip (temporaries 20.1), over the 30.4 GiB sao-plan
# allows.
MICRO_BATCHES = {"v6e-8": 8}


def get_config(host: str = "") -> Config:
  base = load_config(f"{BASE}:{host}" if host else BASE)
  return dataclasses.replace(
      base, name="gemma3_4b",
      model=dataclasses.replace(
          base.model, family="gemma3", vocab_size=262208, hidden_size=2560,
          intermediate_size=10240, num_hidden_layers=LAYERS, num_attention_heads=8,
          num_key_value_heads=4, head_dim=256, rope_theta=1_000_000.0, rope_type="linear",
          rope_factor=8.0, rope_local_base_freq=10_000.0, sliding_window=1024,
          query_pre_attn_scalar=256,
          layer_types=tuple("sliding_attention" if (i + 1) % PATTERN else "full_attention"
                            for i in range(LAYERS)),
          rms_norm_eps=1e-6, max_position_embeddings=131072, scan_layers=False),
      learner=dataclasses.replace(base.learner, micro_batches=MICRO_BATCHES.get(
          host, base.learner.micro_batches)),
      env=dataclasses.replace(base.env, name="style"),
      run=dataclasses.replace(base.run, run_dir="runs/gemma3_4b"))
