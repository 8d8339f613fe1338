"""config.json -> ModelConfig: transformers' defaults, RoPE merging and frequencies,
and every unsupported value refused by name. No model is compiled here."""

import dataclasses

import numpy as np
import pytest
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import tiny
from sao_jax.models import hf, rope
from sao_jax.models.families import HF_ARCHITECTURES

_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
           "max_position_embeddings", "tie_word_embeddings")
_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
               "decoder_sparse_step", "router_aux_loss_coef")


@pytest.mark.parametrize("name", list(HF_ARCHITECTURES))
def test_missing_fields_take_transformers_defaults(name):
  """A config.json naming only its architecture loads as transformers builds it."""
  arch = HF_ARCHITECTURES[name]
  cfg = hf.config_from_hf({"architectures": [name]})
  ref = transformers.AutoConfig.for_model(arch.model_type)
  head_dim = getattr(ref, "head_dim", ref.hidden_size // ref.num_attention_heads)
  for field in _FIELDS + (_MOE_FIELDS if arch.moe else ()):
    expected = head_dim if field == "head_dim" else getattr(ref, field)
    assert getattr(cfg, field) == expected, field
  assert cfg.rope_theta == ref.rope_parameters["rope_theta"]
  assert cfg.rope_type == ref.rope_parameters["rope_type"] == "default"


def test_missing_moe_fields_are_transformers_defaults_not_ours():
  cfg = hf.config_from_hf({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8})
  assert (cfg.norm_topk_prob, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (False, 8, 768)


def _hf_config(**fields):
  return {"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 128, **fields}


def test_rope_scaling_replaces_rope_parameters_as_in_transformers():
  """Qwen's YaRN instructions on a config that export_hf wrote: rope_scaling wins."""
  scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
  fields = dict(rope_theta=5000.0, rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                rope_scaling=scaling)
  cfg = hf.config_from_hf(_hf_config(**fields))
  ref = transformers.Qwen3Config.from_dict(_hf_config(**fields)).rope_parameters
  assert (cfg.rope_type, cfg.rope_theta, cfg.rope_factor) == ("yarn", 5000.0, 4.0)
  assert (ref["rope_type"], ref["rope_theta"], ref["factor"]) == ("yarn", 5000.0, 4.0)
  assert cfg.rope_original_max_position_embeddings == 32
  # The legacy spelling `type` and a missing original length (max_position_embeddings).
  cfg = hf.config_from_hf(_hf_config(rope_scaling={"type": "linear", "factor": 2.0}))
  assert (cfg.rope_type, cfg.rope_factor, cfg.rope_theta) == ("linear", 2.0, 10_000.0)
  cfg = hf.config_from_hf(_hf_config(rope_scaling={"rope_type": "yarn", "factor": 2.0}))
  assert cfg.rope_original_max_position_embeddings == 128


def test_rope_scaling_that_would_drop_rope_theta_is_refused():
  """transformers 5 writes rope_theta only inside rope_parameters; a rope_scaling added
  next to it replaces that dict and transformers falls back to rope_theta=10000."""
  config = _hf_config(rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                      rope_scaling={"rope_type": "yarn", "factor": 4.0})
  assert transformers.Qwen3Config.from_dict(config).rope_parameters["rope_theta"] == 10_000.0
  with pytest.raises(ValueError, match=r"rope_parameters=.*rope_scaling=.*rope_theta=10000.0 "
                                       r"instead of 5000.0"):
    hf.config_from_hf(config)


@pytest.mark.parametrize("arch, fields, named", [
    ("LlamaForCausalLM", {"attention_bias": True}, "attention_bias=True"),
    ("LlamaForCausalLM", {"mlp_bias": True}, "mlp_bias=True"),
    ("Qwen2ForCausalLM", {"use_sliding_window": True}, "use_sliding_window=True"),
    ("Qwen3ForCausalLM", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("Qwen3ForCausalLM", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types="),
    ("LlamaForCausalLM", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
    ("Qwen3ForCausalLM", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_scaling.rope_type='dynamic'"),
    ("Qwen3ForCausalLM", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mscale": 0.7}},
     "rope_parameters.mscale=0.7"),
    ("LlamaForCausalLM", {"rope_parameters": {"rope_type": "default", "factor": 2.0}},
     "rope_parameters.factor=2.0"),
    ("LlamaForCausalLM", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
     r"lacks \['low_freq_factor', 'high_freq_factor'\]"),
    ("LlamaForCausalLM", {"original_max_position_embeddings": 64, "rope_parameters": {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}},
     "original_max_position_embeddings=64"),
])
def test_unsupported_values_are_refused_by_name(arch, fields, named):
  with pytest.raises(ValueError, match=named):
    hf.config_from_hf({"architectures": [arch], **fields})


def test_family_and_rope_fields_are_validated():
  with pytest.raises(ValueError, match="model.family='gemma3'"):
    dataclasses.replace(tiny.DENSE, family="gemma3").validate()
  with pytest.raises(ValueError, match="family 'llama' has no mixture-of-experts"):
    dataclasses.replace(tiny.MOE, family="llama").validate()
  with pytest.raises(ValueError, match="model.rope_type='dynamic'"):
    dataclasses.replace(tiny.DENSE, rope_type="dynamic").validate()
  with pytest.raises(ValueError, match="model.rope_factor=0.5"):
    dataclasses.replace(tiny.DENSE, rope_type="linear", rope_factor=0.5).validate()


@pytest.mark.parametrize("params", [
    {"rope_type": "default", "rope_theta": 1e6},
    {"rope_type": "linear", "rope_theta": 1e4, "factor": 3.0},
    {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 2048,
     "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False, "attention_factor": 1.3},
], ids=["default", "linear", "llama3", "yarn", "yarn_options"])
def test_rope_frequencies_equal_transformers(params):
  """f'_i and the cos/sin scaling of every rope_type, head_dim 128, against transformers."""
  config = transformers.LlamaConfig(hidden_size=1024, num_attention_heads=8, head_dim=128,
                                    max_position_embeddings=131072, rope_parameters=dict(params))
  ref = LlamaRotaryEmbedding(config)
  cfg = hf.config_from_hf({"architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
                           "num_attention_heads": 8, "head_dim": 128,
                           "max_position_embeddings": 131072, "rope_parameters": dict(params)})
  freq, scaling = rope.inverse_frequencies(cfg)
  np.testing.assert_allclose(freq, ref.inv_freq.numpy(), rtol=1e-6, atol=0)
  assert scaling == pytest.approx(ref.attention_scaling, rel=1e-7)
