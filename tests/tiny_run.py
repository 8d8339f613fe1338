"""The tiny demo run the end-to-end CLI tests share: `configs/demo_cpu.py` shrunk to a
model of hidden size 32 and a few episodes, evaluated and checkpointed every 2 steps."""

TINY_MODEL = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
    "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.vocab_size=384",
]
TINY_RUN = TINY_MODEL + [
    "learner.batch_trajectories=8", "learner.critic_warmup_steps=1",
    "run.sft_steps=2", "run.sft_batch=4", "run.eval_episodes=4", "run.eval_every=2",
    "sampler.slots=8", "sampler.max_new_tokens=24", "checkpoint.save_every_steps=2",
]
