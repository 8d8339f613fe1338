"""The Pallas splash attention kernel (`sao_jax.models.splash`), run on CPU in Pallas
interpret mode, against the dense reference: values and gradients with packed segments,
padding, GQA and a sliding window; a model's logp and gradients through it, unsharded and
on a 2 x 2 x 2 mesh; and the choice `model.attention_impl` makes ("auto" off TPU is the
blocked path; refusals name their reason)."""

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.config import MeshConfig, ModelConfig
from sao_jax.models import attention, forward, splash, transformer
from sao_jax.sharding.mesh import make_mesh, traced_on

# head_dim 128 (splash.COMPILED_HEAD_DIMS); T = 200 pads to two blocks of 128.
B, T, N, K, H, BLOCK = 3, 200, 4, 2, 128, 128
# Row 0: left padding, one segment; row 1: three packed segments, right padding; row 2:
# one segment filling the row. No segment has padding inside it (module docstring).
SEGMENTS = np.array([[0] * 30 + [1] * 170,
                     [1] * 70 + [2] * 90 + [3] * 25 + [0] * 15,
                     [1] * 200], np.int32)


def _inputs(seed):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(B, T, N, H)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(B, T, K, H)), jnp.float32) for _ in range(2))
  return q, k, v


def _grads(fn, q, k, v, cot):
  return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v) * cot), argnums=(0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("window", [None, 37], ids=["causal", "sliding_window"])
def test_splash_matches_dense_values_and_grads(window):
  q, k, v = _inputs(0)
  seg = jnp.asarray(SEGMENTS)
  pos = forward.positions(seg)
  mask = attention.CausalMask(seg, pos).windowed(window)
  visible = attention.visible_mask(mask, T)
  real = (seg != 0)[:, :, None, None]
  blocks = splash.splash_blocks(BLOCK, T)
  assert (blocks.block_q, blocks.block_kv, blocks.block_q_dkv, blocks.block_q_dq) == (128,) * 4
  kernel = lambda q, k, v: splash.splash_attention(q, k, v, seg, window, blocks)
  dense = lambda q, k, v: attention.dense_attention(q, k, v, visible)
  got = jax.jit(kernel)(q, k, v)
  np.testing.assert_allclose(got * real, dense(q, k, v) * real, atol=2e-5, rtol=2e-5)
  # Padding queries read nothing: 0, as the blocked path gives.
  np.testing.assert_array_equal(np.asarray(got)[~np.asarray(seg != 0)], 0.0)
  cot = jax.random.normal(jax.random.key(1), q.shape) * real
  for got_grad, want_grad in zip(_grads(kernel, q, k, v, cot), _grads(dense, q, k, v, cot)):
    np.testing.assert_allclose(got_grad, want_grad, atol=2e-5, rtol=2e-5)


def test_splash_sees_the_window_and_the_segments():
  """The comparison above is not vacuous: without the window, or with the rows' packed
  segments merged into one, the kernel's output differs from the windowed reference."""
  q, k, v = _inputs(2)
  seg = jnp.asarray(SEGMENTS)
  pos = forward.positions(seg)
  visible = attention.visible_mask(attention.CausalMask(seg, pos).windowed(37), T)
  want = attention.dense_attention(q, k, v, visible)
  blocks = splash.splash_blocks(BLOCK, T)
  real = np.asarray(seg != 0)
  for other_seg, window in ((seg, None), (jnp.minimum(seg, 1), 37)):
    got = splash.splash_attention(q, k, v, other_seg, window, blocks)
    assert np.abs(np.asarray(got - want))[real].max() > 0.1


DENSE_128 = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=N, num_key_value_heads=K, head_dim=H,
                        attention_block=BLOCK, logits_chunk=64)
GEMMA3_128 = dataclasses.replace(DENSE_128, family="gemma3", sliding_window=37,
                                 query_pre_attn_scalar=100.0,
                                 layer_types=("sliding_attention", "full_attention"))
ROWS = 4  # splits over data x fsdp = 4 on the mesh below


def _batch():
  rng = np.random.default_rng(3)
  seg = np.concatenate([SEGMENTS, np.array([[1] * 120 + [2] * 80], np.int32)], axis=0)
  tokens = rng.integers(0, DENSE_128.vocab_size, size=(ROWS, T)).astype(np.int32)
  return jnp.asarray(tokens), jnp.asarray(seg)


def _logp_and_grads(cfg, params, tokens, seg):
  loss = lambda p: jnp.sum(forward.policy_forward(p, cfg, tokens, seg).logp_BxT)
  return forward.policy_forward(params, cfg, tokens, seg).logp_BxT, jax.grad(loss)(params)


# Interpret mode compiles each kernel call (forward, dq, dkv per layer) as loops: the
# Gemma 3 model (its window is tested on the kernel above) is slow-tier.
@pytest.mark.parametrize("base", [DENSE_128, pytest.param(GEMMA3_128, marks=pytest.mark.slow)],
                         ids=["qwen3", "gemma3"])
def test_model_through_splash_equals_dense_unsharded_and_on_a_mesh(base):
  params = transformer.init_params(base, jax.random.key(0))
  tokens, seg = _batch()
  run = lambda cfg: jax.jit(lambda p: _logp_and_grads(cfg, p, tokens, seg))(params)
  want_logp, want_grads = run(dataclasses.replace(base, attention_impl="dense"))
  splash_cfg = dataclasses.replace(base, attention_impl="splash")
  # Rows over data x fsdp, heads over tensor: the kernel runs per device under shard_map.
  mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, expert=1), jax.devices()[:8])
  with jax.set_mesh(mesh):
    on_mesh = jax.jit(lambda p: _logp_and_grads(splash_cfg, p, tokens, seg))
    sharded = on_mesh(params)
    lowered = on_mesh.lower(params).as_text()
  assert "manual_computation" in lowered  # the kernel's shard_map
  for got_logp, got_grads in (run(splash_cfg), sharded):
    np.testing.assert_allclose(got_logp, want_logp, atol=2e-5, rtol=2e-5)
    for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
      np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-4)


def test_auto_off_tpu_is_the_blocked_path_and_says_why():
  q, k, v = _inputs(4)
  seg = jnp.asarray(SEGMENTS)
  choice = splash.traced_choice("auto", BLOCK, q, k)
  assert choice == splash.Choice("blocked", "model.attention_impl='auto' on cpu: the splash "
                                 "kernel is TPU-only")
  mask = attention.CausalMask(seg)
  np.testing.assert_array_equal(attention.attend(q, k, v, mask, "auto", BLOCK),
                                attention.attend(q, k, v, mask, "blocked", BLOCK))
  splash_choice = splash.traced_choice("splash", BLOCK, q, k)
  assert splash_choice == splash.Choice(
      "splash", "model.attention_impl='splash' on cpu, in Pallas interpret mode",
      splash.splash_blocks(BLOCK, T))


TPU = SimpleNamespace(platform="tpu")
POD = splash.SplashShapes(rows=16, seq_len=32768, num_heads=32, num_kv_heads=8, head_dim=128)


@pytest.mark.parametrize("block, mesh_shape, shapes, reason", [
    (500, {}, POD, "model.attention_block=500 is not a multiple of 128 (the kernel's lanes)"),
    (2048, {}, POD, "model.attention_block=2048 is over 1024: larger blocks run out of the "
     "kernel's VMEM on v5e"),
    (512, {}, POD._replace(head_dim=96), "head_dim=96 is not one libtpu is shown to compile "
     "the kernel for (64, 128, 256)"),
    (512, {"fsdp": 16, "tensor": 16}, POD._replace(num_heads=64, num_kv_heads=8),
     "8 KV heads do not split over mesh axis 'tensor', which splits the 64 query heads"),
    (512, {"data": 3, "fsdp": 16}, POD,
     "mesh axes ['data'] split neither the 16 rows nor the 32 heads (each device would redo "
     "another's rows)"),
])
def test_auto_on_tpu_names_what_the_kernel_refuses(block, mesh_shape, shapes, reason):
  got = splash.choose("auto", block, TPU, mesh_shape, shapes)
  assert got == splash.Choice("blocked", "model.attention_impl='auto' on tpu, and the splash "
                              f"kernel does not take this attention: {reason}")
  with pytest.raises(ValueError, match=r"model.attention_impl='splash' is invalid here: .*"
                     + reason.split(" (")[0].replace("[", r"\[").replace("]", r"\]")):
    splash.choose("splash", block, TPU, mesh_shape, shapes)


def test_auto_on_tpu_takes_the_kernel_for_the_pod_shapes():
  got = splash.choose("auto", 512, TPU, {"data": 1, "fsdp": 16, "tensor": 1, "expert": 1}, POD)
  assert got == splash.Choice("splash", "model.attention_impl='auto' on tpu",
                              splash.splash_blocks(512, POD.seq_len))
  assert splash.per_device({"fsdp": 16}, POD) == POD._replace(rows=1)
  assert splash.per_device({"fsdp": 4, "tensor": 4}, POD) == POD._replace(
      rows=4, num_heads=8, num_kv_heads=2)


def test_splash_is_refused_on_gpu():
  with pytest.raises(ValueError, match="model.attention_impl='splash' is invalid on gpu"):
    splash.choose("splash", 512, SimpleNamespace(platform="gpu"), {}, POD)


def test_learner_attention_states_the_choice_the_step_traces():
  """What the learner logs and sao-plan prints (`compile.learner_attention`, rows of one
  micro-batch): None for "dense" and "blocked"; for "auto" on the CPU mesh the blocked path."""
  from sao_jax.config import Config, LearnerConfig
  from sao_jax.learner import compile as compile_lib
  mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, expert=1), jax.devices()[:8])
  cfg = Config(model=dataclasses.replace(DENSE_128, attention_impl="auto"),
               learner=LearnerConfig(batch_trajectories=8, micro_batches=2))
  assert compile_lib.learner_attention(cfg, mesh, T) == splash.choose(
      "auto", BLOCK, jax.devices()[0], dict(mesh.shape), splash.SplashShapes(4, T, N, K, H))
  assert compile_lib.learner_attention(cfg, mesh, T).describe() == (
      "blocked (model.attention_impl='auto' on cpu: the splash kernel is TPU-only)")
  for impl in ("dense", "blocked"):
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention_impl=impl))
    assert compile_lib.learner_attention(other, mesh, T) is None
