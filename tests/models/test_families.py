"""Qwen2.5, Llama 3.x, Gemma 3 and YaRN-scaled Qwen3 against transformers: logits on padded
rows, export through sao-convert, greedy KV-cache decoding against `generate`, sharding.
(Gemma 3's sliding-window specifics: test_gemma3.py.)"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import tiny
from tiny import build_hf, hf_logits, padded_batch
from sao_jax.cli import convert
from sao_jax.config import MeshConfig
from sao_jax.models import hf, transformer, value
from sao_jax.sharding.mesh import make_mesh

# Qwen's long-context instructions: add this to the config.json of a checkpoint
# (our export_hf writes rope_parameters {rope_type: default} and a top-level
# rope_theta). Untruncated, over head_dim 8 and rope_theta 5000 it ramps dim 0
# and interpolates the rest, and scales cos/sin by 0.1 ln 4 + 1.
YARN_SCALING = {"rope_type": "yarn", "factor": 4.0, "truncate": False,
                "original_max_position_embeddings": 32}


def _qwen3_with_user_yarn(path):
  """A Qwen3 checkpoint as export_hf writes it, plus a user-added rope_scaling."""
  build_hf("dense").save_pretrained(path)
  config = json.loads((path / "config.json").read_text())
  config.update(rope_theta=5000.0, rope_scaling=YARN_SCALING)
  (path / "config.json").write_text(json.dumps(config))
  return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


# Each kind compiles its own forward (~5 s on 2 busy cores): the untied Llama (an
# lm_head entry, as in Qwen3-MoE) runs with the slow suite.
@pytest.fixture(scope="module", params=[
    "qwen2", "llama", pytest.param("llama_untied", marks=pytest.mark.slow), "qwen3_user_yarn",
    "gemma3"])
def family(request, tmp_path_factory):
  """(kind, HF model, its directory, our config and params loaded from it)."""
  path = tmp_path_factory.mktemp(request.param)
  if request.param == "qwen3_user_yarn":
    model = _qwen3_with_user_yarn(path)
  else:
    model = build_hf(request.param)
    model.save_pretrained(path)
  cfg, params = hf.load_hf(path)
  return request.param, model, path, cfg, params


def _ours(params, cfg, tokens, mask):
  return np.asarray(tiny.logits_forward(params, cfg, jnp.asarray(tokens), jnp.asarray(mask)))


def test_config_maps_family_and_rope(family):
  kind, model, _, cfg, _ = family
  expected = {"qwen2": ("qwen2", "default", True), "llama": ("llama", "llama3", True),
              "llama_untied": ("llama", "default", False),
              "qwen3_user_yarn": ("qwen3", "yarn", True), "gemma3": ("gemma3", "linear", True)}[kind]
  assert (cfg.family, cfg.rope_type, cfg.tie_word_embeddings) == expected
  rope_parameters = model.config.rope_parameters  # Gemma 3: one dict per layer type
  assert cfg.rope_theta == rope_parameters.get("full_attention", rope_parameters)["rope_theta"]


def test_logits_match_transformers_on_padded_rows(family):
  _, model, _, cfg, params = family
  tokens, mask = padded_batch()
  real = mask.astype(bool)
  np.testing.assert_allclose(_ours(params, cfg, tokens, mask)[real],
                             hf_logits(model, tokens, mask)[real], atol=1e-4, rtol=0)


def test_sao_convert_export_loads_in_transformers(family, tmp_path):
  _, model, path, _, _ = family
  convert.main(["hf-to-sao", "--hf_dir", str(path), "--out", str(tmp_path / "sao")])
  convert.main(["sao-to-hf", "--params", str(tmp_path / "sao"), "--out", str(tmp_path / "hf")])
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
  assert type(reloaded) is type(model)
  rope = reloaded.config.rope_parameters  # plus yarn's beta_fast/slow defaults, spelled out
  assert {key: rope[key] for key in model.config.rope_parameters} == model.config.rope_parameters
  tokens, mask = padded_batch(1)
  real = mask.astype(bool)
  np.testing.assert_allclose(hf_logits(reloaded, tokens, mask)[real],
                             hf_logits(model, tokens, mask)[real], atol=1e-5, rtol=0)


# Slow: compiling prefill and decode takes ~10 s per family. The default suite still
# ties decoding to transformers through the shared attention code: decoding equals
# the full forward (test_decode.py) and the full forward equals transformers (above).
@pytest.mark.slow
def test_kv_cache_greedy_decoding_equals_generate(family):
  _, model, _, cfg, params = family
  tokens, mask = padded_batch(5)
  mask[1] = 1
  mask[1, :2] = 0  # generate needs left padding: rows padded by 3, 2 and 0
  with torch.no_grad():
    ref = model.generate(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                         max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
  np.testing.assert_array_equal(tiny.greedy(params, cfg, tokens, mask, 6),
                                ref[:, tokens.shape[1]:].numpy())


def test_qkv_biases_shard_and_freeze_with_the_projections():
  cfg = dataclasses.replace(tiny.DENSE, family="qwen2")
  mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
  attn = transformer.param_shardings(cfg, mesh)["layers"][0]["attn"]
  assert tuple(attn["q_bias"].spec) == ("tensor", None)
  assert tuple(attn["k_bias"].spec) == ("tensor", None)
  assert "q_norm" not in attn
  params = transformer.abstract_params(cfg, "value")
  frozen = value.frozen_mask(params)["layers"][1]["attn"]
  assert frozen["v_bias"] and frozen["q_proj"]


@pytest.mark.slow
def test_load_onto_mesh_matches_transformers(family):
  _, model, path, _, _ = family
  mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
  cfg, params = hf.load_hf(path, mesh=mesh)
  tokens, mask = padded_batch(4)
  real = mask.astype(bool)
  with jax.set_mesh(mesh):
    ours = _ours(params, cfg, tokens, mask)
  np.testing.assert_allclose(ours[real], hf_logits(model, tokens, mask)[real], atol=1e-4, rtol=0)
