"""CPU demo: a tiny Qwen3-style model learns tool-integrated arithmetic with SAO.

    make demo            # = .venv/bin/sao-train --config configs/demo_cpu.py

From scratch on a 2-core CPU in about 16 minutes (docs/get-started/demo.md): a
byte-level BPE tokenizer is trained on the environment's texts, a 0.36M-parameter
model gets a 400-step SFT warm-start on demonstrations, then SAO trains it for 60
steps with one sampler process streaming single rollouts. Half the demonstrations
(a fixed per-task draw, `env.options.demo_guess_rate`) come from a careless expert who answers at once
with the question's first number; the rest write a python block that prints
the expression, read the tool output and answer in \\boxed{}. SFT imitates
both: its policy calls the tool about half the time when sampled and never
greedily, so it starts far below the ceiling, and no amount of SFT on these
demonstrations fixes that. RL, paid only for right answers, has to: held-out
accuracy (greedy, 256 tasks never trained on; standard error <= 0.03) is
printed at step 0 (after SFT) and every 20 steps, and the final summary prints
it after SFT, after RL and the difference (RL's own gain), beside the sampled
accuracy (the same tasks played once each at temperature 1, as training samples
them: `run.eval_samples=1`). Read the sampled one as RL's honest gain: greedy
accuracy jumps 0 -> 1 when one opening choice (call the tool or guess) flips its
argmax, which GRPO does just the same (docs/research/demo.md), while the
sampled accuracy moves with the probabilities (~0.4 -> ~0.8 in our runs). The RL step uses
the drift remedies (docs/research/drift-notes.md): batch-centred advantages and a
5-step learning-rate warm-up, at policy_lr 1e-4. Outputs go to
runs/demo_cpu-<time>/: metrics.jsonl, tensorboard/, checkpoints/, curves.png,
eval/ (what the policy wrote at each evaluation).
"""

from sao_jax.config import (AlgorithmConfig, Config, DataConfig, EnvConfig, LearnerConfig,
                            MeshConfig, ModelConfig, RunConfig, SamplerConfig)
from sao_jax.config.env import SandboxLimits


def get_config() -> Config:
  return Config(
      name="demo_cpu",
      seed=0,
      mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=1),
      model=ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=32, max_position_embeddings=512, logits_chunk=256),
      algorithm=AlgorithmConfig.for_variant("sao", advantage_centering="batch_mean"),
      learner=LearnerConfig(batch_trajectories=16, steps=60, policy_lr=1e-4, value_lr=1e-4,
                            lr_warmup_steps=5, critic_warmup_steps=3, grad_clip=1.0),
      env=EnvConfig(name="math_tool", max_turns=3, tool=SandboxLimits(wall_time_s=5.0),
                    options={"difficulty": 1, "problem_kind": "arithmetic",
                             "demo_guess_rate": 0.5}),
      data=DataConfig(max_lag=4, length_buckets=(192, 256, 384), transport_capacity=16),
      sampler=SamplerConfig(slots=8, max_seq_len=384, prefill_buckets=(32, 128, 256),
                            max_new_tokens=48, temperature=1.0),
      run=RunConfig(run_dir="runs/demo_cpu", sft_steps=400, sft_lr=3e-3, sft_batch=32,
                    sft_check_every=25, eval_every=20, eval_episodes=256, eval_samples=1,
                    eval_temperature=1.0),
  )
