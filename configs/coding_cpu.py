"""Coding agent on CPU: a tiny model fixes generated one-function bugs with tools.

    .venv/bin/sao-train --config configs/coding_cpu.py

Generated bug-fix tasks (difficulty 1: one function, one planted bug, the
visible test exposes it); the agent lists, views, edits, runs tests and submits
through ```tool JSON calls; reward 1 when the hidden tests pass. A short SFT
warm-start on the scripted agent's turns teaches the tool format, then SAO runs
a few steps. At this scale expect the format, not solved tasks: the point is
that the whole path (sandboxed repository copies, long multi-turn traces,
skip-observation GAE) runs. Outputs in runs/coding_cpu/.
"""

from sao_jax.config import (AlgorithmConfig, Config, DataConfig, EnvConfig, LearnerConfig,
                            MeshConfig, ModelConfig, RunConfig, SamplerConfig)
from sao_jax.config.env import SandboxLimits


def get_config() -> Config:
  return Config(
      name="coding_cpu",
      mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=1),
      model=ModelConfig(vocab_size=1024, hidden_size=128, intermediate_size=256,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, max_position_embeddings=4096, logits_chunk=512,
                        attention_impl="blocked", attention_block=512),
      algorithm=AlgorithmConfig.for_variant("sao"),
      learner=LearnerConfig(batch_trajectories=4, steps=4, policy_lr=2e-5, value_lr=1e-4,
                            critic_warmup_steps=1),
      env=EnvConfig(name="coding", max_turns=12, max_observation_chars=1500,
                    tool=SandboxLimits(wall_time_s=10.0), options={"difficulty": 1}),
      data=DataConfig(max_lag=4, length_buckets=(1024, 2048, 4096), transport_capacity=16),
      sampler=SamplerConfig(slots=4, max_seq_len=4096, prefill_buckets=(64, 512, 2048),
                            max_new_tokens=160,
                            stop_patterns=(r"```tool[ \t]*\n.*?\n```",)),
      run=RunConfig(run_dir="runs/coding_cpu", sft_steps=30, sft_batch=4, eval_every=0),
  )
