"""NF4 (QLoRA base) in bitsandbytes' layout: against a reference written from that
layout, against bitsandbytes itself where it installs, sharded over a mesh, and a
trained QLoRA adapter exported through PEFT onto a base that transformers loads in
bitsandbytes NF4."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tiny
from nf4_reference import MIDPOINTS, nf4_reference
from tiny import DENSE, build_hf, hf_logits, padded_batch

from sao_jax.config import LoraConfig, MeshConfig
from sao_jax.models import hf, lora, nf4, peft_io, transformer
from sao_jax.sharding.mesh import make_mesh

# (in, out, block): blocks within rows; blocks crossing rows (block does not divide
# in, divides in * out); and a short last block (block divides neither).
SHAPES = [(48, 6, 16), (40, 8, 32), (10, 7, 16)]


def weights(in_dim, out_dim, seed=4):
  """Random weights with an all-zero block and, in [out, in] row 0, one block of
  exact thresholds scaled by max 1."""
  w_IxO = np.asarray(jax.random.normal(jax.random.key(seed), (in_dim, out_dim))) * 0.05
  w_IxO[:, 1] = 0.0  # [out, in] row 1: all-zero blocks where blocks stay within rows
  if in_dim >= 16:
    w_IxO[:16, 0] = [1.0] + MIDPOINTS  # a tie goes to the lower level
  return w_IxO


@pytest.mark.parametrize("in_dim,out_dim,block", SHAPES)
def test_nf4_matches_the_bitsandbytes_layout_reference(in_dim, out_dim, block):
  w_IxO = weights(in_dim, out_dim)
  packed, absmax, codes, restored = nf4_reference(w_IxO, block)
  q = nf4.quantize(jnp.asarray(w_IxO), block)
  assert q["nf4_codes"].shape == (out_dim, in_dim // 2)
  assert q["nf4_absmax"].shape == nf4.absmax_shape(in_dim, out_dim, block)
  np.testing.assert_array_equal(np.asarray(q["nf4_codes"]).reshape(-1), packed)
  np.testing.assert_array_equal(np.asarray(q["nf4_absmax"]).reshape(-1), absmax)
  np.testing.assert_array_equal(np.asarray(nf4.dequantize(q, block, jnp.float32)), restored.T)
  if in_dim >= 16:
    np.testing.assert_array_equal(codes[0, :16], [15] + list(range(15)))
  # The codes are the nearest levels (up to the float32 rounding of the thresholds).
  flat = np.asarray(w_IxO, np.float32).T.reshape(-1)
  scale = np.repeat(np.where(absmax > 0, absmax, 1), block)[:flat.size]
  distance = np.abs((flat / scale)[:, None] - nf4.NF4_LEVELS[None, :])
  chosen = distance[np.arange(flat.size), codes.reshape(-1)]
  assert np.all(chosen <= distance.min(axis=1) + 1e-6)


def test_nf4_refuses_an_odd_input_size():
  with pytest.raises(ValueError, match="7 input values .odd.*lora.targets"):
    nf4.quantize(jnp.zeros((7, 4)), 16)


@pytest.mark.parametrize("in_dim,out_dim,block", [
    (128, 6, 64), (64, 8, 32), (40, 8, 32), (32, 32, 64), (96, 8, 64), (20, 7, 32)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nf4_equals_bitsandbytes(in_dim, out_dim, block, dtype):
  """bitsandbytes' own quantize_4bit / dequantize_4bit (its CPU build) on the HF
  weight: the same bytes and scales, for blocks within rows, crossing rows, and a
  short last block; the same dequantised weights where blocks stay within rows.
  (bitsandbytes 0.50.2's CPU dequantize kernel scales blocks that cross rows wrongly
  for some shapes, e.g. 96 x 8 at 64, against its own generic code and its
  quantize; the reference test covers those.)"""
  torch = pytest.importorskip("torch")
  functional = pytest.importorskip("bitsandbytes.functional")
  w_IxO = jnp.asarray(weights(in_dim, out_dim), dtype)
  weight = torch.from_numpy(np.asarray(w_IxO.T, np.float32).copy()).to(getattr(torch, dtype))
  packed, state = functional.quantize_4bit(weight, blocksize=block, quant_type="nf4")
  q = nf4.quantize(w_IxO, block)
  np.testing.assert_array_equal(np.asarray(q["nf4_codes"]).reshape(-1), packed.numpy().reshape(-1))
  np.testing.assert_array_equal(np.asarray(q["nf4_absmax"]).reshape(-1), state.absmax.numpy())
  if in_dim % block:
    return
  restored = functional.dequantize_4bit(packed, state).float().numpy()
  np.testing.assert_array_equal(np.asarray(nf4.dequantize(q, block, w_IxO.dtype), np.float32),
                                restored.T)


QLORA = LoraConfig(enabled=True, rank=4, alpha=8.0, base_quantization="nf4", quant_block=16)


@pytest.mark.parametrize("mesh_cfg,block,expected", [
    # fsdp splits the embedding dim (q_proj's input, o_proj's and down_proj's output),
    # tensor the heads and the MLP width; q_proj's 2 scales a row do not split 4 ways.
    (MeshConfig(fsdp=4, tensor=2), 16, {
        "layers/0/attn/q_proj": (("tensor", "fsdp"), ("tensor", None)),
        "layers/0/attn/o_proj": (("fsdp", "tensor"), ("fsdp", "tensor")),
        "layers/0/mlp/down_proj": (("fsdp", "tensor"), ("fsdp", "tensor"))}),
    (MeshConfig(fsdp=8), 16, {
        "layers/0/attn/q_proj": ((None, "fsdp"), (None, None)),
        "layers/0/mlp/down_proj": (("fsdp", None), ("fsdp", None))}),
    # Blocks of 64 cross q_proj's rows of 32: its scales are flat and replicated.
    (MeshConfig(fsdp=8), 64, {
        "layers/0/attn/q_proj": ((None, "fsdp"), (None,)),
        "layers/0/mlp/down_proj": (("fsdp", None), ("fsdp", None))}),
])
def test_nf4_base_shards_rows_as_output_and_columns_as_input(mesh_cfg, block, expected):
  """Codes [out, in/2] and scales [out, in/block] split like the kernel's output and
  input dims where the split is whole bytes and blocks; the sharded base merges to
  the unsharded one's policy exactly."""
  qlora = dataclasses.replace(QLORA, quant_block=block)
  mesh = make_mesh(mesh_cfg, jax.devices())
  base = lora.frozen_base(transformer.init_params(DENSE, jax.random.key(0)), DENSE, qlora)
  shardings = lora.base_shardings(DENSE, qlora, mesh)
  flat = {transformer.param_path(p): s for p, s in jax.tree_util.tree_flatten_with_path(
      shardings, is_leaf=lambda x: isinstance(x, jax.sharding.NamedSharding))[0]}
  for path, (codes_spec, scales_spec) in expected.items():
    assert tuple(flat[path + "/nf4_codes"].spec) == codes_spec, path
    assert tuple(flat[path + "/nf4_absmax"].spec) == scales_spec, path
  placed = jax.device_put(base, shardings)
  adapters = lora.init_adapters(DENSE, qlora, jax.random.key(1))
  merge = jax.jit(lora.merge, static_argnums=(2, 3))
  for x, y in zip(jax.tree.leaves(merge(placed, adapters, qlora, DENSE)),
                  jax.tree.leaves(merge(base, adapters, qlora, DENSE))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _train_adapters(held, cfg, qlora, steps=20):
  """`steps` Adam steps of next-token cross-entropy on the QLoRA model (the adapters
  through `lora.merge` of the NF4 base, as the learner trains them); returns the
  adapters and the first and last losses."""
  optax = pytest.importorskip("optax")
  tokens = jax.random.randint(jax.random.key(7), (4, 12), 0, cfg.vocab_size)
  mask = jnp.ones_like(tokens)

  def loss(adapters):
    logits = tiny.forward.logits_forward(lora.merge(held, adapters, qlora, cfg), cfg, tokens, mask)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

  optimizer = optax.adam(1e-2)
  adapters = lora.init_adapters(cfg, qlora, jax.random.key(3))
  opt_state = optimizer.init(adapters)

  @jax.jit
  def step(adapters, opt_state):
    value, grad = jax.value_and_grad(loss)(adapters)
    updates, opt_state = optimizer.update(grad, opt_state, adapters)
    return optax.apply_updates(adapters, updates), opt_state, value

  losses = []
  for _ in range(steps):
    adapters, opt_state, value = step(adapters, opt_state)
    losses.append(float(value))
  return adapters, losses[0], losses[-1]


@pytest.mark.slow  # ~15 s: a jitted training loop, torch, bitsandbytes and peft
def test_trained_qlora_adapter_reproduces_the_model_on_a_bitsandbytes_nf4_base(tmp_path):
  """A QLoRA adapter trained here, exported as PEFT, on the base that transformers
  loads in bitsandbytes NF4 (blocksize 64, its default) gives the trained model's
  logits; on the original (unquantised) base it does not."""
  torch = pytest.importorskip("torch")
  peft = pytest.importorskip("peft")
  pytest.importorskip("bitsandbytes")
  import transformers

  # Inputs that are multiples of the block: bitsandbytes' CPU kernels then compute
  # exactly what its CUDA kernels do (see test_nf4_equals_bitsandbytes).
  model = build_hf("dense", hidden_size=64, intermediate_size=128, head_dim=16)
  model.save_pretrained(tmp_path / "base")
  cfg, params = hf.load_hf(tmp_path / "base")
  qlora = dataclasses.replace(QLORA, quant_block=64)
  held = lora.frozen_base(params, cfg, qlora)
  adapters, first, last = _train_adapters(held, cfg, qlora)
  assert last < first - 0.5, (first, last)
  tokens, mask = padded_batch(1)
  real = mask.astype(bool)
  ours = np.asarray(tiny.logits_forward(lora.merge(held, adapters, qlora, cfg), cfg, tokens, mask))
  peft_io.export_peft(adapters, cfg, qlora, tmp_path / "adapter",
                      base_model=str(tmp_path / "base"))

  nf4_base = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path / "base", device_map="cpu", quantization_config=transformers.BitsAndBytesConfig(
          load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32))
  q_proj = nf4_base.model.layers[0].self_attn.q_proj
  assert q_proj.weight.quant_state.blocksize == 64 and q_proj.weight.dtype == torch.uint8
  for module in nf4_base.modules():
    # bitsandbytes' CPU-only fast path (hosts with AVX512-BF16) casts activations and
    # scales to bfloat16; its standard path, which CUDA takes for prompts, dequantises
    # the weight and multiplies in the compute dtype (float32 here).
    if hasattr(module, "support_avx512bf16_for_cpu"):
      module.support_avx512bf16_for_cpu = False
  on_nf4 = hf_logits(peft.PeftModel.from_pretrained(nf4_base, tmp_path / "adapter").eval(),
                     tokens, mask)
  on_original = hf_logits(peft.PeftModel.from_pretrained(model, tmp_path / "adapter").eval(),
                          tokens, mask)
  gap_nf4 = np.abs(on_nf4[real] - ours[real]).max()
  gap_original = np.abs(on_original[real] - ours[real]).max()
  print(f"max |logit gap|: NF4 base {gap_nf4:.2e}, original base {gap_original:.2e}")
  assert gap_nf4 < 1e-4 and gap_original > 0.1
