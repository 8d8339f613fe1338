"""CPU sanity setting: RL alone lifts a policy from chance to ~1 in a few minutes.

    .venv/bin/sao-train --config configs/sanity_cpu.py        # SAO
    # other variants (sao_dis_only, grpo, grpo_dis, running_mean, ppo) with their
    # presets: `sanity_config(variant)` below (tests/cli/test_sanity_learns.py)

Environment `sanity` (`sao_jax.envs.sanity`): one turn of one token, no tool,
"Answer with the word red." and reward 1 iff the reply is exactly "red". The SFT
warm-start trains on demonstrations that answer with one of 4 words whatever the
prompt says, so it teaches the format only: the sampled training reward starts
at chance (~0.25), and everything above it is RL's. A run should show the
training reward (`reward/mean`) rising to >= 0.9 well within `learner.steps`
(in our runs SAO and GRPO passed 0.9 by the 15th policy update; the slow tests
assert it per variant). Outputs go to runs/sanity_cpu/.
"""

from sao_jax.config import (AlgorithmConfig, Config, DataConfig, EnvConfig, LearnerConfig,
                            MeshConfig, ModelConfig, RunConfig, SamplerConfig)


def sanity_config(variant: str = "sao") -> Config:
  """The sanity setting with `variant`'s preset (docs/algorithm.md §5)."""
  return Config(
      name="sanity_cpu",
      seed=0,
      mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=1),
      model=ModelConfig(vocab_size=384, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, max_position_embeddings=128, logits_chunk=128),
      algorithm=AlgorithmConfig.for_variant(variant),
      learner=LearnerConfig(batch_trajectories=32, steps=40, policy_lr=3e-3, value_lr=1e-3,
                            critic_warmup_steps=3, grad_clip=1.0),
      env=EnvConfig(name="sanity", max_turns=1),
      data=DataConfig(max_lag=4, length_buckets=(48, 64), transport_capacity=64),
      sampler=SamplerConfig(slots=16, max_seq_len=64, prefill_buckets=(48, 64),
                            steps_per_call=1, max_new_tokens=1, stop_patterns=()),
      run=RunConfig(run_dir="runs/sanity_cpu", sft_steps=100, sft_lr=3e-3, sft_batch=32,
                    eval_every=0, eval_episodes=64),
  )


def get_config() -> Config:
  return sanity_config("sao")
