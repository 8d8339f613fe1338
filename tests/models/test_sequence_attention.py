"""Sequences split over the mesh's sequence axis: attention of a query chunk, and the
model's forward (log-probs, entropies, values, router logits) and gradients equal to
the unsplit model's on an emulated data=2 x sequence=4 mesh, with packed rows."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from sao_jax.config import MeshConfig
from sao_jax.models import attention, forward, transformer
from sao_jax.sharding.mesh import make_mesh
from tiny import DENSE, MOE, VOCAB

ROWS, LENGTH = 4, 16  # sequence=4: 8 chunks of 2 positions, every segment crosses borders


def _packed_segments(rng, rows, length):
  """Random packed rows: segments 1, 2, ... of 1-7 tokens with padding holes between
  some and at the end, so segments and holes straddle every chunk border."""
  seg = np.zeros((rows, length), np.int32)
  for r in range(rows):
    t, k = int(rng.integers(0, 2)), 1  # row 0 or 1 starts with left padding
    while t < length:
      n = int(rng.integers(1, 8))
      seg[r, t:t + n] = k
      k += 1
      t += n + int(rng.integers(0, 2))
  return seg


def test_chunk_attention_equals_the_dense_reference_rows():
  """Queries q_start .. q_start + C - 1 of a sequence read the same keys as those rows
  of full causal attention (values and gradients), with and without a window."""
  rng = np.random.default_rng(0)
  b, t, n, k, h, start, c = 2, 16, 4, 2, 8, 6, 5
  q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
  kk = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  seg = jnp.asarray(_packed_segments(rng, b, t))
  pos = forward.positions(seg)
  cot = jnp.asarray(rng.normal(size=(b, c, n, h)), jnp.float32)
  part = slice(start, start + c)
  for window in (None, 3):
    mask = attention.CausalMask(seg, pos, window)

    def reference(q, kk, v):
      out = attention.dense_attention(q, kk, v, attention.visible_mask(mask, t))
      return jnp.sum(jnp.where((seg[:, part] != 0)[:, :, None, None], out[:, part] * cot, 0.0))

    def chunk(q, kk, v):
      out = attention.chunk_attention(q[:, part], kk, v, seg[:, part], seg, start, block=2,
                                      pos_q_BxC=pos[:, part], pos_k_BxS=pos, window=window)
      return jnp.sum(jnp.where((seg[:, part] != 0)[:, :, None, None], out * cot, 0.0))

    ref_value, ref_grads = jax.jit(jax.value_and_grad(reference, argnums=(0, 1, 2)))(q, kk, v)
    value, grads = jax.jit(jax.value_and_grad(chunk, argnums=(0, 1, 2)))(q, kk, v)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _batch(seed):
  rng = np.random.default_rng(seed)
  seg = _packed_segments(rng, ROWS, LENGTH)
  tokens = np.where(seg > 0, rng.integers(1, VOCAB, seg.shape), 0).astype(np.int32)
  weights = rng.normal(size=seg.shape).astype(np.float32)
  return tokens, seg, weights


def _outputs_and_grads(cfg, policy, critic, tokens, seg, weights):
  """Forward outputs and the gradients of a weighted sum of them, wrt both models."""
  def loss(policy, critic):
    out = forward.policy_forward(policy, cfg, tokens, seg, temperature=0.7)
    values = forward.value_forward(critic, cfg, tokens, seg)
    total = jnp.sum(weights * (out.logp_BxT + 0.5 * out.entropy_BxT + values))
    return total, (out, values)

  (_, (out, values)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
      policy, critic)
  return out, values, grads


@functools.lru_cache(maxsize=None)
def _run(cfg, mesh_cfg, seed=0):
  tokens, seg, weights = _batch(seed)
  policy = transformer.init_params(cfg, jax.random.key(1))
  critic = transformer.init_params(cfg, jax.random.key(2), head="value")
  critic["value_head"]["kernel"] = 0.1 * jax.random.normal(jax.random.key(3), (cfg.hidden_size,))
  run = jax.jit(functools.partial(_outputs_and_grads, cfg))
  if mesh_cfg is None:
    return jax.device_get(run(policy, critic, tokens, seg, weights))
  mesh = make_mesh(mesh_cfg)
  split = NamedSharding(mesh, P(("data", "expert"), "sequence"))
  with jax.set_mesh(mesh):
    args = [jax.device_put(x, split) for x in (tokens, seg, weights)]
    return jax.device_get(run(policy, critic, *args))


@pytest.mark.parametrize("cfg,mesh_cfg", [
    (DENSE, MeshConfig(data=2, fsdp=1, sequence=4)),
    # The MoE layers' expert shard_map over split tokens; the step test covers MoE too.
    pytest.param(MOE, MeshConfig(fsdp=1, sequence=4, expert=2), marks=pytest.mark.slow),
], ids=["dense", "moe"])
def test_split_forward_and_gradients_equal_unsplit(cfg, mesh_cfg):
  out, values, grads = _run(cfg, mesh_cfg)
  ref_out, ref_values, ref_grads = _run(cfg, None)
  np.testing.assert_allclose(out.logp_BxT, ref_out.logp_BxT, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out.entropy_BxT, ref_out.entropy_BxT, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(values, ref_values, rtol=1e-5, atol=1e-5)
  assert np.abs(values).max() > 1e-3 and np.abs(ref_out.logp_BxT).max() > 1.0
  assert len(out.router_logits) == len(ref_out.router_logits) == (1 if cfg.num_experts else 0)
  real = _batch(0)[1] != 0  # padding queries read no key: their outputs are arbitrary
  for got, want in zip(out.router_logits, ref_out.router_logits):
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
  got_leaves, want_leaves = jax.tree.leaves(grads), jax.tree.leaves(ref_grads)
  assert len(got_leaves) == len(want_leaves)
  for got, want in zip(got_leaves, want_leaves):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  assert max(np.abs(g).max() for g in want_leaves) > 1e-3
