"""CPU sanity setting: RL alone lifts a policy from chance to near 1 in a few minutes.

    .venv/bin/sao-train --config configs/sanity_cpu.py --set algorithm.variant=sao
    # any variant: sao, sao_dis_only, grpo, grpo_dis, running_mean, ppo
    # (`sanity_config(variant)` below applies the variant's preset)

Environment `sanity` (`sao_jax.envs.sanity`): one turn, no tool, "Answer with the
word blue." and reward 1 iff the reply is exactly that word, one of 4. The SFT
warm-start trains on demonstrations whose word is drawn independently of the
prompt, so it teaches the format only: the sampled training reward starts at
chance (~0.25). Everything above chance is RL's. A run should show the
training reward (`reward/mean`) rising to >= 0.9 within `learner.steps`
(tests/cli/test_sanity_learns.py asserts it per variant). Outputs go to
runs/sanity_cpu/.
"""

from sao_jax.config import (AlgorithmConfig, Config, DataConfig, EnvConfig, LearnerConfig,
                            MeshConfig, ModelConfig, RunConfig, SamplerConfig)


def sanity_config(variant: str = "sao") -> Config:
  """The sanity setting with `variant`'s preset (SAO.md §5)."""
  return Config(
      name="sanity_cpu",
      seed=0,
      mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=1),
      model=ModelConfig(vocab_size=384, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, max_position_embeddings=128, logits_chunk=128),
      algorithm=AlgorithmConfig.for_variant(variant),
      learner=LearnerConfig(batch_trajectories=32, steps=40, policy_lr=1e-3, value_lr=1e-3,
                            critic_warmup_steps=3, grad_clip=1.0),
      env=EnvConfig(name="sanity", max_turns=1),
      data=DataConfig(max_lag=4, length_buckets=(48, 64), transport_capacity=64),
      sampler=SamplerConfig(slots=16, max_seq_len=64, prefill_buckets=(48, 64),
                            steps_per_call=1, max_new_tokens=1, stop_patterns=()),
      run=RunConfig(run_dir="runs/sanity_cpu", sft_steps=60, sft_lr=3e-3, sft_batch=32,
                    eval_every=0, eval_episodes=64),
  )


def get_config() -> Config:
  return sanity_config("sao")
