"""config.json -> ModelConfig: transformers' defaults, RoPE merging and frequencies,
and every unsupported value refused by name. No model is compiled here."""

import dataclasses

import numpy as np
import pytest
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import tiny
from sao_jax.config import hf_json
from sao_jax.config.families import HF_ARCHITECTURES
from sao_jax.models import rope

_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
           "max_position_embeddings", "tie_word_embeddings")
_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
               "decoder_sparse_step", "router_aux_loss_coef")


@pytest.mark.parametrize("name", list(HF_ARCHITECTURES))
def test_missing_fields_take_transformers_defaults(name):
  """A config.json naming only its architecture loads as transformers builds it."""
  arch = HF_ARCHITECTURES[name]
  cfg = hf_json.config_from_hf({"architectures": [name]})
  ref = transformers.AutoConfig.for_model(arch.model_type)
  head_dim = getattr(ref, "head_dim", ref.hidden_size // ref.num_attention_heads)
  for field in _FIELDS + (_MOE_FIELDS if arch.moe else ()):
    expected = head_dim if field == "head_dim" else getattr(ref, field)
    assert getattr(cfg, field) == expected, field
  # Gemma 3 keeps one dict per layer type; the rope_* fields are the global layers'.
  rope_parameters = ref.rope_parameters.get("full_attention", ref.rope_parameters)
  assert cfg.rope_theta == rope_parameters["rope_theta"]
  assert cfg.rope_type == rope_parameters["rope_type"] == "default"
  if arch.family == "gemma3":
    assert list(cfg.layer_types) == ref.layer_types
    assert (cfg.sliding_window, cfg.query_pre_attn_scalar) == (ref.sliding_window,
                                                               ref.query_pre_attn_scalar)
    assert cfg.rope_local_base_freq == ref.rope_parameters["sliding_attention"]["rope_theta"]


def test_missing_moe_fields_are_transformers_defaults_not_ours():
  cfg = hf_json.config_from_hf({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8})
  assert (cfg.norm_topk_prob, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (False, 8, 768)


def _hf_config(**fields):
  return {"architectures": ["Qwen3ForCausalLM"], "max_position_embeddings": 128, **fields}


def test_rope_scaling_replaces_rope_parameters_as_in_transformers():
  """Qwen's YaRN instructions on a config that export_hf wrote: rope_scaling wins."""
  scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
  fields = dict(rope_theta=5000.0, rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                rope_scaling=scaling)
  cfg = hf_json.config_from_hf(_hf_config(**fields))
  ref = transformers.Qwen3Config.from_dict(_hf_config(**fields)).rope_parameters
  assert (cfg.rope_type, cfg.rope_theta, cfg.rope_factor) == ("yarn", 5000.0, 4.0)
  assert (ref["rope_type"], ref["rope_theta"], ref["factor"]) == ("yarn", 5000.0, 4.0)
  assert cfg.rope_original_max_position_embeddings == 32
  # The legacy spelling `type` and a missing original length (max_position_embeddings).
  cfg = hf_json.config_from_hf(_hf_config(rope_scaling={"type": "linear", "factor": 2.0}))
  assert (cfg.rope_type, cfg.rope_factor, cfg.rope_theta) == ("linear", 2.0, 10_000.0)
  cfg = hf_json.config_from_hf(_hf_config(rope_scaling={"rope_type": "yarn", "factor": 2.0}))
  assert cfg.rope_original_max_position_embeddings == 128


# Gemma-3-1b-it's config.json as published (transformers 4.50 spelling); Gemma-3-4b and
# larger add rope_scaling {"rope_type": "linear", "factor": 8.0} for the global layers.
GEMMA3_1B_OLD_FORMAT = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512,
    "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 262144}


@pytest.mark.parametrize("rope_scaling", [None, {"rope_type": "linear", "factor": 8.0}])
def test_gemma3_old_format_maps_as_transformers_reads_it(rope_scaling):
  """sliding_window_pattern, rope_local_base_freq and rope_scaling (transformers 4.x
  spelling) become layer_types and the per-layer-type RoPE transformers 5 builds."""
  config = {**GEMMA3_1B_OLD_FORMAT, "rope_scaling": rope_scaling}
  cfg = hf_json.config_from_hf(config)
  ref = transformers.Gemma3TextConfig.from_dict(config)
  assert list(cfg.layer_types) == ref.layer_types
  assert cfg.layer_types.count("full_attention") == 4  # layers 6, 12, 18, 24
  full, local = ref.rope_parameters["full_attention"], ref.rope_parameters["sliding_attention"]
  assert (cfg.rope_type, cfg.rope_theta, cfg.rope_factor) == (
      full["rope_type"], full["rope_theta"], full.get("factor", 1.0))
  assert (local["rope_type"], cfg.rope_local_base_freq) == ("default", local["rope_theta"])
  assert (cfg.sliding_window, cfg.query_pre_attn_scalar, cfg.param_dtype) == (512, 256, "bfloat16")
  # export_hf writes the transformers 5 spelling, which reads back the same.
  assert hf_json.config_from_hf(hf_json.hf_config(cfg)) == cfg
  assert transformers.Gemma3TextConfig.from_dict(hf_json.hf_config(cfg)).rope_parameters == (
      ref.rope_parameters)


def test_rope_scaling_that_would_drop_rope_theta_is_refused():
  """transformers 5 writes rope_theta only inside rope_parameters; a rope_scaling added
  next to it replaces that dict and transformers falls back to rope_theta=10000."""
  config = _hf_config(rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                      rope_scaling={"rope_type": "yarn", "factor": 4.0})
  assert transformers.Qwen3Config.from_dict(config).rope_parameters["rope_theta"] == 10_000.0
  with pytest.raises(ValueError, match=r"rope_parameters=.*rope_scaling=.*rope_theta=10000.0 "
                                       r"instead of 5000.0"):
    hf_json.config_from_hf(config)


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
    ("Gemma3ForCausalLM", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0"),
    ("Gemma3ForCausalLM", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0"),
    ("Gemma3ForCausalLM", {"hidden_activation": "gelu"}, "hidden_activation='gelu'"),
    ("Gemma3ForCausalLM", {"use_bidirectional_attention": True},
     "use_bidirectional_attention=True"),
    ("Gemma3ForCausalLM", {"sliding_window_pattern": 0}, "sliding_window_pattern=0"),
    ("Gemma3ForCausalLM", {"layer_types": ["chunked_attention"] * 26}, "model.layer_types="),
    ("Gemma3ForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_parameters.rope_theta=10000.0"),
    ("Gemma3ForCausalLM", {"rope_parameters": {"sliding_attention": {
        "rope_type": "linear", "factor": 2.0}}}, "rope_parameters.sliding_attention="),
    ("Gemma3ForCausalLM", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_parameters.full_attention.rope_type='dynamic'"),
])
def test_unsupported_values_are_refused_by_name(arch, fields, named):
  with pytest.raises(ValueError, match=named):
    hf_json.config_from_hf({"architectures": [arch], **fields})


def test_family_and_rope_fields_are_validated():
  with pytest.raises(ValueError, match="model.family='gemma2'"):
    dataclasses.replace(tiny.DENSE, family="gemma2").validate()
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
  cfg = hf_json.config_from_hf({"architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
                           "num_attention_heads": 8, "head_dim": 128,
                           "max_position_embeddings": 131072, "rope_parameters": dict(params)})
  freq, scaling = rope.inverse_frequencies(cfg)
  np.testing.assert_allclose(freq, ref.inv_freq.numpy(), rtol=1e-6, atol=0)
  assert scaling == pytest.approx(ref.attention_scaling, rel=1e-7)


def test_sliding_window_fields_are_validated():
  local_global = ("sliding_attention", "full_attention")
  gemma = dataclasses.replace(tiny.DENSE, family="gemma3", layer_types=local_global,
                              sliding_window=4, query_pre_attn_scalar=12.0)
  gemma.validate()
  for fields, named in [
      (dict(family="llama"), "family 'llama' has no sliding-window layers"),
      (dict(family="qwen3", layer_types=()),
       "model.query_pre_attn_scalar=12.0 is invalid: family 'qwen3' scales attention by head_dim"),
      (dict(layer_types=local_global[:1]), "one entry per layer"),
      (dict(layer_types=("sliding_attention", "local")), r"\['local'\] are not layer types"),
      (dict(sliding_window=None), "model.sliding_window=None"),
      (dict(sliding_window=0), "model.sliding_window=0"),
      (dict(scan_layers=True), "model.scan_layers=True.*mixes sliding and full"),
      (dict(query_pre_attn_scalar=0.0), "model.query_pre_attn_scalar=0.0"),
      (dict(rope_local_base_freq=-1.0), "model.rope_local_base_freq=-1.0")]:
    with pytest.raises(ValueError, match=named):
      dataclasses.replace(gemma, **fields).validate()
  # Identical layers scan: all local (or all global) Gemma 3 layers.
  dataclasses.replace(gemma, layer_types=local_global[:1] * 2, scan_layers=True).validate()


def test_gemma3_local_and_global_rope_equal_transformers():
  """Local layers: default RoPE of base rope_local_base_freq; global: rope_theta with
  Gemma-3-4B's linear scaling (head_dim 256)."""
  from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
  config = {**GEMMA3_1B_OLD_FORMAT, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
  ref = Gemma3RotaryEmbedding(transformers.Gemma3TextConfig.from_dict(config))
  cfg = hf_json.config_from_hf(config)
  for index, kind in ((0, "sliding_attention"), (5, "full_attention")):
    assert cfg.layer_types[index] == kind
    freq, scaling = rope.layer_frequencies(cfg, index)
    np.testing.assert_allclose(freq, getattr(ref, f"{kind}_inv_freq").numpy(), rtol=1e-6, atol=0)
    assert scaling == getattr(ref, f"{kind}_attention_scaling") == 1.0


@pytest.mark.parametrize("name", list(HF_ARCHITECTURES))
def test_model_type_that_disagrees_with_architectures_is_refused(name):
  """transformers' AutoModel builds the class of model_type: a Qwen3ForCausalLM
  directory saying model_type "gpt2" would load there as GPT-2."""
  arch = HF_ARCHITECTURES[name]
  assert hf_json.config_from_hf({"architectures": [name], "model_type": arch.model_type}).family \
      == arch.family
  with pytest.raises(ValueError, match=rf"model_type='gpt2' but architectures \['{name}'\], "
                                       rf"whose model_type is '{arch.model_type}'"):
    hf_json.config_from_hf({"architectures": [name], "model_type": "gpt2"})
