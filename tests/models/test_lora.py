"""LoRA adapters: step-0 identity, gradient = dense gradient projected onto the
adapters, PEFT and merged-HF exports checked against transformers + peft."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import tiny
from nf4_reference import nf4_reference
from tiny import DENSE, MOE, build_hf, hf_logits, padded_batch

from sao_jax.config import LoraConfig
from sao_jax.models import hf, lora, nf4, peft_io, transformer

LORA = LoraConfig(enabled=True, rank=4, alpha=8.0)


def _random_b(adapters, seed=1):
  """Adapters with B drawn N(0, 0.1) instead of zero, so both gradients are nonzero."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(adapters)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [
      0.1 * jax.random.normal(k, x.shape) if transformer.param_path(p).endswith("/b") else x
      for k, (p, x) in zip(keys, leaves)])


@pytest.fixture(scope="module")
def base():
  return transformer.init_params(DENSE, jax.random.key(0))


def test_zero_b_gives_the_base_model_exactly(base):
  adapters = lora.init_adapters(DENSE, LORA, jax.random.key(1))
  assert all(np.any(np.asarray(ab["a"]) != 0) and not np.any(np.asarray(ab["b"]))
             for ab in lora.flat_adapters(adapters).values())
  tokens, mask = padded_batch()
  merged = jax.jit(lora.merge, static_argnums=(2, 3))(base, adapters, LORA, DENSE)
  np.testing.assert_array_equal(np.asarray(tiny.logits_forward(merged, DENSE, tokens, mask)),
                                np.asarray(tiny.logits_forward(base, DENSE, tokens, mask)))


@pytest.mark.slow  # ~15 s on 2 cores: compiles the backward pass twice
def test_adapter_gradient_is_dense_gradient_projected(base):
  """dL/dA = s G B^T and dL/dB = s A^T G, with G = dL/dW' of the merged model."""
  adapters = _random_b(lora.init_adapters(DENSE, LORA, jax.random.key(1)))
  tokens, mask = padded_batch()
  probe = jax.random.normal(jax.random.key(2), (*tokens.shape, DENSE.vocab_size))

  def loss(params):
    return jnp.sum(tiny.forward.logits_forward(params, DENSE, tokens, mask) * probe)

  merged = lora.merge(base, adapters, LORA, DENSE)
  dense_grad = jax.jit(jax.grad(loss))(merged)
  adapter_grad = jax.jit(jax.grad(lambda a: loss(lora.merge(base, a, LORA, DENSE))))(adapters)
  dense = {transformer.param_path(p): g
           for p, g in jax.tree_util.tree_flatten_with_path(dense_grad)[0]}
  shapes = lora.adapter_paths(DENSE, LORA)
  assert set(lora.flat_adapters(adapter_grad)) == set(shapes)
  s = LORA.scale
  for path, got in lora.flat_adapters(adapter_grad).items():
    g_IxO = np.asarray(dense[path], np.float64).reshape(shapes[path])
    a, b = (np.asarray(x, np.float64) for x in (lora.flat_adapters(adapters)[path]["a"],
                                                 lora.flat_adapters(adapters)[path]["b"]))
    scale_a, scale_b = np.abs(s * g_IxO @ b.T).max(), np.abs(s * a.T @ g_IxO).max()
    np.testing.assert_allclose(got["a"], s * g_IxO @ b.T, rtol=0, atol=1e-5 * scale_a, err_msg=path)
    np.testing.assert_allclose(got["b"], s * a.T @ g_IxO, rtol=0, atol=1e-5 * scale_b, err_msg=path)


@pytest.mark.slow  # ~10 s: torch + peft
def test_peft_and_merged_exports_match_transformers(tmp_path):
  peft = pytest.importorskip("peft")
  model = build_hf("dense")
  model.save_pretrained(tmp_path / "base")
  cfg, base_params = hf.load_hf(tmp_path / "base")
  adapters = _random_b(lora.init_adapters(cfg, LORA, jax.random.key(3)))
  merged = lora.merge(base_params, adapters, LORA, cfg)
  tokens, mask = padded_batch(1)
  real = mask.astype(bool)
  ours = np.asarray(tiny.logits_forward(merged, cfg, tokens, mask))
  assert np.abs(ours - np.asarray(tiny.logits_forward(base_params, cfg, tokens, mask))).max() > 0.1

  peft_io.export_peft(adapters, cfg, LORA, tmp_path / "adapter", base_model=str(tmp_path / "base"))
  with_adapter = peft.PeftModel.from_pretrained(model, tmp_path / "adapter").eval()
  np.testing.assert_allclose(hf_logits(with_adapter, tokens, mask)[real], ours[real],
                             atol=1e-4, rtol=0)

  hf.export_hf(merged, cfg, tmp_path / "merged")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
  np.testing.assert_allclose(hf_logits(reloaded, tokens, mask)[real], ours[real], atol=1e-4, rtol=0)


def test_bad_targets_are_named():
  with pytest.raises(ValueError, match="lora.targets.*'qkv'"):
    LoraConfig(targets=("q_proj", "qkv")).validate()
  with pytest.raises(ValueError, match="lora.rank=0"):
    LoraConfig(rank=0).validate()
  with pytest.raises(ValueError, match="lora.alpha=-1.0"):
    LoraConfig(alpha=-1.0).validate()
  with pytest.raises(ValueError, match=r"mlp/\w+_proj has shape \(4, .*not a dense 2-d kernel"):
    lora.adapter_paths(dataclasses.replace(MOE, mlp_only_layers=()), LORA)


QLORA = dataclasses.replace(LORA, base_quantization="nf4", quant_block=16)


@pytest.mark.slow  # a Python-loop NF4 of every kernel, and a merge compile
def test_qlora_base_is_nf4_and_step_zero_is_its_dequantization(base):
  """The base is held as NF4 codes; zero-B adapters give exactly the model whose
  targeted kernels are the bitsandbytes-layout loop reference's dequantization."""
  held = lora.frozen_base(base, DENSE, QLORA)
  paths = lora.adapter_paths(DENSE, QLORA)
  reference = {}
  for keypath, w in jax.tree_util.tree_flatten_with_path(base)[0]:
    path = transformer.param_path(keypath)
    reference[path] = (nf4_reference(np.asarray(w).reshape(paths[path]), 16)[3].T.reshape(w.shape)
                       if path in paths else np.asarray(w))
  dequantized = jax.tree.unflatten(jax.tree.structure(base), list(reference.values()))
  # Targeted kernels: half a byte a value plus a float32 scale per 16, against 4 bytes.
  held_flat = {transformer.param_path(p): x for p, x in jax.tree_util.tree_flatten_with_path(
      held, is_leaf=nf4.is_quantized)[0]}
  assert all(held_flat[path]["nf4_codes"].dtype == jnp.uint8 for path in paths)
  assert (sum(x.nbytes for path in paths for x in held_flat[path].values())
          == sum(i * o // 2 + i * o // 16 * 4 for i, o in paths.values()))
  adapters = lora.init_adapters(DENSE, QLORA, jax.random.key(1))
  merged = jax.jit(lora.merge, static_argnums=(2, 3))(held, adapters, QLORA, DENSE)
  tokens, mask = padded_batch()
  np.testing.assert_array_equal(np.asarray(tiny.logits_forward(merged, DENSE, tokens, mask)),
                                np.asarray(tiny.logits_forward(dequantized, DENSE, tokens, mask)))
