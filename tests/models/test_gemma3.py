"""Gemma 3's local (sliding-window) layers against transformers: the window matters on
the test rows, and greedy decoding through the dense and the paged KV cache equals
`generate`. (Logits parity, export and sharded loading: test_families.py.)"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import tiny
from tiny import build_hf, hf_logits, padded_batch
from sao_jax.config import MeshConfig, params_json
from sao_jax.models import hf, paged, params_io, transformer, value
from sao_jax.sharding.mesh import make_mesh

STEPS = 6
PAGE = 4
extend_paged = jax.jit(paged.extend_paged, static_argnums=(1, 7))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
  """(HF model, our config and params loaded from its directory)."""
  model = build_hf("gemma3")
  path = tmp_path_factory.mktemp("gemma3")
  model.save_pretrained(path)
  cfg, params = hf.load_hf(path)
  return model, cfg, params


@pytest.fixture(scope="module")
def prompts_and_generate(gemma):
  """Left-padded prompts (pads 3, 2, 0; 11 > window 4) and transformers' greedy tokens."""
  model, _, _ = gemma
  tokens, mask = padded_batch(5)
  mask[1] = 1
  mask[1, :2] = 0
  with torch.no_grad():
    ref = model.generate(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                         max_new_tokens=STEPS, do_sample=False, eos_token_id=None, pad_token_id=0)
  return tokens, mask, ref[:, tokens.shape[1]:].numpy()


def test_window_and_layer_types_change_the_logits(gemma):
  """The parity test sees the window: the same weights with every layer global
  (transformers) give other logits on the rows longer than the window."""
  model, cfg, _ = gemma
  assert cfg.layer_types == ("sliding_attention", "full_attention") and cfg.sliding_window == 4
  config = model.config.to_dict()
  config.update(layer_types=["full_attention"] * 2)
  global_only = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig.from_dict(config))
  global_only.load_state_dict(model.state_dict())
  tokens, mask = padded_batch()
  real = mask.astype(bool)
  windowed, full = hf_logits(model, tokens, mask), hf_logits(global_only.eval(), tokens, mask)
  assert np.abs(windowed - full)[real].max() > 0.1


def test_kv_cache_greedy_decoding_equals_generate(gemma, prompts_and_generate):
  _, cfg, params = gemma
  tokens, mask, want = prompts_and_generate
  np.testing.assert_array_equal(tiny.greedy(params, cfg, tokens, mask, STEPS), want)


@pytest.mark.slow  # compiles the paged prefill and decode (~10 s on 2 cores)
def test_paged_kv_cache_greedy_decoding_equals_generate(gemma, prompts_and_generate):
  """Rows own interleaved pages of one pool; prefill reads whole tables, decode
  reads the allocated (row, page) entries, both through the window."""
  _, cfg, params = gemma
  tokens, mask, want = prompts_and_generate
  rows = tokens.shape[0]
  per_row = -(-(tokens.shape[1] + STEPS) // PAGE)
  pages_NxM = jnp.asarray(np.arange(rows * per_row).reshape(per_row, rows).T, jnp.int32)
  cache = paged.init_paged_cache(cfg, rows * per_row, PAGE, rows)
  rows_B = jnp.arange(rows, dtype=jnp.int32)
  logits, cache = extend_paged(params, cfg, cache, pages_NxM, rows_B, jnp.asarray(tokens),
                               jnp.asarray(mask), None)
  got = []
  for _ in range(STEPS):
    got.append(np.asarray(jnp.argmax(logits, axis=-1)))
    next_Bx1 = jnp.asarray(got[-1])[:, None]
    logits, cache = extend_paged(params, cfg, cache, pages_NxM, rows_B, next_Bx1,
                                 jnp.ones((rows, 1), bool), rows * per_row)
  np.testing.assert_array_equal(np.stack(got, axis=1), want)


def test_gemma_norms_shard_and_the_critic_freezes_attention():
  cfg = dataclasses.replace(tiny.DENSE, family="gemma3", layer_types=(
      "sliding_attention", "full_attention"), sliding_window=4)
  mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
  layer = transformer.param_shardings(cfg, mesh)["layers"][0]
  for norm in ("input_norm", "post_attn_norm", "pre_mlp_norm", "post_mlp_norm"):
    assert tuple(layer[norm]["scale"].spec) == (None,)
  assert tuple(layer["attn"]["q_proj"].spec) == ("fsdp", "tensor", None)
  frozen = value.frozen_mask(transformer.abstract_params(cfg, "value"))["layers"][1]
  assert frozen["attn"]["q_norm"]["scale"] and not frozen["pre_mlp_norm"]["scale"]


def test_params_directory_keeps_the_layer_types(gemma, tmp_path):
  """sao-convert's params directory (JSON lists) loads back the same hashable config."""
  _, cfg, params = gemma
  params_io.save_params(tmp_path, params, cfg)
  loaded, head = params_json.load_model_config(tmp_path)
  assert (loaded, head) == (cfg, "lm")
  hash(loaded)  # a jit static argument
