"""policy_forward / value_forward: alignment, chunking, padding, MoE metric."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.models import forward, transformer, value
from tiny import DENSE, MOE, logits_forward, policy_forward, value_forward


def _batch():
  tokens = jax.random.randint(jax.random.key(1), (3, 10), 0, 256)
  mask = jnp.ones((3, 10), jnp.int32).at[0, :4].set(0).at[1, -3:].set(0)
  return tokens, mask


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_logp_and_entropy_alignment(cfg):
  params = transformer.init_params(cfg, jax.random.key(0))
  tokens, mask = _batch()
  out = policy_forward(params, cfg, tokens, mask)
  logprobs = np.asarray(jax.nn.log_softmax(logits_forward(params, cfg, tokens, mask), -1))
  tok, m = np.asarray(tokens), np.asarray(mask)
  for b in range(3):
    for t in range(10):
      scored = t > 0 and m[b, t] and m[b, t - 1]
      want_logp = logprobs[b, t - 1, tok[b, t]] if scored else 0.0
      want_ent = -np.sum(np.exp(logprobs[b, t - 1]) * logprobs[b, t - 1]) if scored else 0.0
      np.testing.assert_allclose(out.logp_BxT[b, t], want_logp, atol=1e-5, err_msg=f"logp[{b},{t}]")
      np.testing.assert_allclose(out.entropy_BxT[b, t], want_ent, atol=1e-5, err_msg=f"ent[{b},{t}]")
  assert len(out.router_logits) == (1 if cfg.num_experts else 0)


def test_chunk_size_changes_nothing_including_gradients():
  tokens, mask = _batch()
  params = transformer.init_params(MOE, jax.random.key(0))

  def loss(p, cfg):
    out = policy_forward(p, cfg, tokens, mask)
    return jnp.sum(out.logp_BxT) + 0.1 * jnp.sum(out.entropy_BxT)

  results = [jax.jit(jax.value_and_grad(loss), static_argnums=1)(
      params, dataclasses.replace(MOE, logits_chunk=c))
             for c in (3, 1024)]
  for other in results[1:]:
    np.testing.assert_allclose(other[0], results[0][0], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), other[1], results[0][1])


def test_padding_does_not_change_scores():
  params = transformer.init_params(DENSE, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(2), (1, 6), 0, 256)
  alone = policy_forward(params, DENSE, tokens, jnp.ones((1, 6), jnp.int32))
  left = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), tokens], axis=1)
  left_mask = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 6), jnp.int32)], axis=1)
  padded = policy_forward(params, DENSE, left, left_mask)
  np.testing.assert_allclose(padded.logp_BxT[:, 4:], alone.logp_BxT[:, 1:], atol=1e-5)
  right = jnp.concatenate([tokens, jnp.full((1, 2), 7, jnp.int32)], axis=1)
  right_mask = jnp.concatenate([jnp.ones((1, 6), jnp.int32), jnp.zeros((1, 2), jnp.int32)], axis=1)
  padded = policy_forward(params, DENSE, right, right_mask)
  np.testing.assert_allclose(padded.logp_BxT[:, :6], alone.logp_BxT, atol=1e-5)
  np.testing.assert_array_equal(padded.logp_BxT[:, 6:], 0.0)


def test_value_forward_alignment_and_fresh_head():
  cfg = MOE
  policy = transformer.init_params(cfg, jax.random.key(0))
  params = value.value_params_from_policy(policy, cfg)
  tokens, mask = _batch()
  np.testing.assert_array_equal(value_forward(params, cfg, tokens, mask), 0.0)
  params["value_head"]["kernel"] = jax.random.normal(jax.random.key(3), (cfg.hidden_size,))
  params["value_head"]["bias"] = jnp.asarray(0.5)
  values = np.asarray(value_forward(params, cfg, tokens, mask))
  # V(tokens[:, :t]) depends only on the prefix: changing token t leaves values[:, t] unchanged.
  changed = tokens.at[:, 6].set((tokens[:, 6] + 1) % 256)
  values2 = np.asarray(value_forward(params, cfg, changed, mask))
  np.testing.assert_allclose(values2[:, :7], values[:, :7], atol=1e-6)
  assert np.abs(values2[2, 7:] - values[2, 7:]).max() > 1e-4
  assert values[0, :5].tolist() == [0.0] * 5 and values[2, 0] == 0.0


def test_router_balance_metric():
  logits = (jnp.zeros((2, 5, 4)),)
  np.testing.assert_allclose(forward.router_balance(logits, jnp.ones((2, 5)), MOE), 1.0, rtol=1e-6)
  skewed = (jnp.zeros((2, 5, 4)).at[..., 0].set(10.0).at[..., 1].set(5.0),)
  assert forward.router_balance(skewed, jnp.ones((2, 5)), MOE) > 1.5
  assert forward.router_balance((), jnp.ones((2, 5)), DENSE) == 0.0


def test_bfloat16_forward_and_remat_run():
  cfg = dataclasses.replace(MOE, param_dtype="bfloat16", compute_dtype="bfloat16",
                            remat_policy="full")
  params = transformer.init_params(cfg, jax.random.key(0))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  tokens, mask = _batch()
  grads = jax.jit(jax.grad(lambda p: jnp.sum(forward.policy_forward(p, cfg, tokens, mask).logp_BxT)))(params)
  ref = policy_forward(transformer.init_params(MOE, jax.random.key(0)), MOE, tokens, mask)
  out = policy_forward(params, cfg, tokens, mask)
  assert out.logp_BxT.dtype == jnp.float32
  np.testing.assert_allclose(out.logp_BxT, ref.logp_BxT, atol=0.1)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
