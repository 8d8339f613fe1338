"""Blocked (flash) attention against the dense reference: kernels, full model, remat."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.config import ModelConfig
from sao_jax.models import attention, forward, transformer
from tiny import DENSE, MOE, padded_batch


def _inputs(seed, b=3, t=13, n=4, k=2, h=8):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
  kk = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  valid = np.ones((b, t), bool)
  valid[0, :4] = False    # left padding
  valid[1, -3:] = False   # right padding
  valid[2, 5] = False     # a hole in the middle
  return q, kk, v, jnp.asarray(valid)


def _dense(q, k, v, valid):
  return attention.dense_attention(q, k, v, attention.visible_mask(attention.CausalMask(valid),
                                                                   q.shape[1]))


def _has_key(valid):
  """[B, T, 1, 1]: query t sees at least one key, i.e. is not padding (a padding
  query reads nothing, where dense and blocked differ by design)."""
  return valid[:, :, None, None]


@pytest.mark.parametrize("block", [1, 4, 5, 13, 64])
def test_blocked_matches_dense_values_and_grads(block):
  q, k, v, valid = _inputs(0)
  cot = jax.random.normal(jax.random.key(1), q.shape) * _has_key(valid)
  blocked = jax.jit(lambda q, k, v: attention.blocked_attention(q, k, v, valid, block))
  dense = jax.jit(lambda q, k, v: _dense(q, k, v, valid))
  np.testing.assert_allclose(blocked(q, k, v) * _has_key(valid), dense(q, k, v) * _has_key(valid),
                             atol=1e-5, rtol=1e-5)
  grad = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * cot), argnums=(0, 1, 2)))
  for got, want in zip(grad(blocked)(q, k, v), grad(dense)(q, k, v)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def _loop_window_mask(seg, pos, window):
  """visible[b, t, s] by the definition: same nonzero segment, s <= t, pos[t] - pos[s] < window."""
  b, t = seg.shape
  visible = np.zeros((b, t, t), bool)
  for r in range(b):
    for i in range(t):
      for j in range(i + 1):
        visible[r, i, j] = seg[r, i] == seg[r, j] != 0 and pos[r, i] - pos[r, j] < window
  return visible


def test_sliding_window_blocked_matches_dense_and_the_definition():
  """Gemma 3's local layers: packed segments, left/right padding and a hole (where index
  and position distances differ), window 3; values and gradients over 4 blocks (the
  last one padded)."""
  block = 4
  q, k, v, _ = _inputs(5)
  seg = np.array([[0] * 4 + [1] * 9, [1] * 5 + [2] * 5 + [0] * 3, [1] * 5 + [0] + [1] * 7])
  seg = jnp.asarray(seg, jnp.int32)
  pos = forward.positions(seg)
  mask = attention.CausalMask(seg, pos).windowed(3)
  visible = attention.visible_mask(mask, q.shape[1])
  np.testing.assert_array_equal(visible, _loop_window_mask(np.asarray(seg), np.asarray(pos), 3))
  has_key = _has_key(seg != 0)
  cot = jax.random.normal(jax.random.key(2), q.shape) * has_key
  blocked = jax.jit(lambda q, k, v: attention.blocked_attention(q, k, v, seg, block, pos, 3))
  dense = jax.jit(lambda q, k, v: attention.dense_attention(q, k, v, visible))
  np.testing.assert_allclose(blocked(q, k, v) * has_key, dense(q, k, v) * has_key,
                             atol=1e-5, rtol=1e-5)
  grad = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * cot), argnums=(0, 1, 2)))
  for got, want in zip(grad(blocked)(q, k, v), grad(dense)(q, k, v)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="sliding window .3. needs positions_BxS"):
    attention.CausalMask(seg).windowed(3)


def test_blocked_gives_zero_for_rows_without_visible_keys():
  q, k, v, valid = _inputs(2)
  out = attention.blocked_attention(q, k, v, valid, 4)
  np.testing.assert_array_equal(out[0, :4], 0.0)
  assert bool(jnp.all(jnp.isfinite(out)))


def test_blocked_rejects_cross_attention_and_bad_block():
  q, k, v, valid = _inputs(3)
  with pytest.raises(ValueError, match="key length 6 != query length 13"):
    attention.blocked_attention(q, k[:, :6], v[:, :6], valid[:, :6], 4)
  with pytest.raises(ValueError, match="block=0"):
    attention.blocked_attention(q, k, v, valid, 0)
  with pytest.raises(ValueError, match="impl='flash'"):
    attention.attend(q, k, v, attention.CausalMask(valid), "flash", 4)


def test_attend_runs_dense_for_an_explicit_mask():
  q, k, v, valid = _inputs(4)
  visible = attention.visible_mask(attention.CausalMask(valid), q.shape[1])
  np.testing.assert_array_equal(attention.attend(q, k, v, visible, "blocked", 4),
                                attention.dense_attention(q, k, v, visible))


GEMMA3 = dataclasses.replace(DENSE, family="gemma3", sliding_window=4, query_pre_attn_scalar=12,
                             layer_types=("sliding_attention", "full_attention"))


@pytest.mark.parametrize("base", [DENSE, MOE, pytest.param(GEMMA3, marks=pytest.mark.slow)],
                         ids=["dense", "moe", "gemma3"])
def test_model_blocked_equals_dense(base):
  dense_cfg = dataclasses.replace(base, attention_impl="dense")
  blocked_cfg = dataclasses.replace(base, attention_impl="blocked", attention_block=4)
  params = transformer.init_params(base, jax.random.key(0))
  tokens, mask = padded_batch()

  def logp_and_grads(cfg):
    def loss(p):
      return jnp.sum(forward.policy_forward(p, cfg, tokens, mask).logp_BxT)
    logp = forward.policy_forward(params, cfg, tokens, mask).logp_BxT
    return logp, jax.grad(loss)(params)

  want_logp, want_grads = jax.jit(lambda: logp_and_grads(dense_cfg))()
  got_logp, got_grads = jax.jit(lambda: logp_and_grads(blocked_cfg))()
  np.testing.assert_allclose(got_logp, want_logp, atol=1e-5, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


REMAT_BASE = dataclasses.replace(DENSE, attention_impl="blocked", attention_block=4)


def _remat_grads(cfg):
  params = transformer.init_params(REMAT_BASE, jax.random.key(1))
  tokens, mask = padded_batch(1)
  loss = lambda p: jnp.sum(forward.policy_forward(p, cfg, tokens, mask).logp_BxT)
  return jax.jit(jax.grad(loss))(params)


@pytest.fixture(scope="module")
def no_remat_grads():
  return _remat_grads(REMAT_BASE)


@pytest.mark.parametrize("policy", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable"])
def test_remat_policies_keep_gradients(policy, no_remat_grads):
  got = _remat_grads(dataclasses.replace(REMAT_BASE, remat_policy=policy))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(no_remat_grads)):
    np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-5)


def test_config_rejects_unknown_attention_and_remat_names():
  with pytest.raises(ValueError, match="model.attention_impl='flash'"):
    ModelConfig(attention_impl="flash").validate()
  with pytest.raises(ValueError, match="model.remat_policy='some'"):
    ModelConfig(remat_policy="some").validate()
  with pytest.raises(ValueError, match="model.attention_block=0"):
    ModelConfig(attention_block=0).validate()


def test_blocked_attention_under_a_layer_scan_keeps_no_per_block_pair_arrays():
  """Differentiating layers scanned over blocked attention must not materialise
  anything per (query block, key block) pair: the [nb, nb, B, K, G, C, C] masks
  that JAX's loop-invariant hoisting once built cost 8 GiB each at 32K tokens."""
  nb, block = 4, 16
  q = jax.random.normal(jax.random.key(0), (1, nb * block, 4, 8))
  segments = jnp.ones((1, nb * block), jnp.int32)

  def layer(x):
    return jnp.tanh(attention.blocked_attention(x, x[:, :, :2], x[:, :, 2:], segments, block))

  def loss(x):
    y, _ = jax.lax.scan(lambda c, _: (layer(c), None), x, None, length=2)
    return jnp.sum(y)

  shapes = set()

  def collect(jaxpr):
    for eqn in jaxpr.eqns:
      shapes.update(tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars)
      for param in jax.tree.leaves(eqn.params, is_leaf=lambda p: hasattr(p, "eqns")):
        inner = getattr(param, "jaxpr", param)
        if hasattr(inner, "eqns"):
          collect(inner)

  collect(jax.make_jaxpr(jax.grad(loss))(q).jaxpr)
  per_pair = {s for s in shapes if len(s) >= 3 and s[:2] == (nb, nb) and s[-1] == block}
  assert not per_pair, f"per block pair arrays: {sorted(per_pair)}"
  assert (nb, block) in {s[:1] + s[-1:] for s in shapes if len(s) > 2}  # the walk saw the blocks
