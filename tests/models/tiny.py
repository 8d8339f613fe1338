"""Shared tiny configs, jitted entry points and in-process random HF checkpoints."""

import dataclasses

import jax
import numpy as np
import torch
import transformers

from sao_jax.config import ModelConfig
from sao_jax.models import decode, forward

VOCAB = 256
DENSE = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, head_dim=8,
                    num_attention_heads=4, num_key_value_heads=2, logits_chunk=4)
MOE = dataclasses.replace(DENSE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                          mlp_only_layers=(1,), tie_word_embeddings=False)

# Jitted once per config (cfg is static); eager op-by-op runs are several times slower.
policy_forward = jax.jit(forward.policy_forward, static_argnums=1)
value_forward = jax.jit(forward.value_forward, static_argnums=1)
logits_forward = jax.jit(forward.logits_forward, static_argnums=1)
extend = jax.jit(decode.extend, static_argnums=1)
decode_step = jax.jit(decode.decode_step, static_argnums=1)


def _randomize(model: torch.nn.Module, seed: int) -> None:
  """HF init is N(0, 0.02) with unit norms and a zero router, which makes logits
  nearly uniform and top-k routing ties; larger random weights make the parity
  tests sensitive to every tensor."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.2 * noise)


# A llama3 scaling whose every branch head_dim 8 reaches: it keeps f_0 (wavelength
# 6.3 < 32 / 4), blends f_1 (29.8) and divides f_2, f_3 by the factor.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
# Gemma 3: layer 0 local (window 4 < the 11-token test rows, RoPE base 100), layer 1
# global with linear scaling (as Gemma-3-4B and larger checkpoints), and an attention
# scale 12^-1/2 that is not head_dim's.
GEMMA3_FIELDS = dict(
    sliding_window=4, layer_types=["sliding_attention", "full_attention"],
    query_pre_attn_scalar=12, tie_word_embeddings=True,
    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
# kind -> (config class, model class, config fields beyond the common sizes).
FAMILY_KINDS = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(rope_theta=5000.0, tie_word_embeddings=True)),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True)),
    "llama_untied": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                     dict(rope_theta=5000.0, tie_word_embeddings=False)),
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, GEMMA3_FIELDS),
}


def build_hf(kind: str, seed: int = 0, **sizes) -> transformers.PreTrainedModel:
  """A random tiny HF model; `sizes` override the common config fields (hidden_size ...)."""
  common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                max_position_embeddings=128)
  common.update(sizes)
  if kind in FAMILY_KINDS:
    config_cls, model_cls, fields = FAMILY_KINDS[kind]
    model = model_cls(config_cls(**common, **fields))
  elif kind == "dense":
    common["rope_theta"] = 5000.0
    config = transformers.Qwen3Config(**common, tie_word_embeddings=True)
    model = transformers.Qwen3ForCausalLM(config)
  else:
    common["rope_theta"] = 5000.0
    config = transformers.Qwen3MoeConfig(**common, tie_word_embeddings=False, num_experts=4,
                                         num_experts_per_tok=2, moe_intermediate_size=16,
                                         norm_topk_prob=(kind == "moe"), mlp_only_layers=[1])
    model = transformers.Qwen3MoeForCausalLM(config)
  _randomize(model, seed)
  return model.eval()


def hf_logits(model: transformers.PreTrainedModel, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """HF logits with positions counted over real tokens (our padding convention)."""
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions))
  return out.logits.float().numpy()


def padded_batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Row 0 left-padded by 3, row 1 right-padded by 2, row 2 unpadded; T = 11."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, VOCAB, (3, 11))
  mask = np.ones((3, 11), np.int64)
  mask[0, :3] = 0
  mask[1, -2:] = 0
  return tokens, mask


def greedy(params, cfg: ModelConfig, tokens: np.ndarray, mask: np.ndarray,
           steps: int) -> np.ndarray:
  """[B, steps] tokens greedily decoded with the dense KV cache after the prompts."""
  cache = decode.init_cache(cfg, tokens.shape[0], tokens.shape[1] + steps)
  logits, cache = extend(params, cfg, cache, jax.numpy.asarray(tokens), jax.numpy.asarray(mask))
  out = []
  for _ in range(steps):
    out.append(np.asarray(jax.numpy.argmax(logits, axis=-1)))
    logits, cache = decode_step(params, cfg, cache, jax.numpy.asarray(out[-1]))
  return np.stack(out, axis=1)
