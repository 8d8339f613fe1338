"""HF interop: logits parity with transformers, export round trip, errors."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from sao_jax.config import MeshConfig, hf_json
from sao_jax.sharding.mesh import make_mesh
from safetensors.numpy import load_file, save_file

import tiny
from tiny import build_hf, hf_logits, padded_batch
from sao_jax.cli import convert
from sao_jax.models import hf, params_io, transformer


def _ours(params, cfg, tokens, mask):
  return np.asarray(tiny.logits_forward(params, cfg, jnp.asarray(tokens), jnp.asarray(mask)))


def test_load_matches_transformers_on_padded_batch(hf_checkpoint):
  kind, model, path = hf_checkpoint
  cfg, params = hf.load_hf(path)
  assert cfg.num_experts == (0 if kind == "dense" else 4)
  assert cfg.norm_topk_prob == (kind != "moe_unnormed")
  tokens, mask = padded_batch()
  ref = hf_logits(model, tokens, mask)
  ours = _ours(params, cfg, tokens, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)


def test_export_round_trip_through_transformers(hf_checkpoint, tmp_path):
  _, model, path = hf_checkpoint
  cfg, params = hf.load_hf(path)
  hf.export_hf(params, cfg, tmp_path / "out")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
  assert type(reloaded) is type(model)
  tokens, mask = padded_batch(1)
  real = mask.astype(bool)
  np.testing.assert_allclose(hf_logits(reloaded, tokens, mask)[real],
                             _ours(params, cfg, tokens, mask)[real], atol=1e-4, rtol=0)


def test_sharded_safetensors_index_both_ways(tmp_path):
  model = build_hf("moe", seed=3)
  model.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
  assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
  cfg, params = hf.load_hf(tmp_path / "hf")
  tokens, mask = padded_batch(2)
  real = mask.astype(bool)
  np.testing.assert_allclose(_ours(params, cfg, tokens, mask)[real],
                             hf_logits(model, tokens, mask)[real], atol=1e-4, rtol=0)
  hf.export_hf(params, cfg, tmp_path / "out", max_shard_bytes=30_000)
  index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 1
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
  np.testing.assert_allclose(hf_logits(reloaded, tokens, mask)[real],
                             hf_logits(model, tokens, mask)[real], atol=1e-5, rtol=0)


def test_cli_round_trip(hf_checkpoint, tmp_path):
  _, model, path = hf_checkpoint
  convert.main(["hf-to-sao", "--hf_dir", str(path), "--out", str(tmp_path / "sao")])
  cfg, head, params = params_io.load_params(tmp_path / "sao")
  assert head == "lm"
  convert.main(["sao-to-hf", "--params", str(tmp_path / "sao"), "--out", str(tmp_path / "hf")])
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
  tokens, mask = padded_batch(3)
  real = mask.astype(bool)
  np.testing.assert_allclose(hf_logits(reloaded, tokens, mask)[real],
                             _ours(params, cfg, tokens, mask)[real], atol=1e-4, rtol=0)


def _copy(src, dst):
  shutil.copytree(src, dst)
  return dst


def test_unsupported_architecture_is_named(hf_checkpoint, tmp_path):
  path = _copy(hf_checkpoint[2], tmp_path / "m")
  config = json.loads((path / "config.json").read_text())
  config["architectures"] = ["MistralForCausalLM"]
  (path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="MistralForCausalLM"):
    hf.load_hf(path)


def test_unsupported_rope_is_named(hf_checkpoint, tmp_path):
  config = json.loads((hf_checkpoint[2] / "config.json").read_text())
  config["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 4.0}
  with pytest.raises(ValueError, match="rope_parameters.rope_type='dynamic'"):
    hf_json.config_from_hf(config)


def test_missing_and_unexpected_tensors_are_named(hf_checkpoint, tmp_path):
  path = _copy(hf_checkpoint[2], tmp_path / "m")
  tensors = load_file(path / "model.safetensors")
  del tensors["model.layers.1.self_attn.k_proj.weight"]
  tensors["model.layers.0.mlp.extra.weight"] = np.zeros((2,), np.float32)
  save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight") as err:
    hf.load_hf(path)
  assert "model.layers.0.mlp.extra.weight" in str(err.value)


def test_wrong_tensor_shape_is_named(hf_checkpoint, tmp_path):
  path = _copy(hf_checkpoint[2], tmp_path / "m")
  tensors = load_file(path / "model.safetensors")
  tensors["model.norm.weight"] = np.ones((7,), np.float32)
  save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(ValueError, match="final_norm/scale"):
    hf.load_hf(path)


def test_params_io_round_trip_keeps_dtype(tmp_path):
  cfg = dataclasses.replace(tiny.MOE, param_dtype="bfloat16", compute_dtype="bfloat16")
  params = transformer.init_params(cfg, jax.random.key(0), head="value")
  params_io.save_params(tmp_path, params, cfg, head="value")
  cfg2, head, loaded = params_io.load_params(tmp_path)
  assert (cfg2, head) == (cfg, "value")
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
    assert a.dtype == b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_load_onto_mesh_places_each_tensor_sharded(hf_checkpoint):
  _, model, path = hf_checkpoint
  mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
  cfg, params = hf.load_hf(path, mesh=mesh)
  assert tuple(params["layers"][0]["attn"]["k_proj"].sharding.spec) == ("fsdp", "tensor", None)
  tokens, mask = padded_batch(4)
  real = mask.astype(bool)
  with jax.set_mesh(mesh):
    ours = _ours(params, cfg, tokens, mask)
  np.testing.assert_allclose(ours[real], hf_logits(model, tokens, mask)[real], atol=1e-4, rtol=0)
