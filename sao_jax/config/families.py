"""The decoder families sao_jax implements, as data: one row per family and per
Hugging Face architecture. Model code reads these switches; nothing else in the
tree branches on a family name.

  FAMILIES[cfg.family]       -> Family (what the decoder layer computes)
  HF_ARCHITECTURES[arch]     -> HfArchitecture (config.json defaults and the field
                                values sao_jax implements, for `sao_jax.config.hf_json`)

Every family is a pre-norm decoder: x + attn(norm(x)), then h + mlp(norm(h)), with
RMSNorm, rotary grouped-query attention and a gated MLP (or Qwen3-MoE experts).
They differ in:

  family  q/k RMSNorm (per head,  q/k/v projection  MoE        Gemma 3 block (below)
          before RoPE)            bias              variant
  qwen3   yes                     no                Qwen3-MoE  no
  qwen2   no                      yes               no         no   (Qwen2, Qwen2.5)
  llama   no                      no                no         no   (Llama 3.x)
  gemma3  yes                     no                no         yes  (Gemma 3 text models)

The Gemma 3 block (`gemma=True`): every RMSNorm scales by (1 + w) in float32
(w initialised to 0); the block is x + norm(attn(norm(x))), then
h + norm(mlp(norm(h))) (norms after attention and after the MLP too); the token
embedding is multiplied by sqrt(hidden_size) (rounded to the embedding dtype,
as transformers does); the MLP gate is GELU (tanh approximation) instead of
SiLU; attention scores are scaled by query_pre_attn_scalar^-1/2; and layers may
be local (`ModelConfig.layer_types` "sliding_attention": a query reads only
the `sliding_window` most recent positions, RoPE base rope_local_base_freq, no
scaling) or global (full causal attention, rope_theta and its scaling).

RoPE scaling (`ModelConfig.rope_type`) is per checkpoint, not per family
(`sao_jax.models.rope`).
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Family:
  """The architectural switches of one decoder family."""

  qk_norm: bool   # RMSNorm over head_dim on every query and key head, before RoPE
  qkv_bias: bool  # q/k/v projections add a bias: q = x W_q + b_q (o_proj has none)
  moe: bool       # has a mixture-of-experts variant (num_experts > 0)
  gemma: bool = False  # the Gemma 3 block (module docstring)


FAMILIES: Mapping[str, Family] = MappingProxyType({
    "qwen3": Family(qk_norm=True, qkv_bias=False, moe=True),
    "qwen2": Family(qk_norm=False, qkv_bias=True, moe=False),
    "llama": Family(qk_norm=False, qkv_bias=False, moe=False),
    "gemma3": Family(qk_norm=True, qkv_bias=False, moe=False, gemma=True),
})


@dataclasses.dataclass(frozen=True)
class HfArchitecture:
  """How one `architectures` entry of an HF config.json maps onto `ModelConfig`.

  `defaults`: what transformers uses for each config.json field sao_jax reads when
  the field is absent (None for num_key_value_heads: num_attention_heads; None
  for head_dim: hidden_size // num_attention_heads). `fixed`: fields whose only
  value sao_jax implements; another value is refused, and export writes these.
  """

  family: str
  moe: bool
  model_type: str
  defaults: Mapping[str, Any]
  fixed: Mapping[str, Any]


def _defaults(**fields: Any) -> Mapping[str, Any]:
  common = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, num_key_value_heads=None,
                head_dim=None)
  return MappingProxyType({**common, **fields})


_QWEN3_SIZES = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                    max_position_embeddings=32768)
_QWEN_FIXED = MappingProxyType({"hidden_act": "silu", "attention_bias": False,
                                "use_sliding_window": False})

HF_ARCHITECTURES: Mapping[str, HfArchitecture] = MappingProxyType({
    "Qwen3ForCausalLM": HfArchitecture(
        family="qwen3", moe=False, model_type="qwen3", fixed=_QWEN_FIXED,
        defaults=_defaults(**_QWEN3_SIZES, head_dim=128)),
    "Qwen3MoeForCausalLM": HfArchitecture(
        family="qwen3", moe=True, model_type="qwen3_moe", fixed=_QWEN_FIXED,
        defaults=_defaults(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                           num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                           max_position_embeddings=32768, num_experts=128,
                           num_experts_per_tok=8, moe_intermediate_size=768,
                           norm_topk_prob=False, decoder_sparse_step=1,
                           router_aux_loss_coef=0.001, mlp_only_layers=())),
    "Qwen2ForCausalLM": HfArchitecture(
        family="qwen2", moe=False, model_type="qwen2",
        fixed=MappingProxyType({"hidden_act": "silu", "use_sliding_window": False}),
        defaults=_defaults(**_QWEN3_SIZES)),
    "LlamaForCausalLM": HfArchitecture(
        family="llama", moe=False, model_type="llama",
        fixed=MappingProxyType({"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}),
        defaults=_defaults(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                           num_hidden_layers=32, num_attention_heads=32,
                           max_position_embeddings=2048)),
    # Softcapping is None in every Gemma 3 checkpoint (Gemma 2 used it); a
    # bidirectional (embedding-model) variant is not a causal LM.
    "Gemma3ForCausalLM": HfArchitecture(
        family="gemma3", moe=False, model_type="gemma3_text",
        fixed=MappingProxyType({"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
                                "attn_logit_softcapping": None, "final_logit_softcapping": None,
                                "use_bidirectional_attention": False}),
        defaults=_defaults(vocab_size=262_208, hidden_size=2304, intermediate_size=9216,
                           num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                           head_dim=256, max_position_embeddings=131_072, tie_word_embeddings=True,
                           sliding_window=4096, sliding_window_pattern=6,
                           query_pre_attn_scalar=256, rope_theta=1_000_000.0,
                           rope_local_base_freq=10_000.0)),
})


def hf_architecture(family: str, moe: bool) -> str:
  """The HF architecture name of a (family, moe) pair; ValueError if HF has none."""
  for name, arch in HF_ARCHITECTURES.items():
    if (arch.family, arch.moe) == (family, moe):
      return name
  raise ValueError(f"model.family={family!r} with num_experts > 0 has no Hugging Face "
                   f"architecture; sao_jax exports MoE models of family 'qwen3' only")
