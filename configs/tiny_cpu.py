"""Tiny dense Qwen3-style model with the paper's SAO settings, sized for a laptop CPU.

The base that tests and the CPU demo configs build on. Inspect the resolved
config, with overrides, with:

    .venv/bin/python -m sao_jax.config configs/tiny_cpu.py --set algorithm.eps_low=0.2
"""

from sao_jax.config import AlgorithmConfig, Config, MeshConfig, ModelConfig


def get_config() -> Config:
  return Config(
      name="tiny_cpu",
      seed=0,
      mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=1),
      model=ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16),
      # Paper values for math/tool reasoning: DIS band (0.7, 6.0), K = 2, frozen attention.
      algorithm=AlgorithmConfig.for_variant("sao", eps_low=0.3, eps_high=5.0),
  )
