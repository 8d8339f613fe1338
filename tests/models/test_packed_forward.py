"""Sequence packing in the model: a packed row scores each trajectory as if it were alone."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.models import attention, forward, transformer
from tiny import DENSE, VOCAB

# Lengths of the trajectories, and how they are packed: two rows of 16 tokens.
LENGTHS = (5, 7, 3, 9, 6)
PACKED_ROWS = ((0, 1, 2), (3, 4))  # row 0: 15 tokens + 1 padding; row 1: 15 + 1
ROW = 16


def _trajectories(seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, VOCAB, n).astype(np.int32) for n in LENGTHS]


def _unpacked(trajs):
  """One trajectory per row, right-padded to the longest."""
  tokens = np.zeros((len(trajs), max(LENGTHS)), np.int32)
  mask = np.zeros_like(tokens)
  for r, traj in enumerate(trajs):
    tokens[r, :len(traj)] = traj
    mask[r, :len(traj)] = 1
  return tokens, mask


def _packed(trajs):
  """PACKED_ROWS as segment ids 1, 2, ...; also where each trajectory landed."""
  tokens = np.zeros((len(PACKED_ROWS), ROW), np.int32)
  seg = np.zeros_like(tokens)
  where = {}
  for r, members in enumerate(PACKED_ROWS):
    start = 0
    for k, i in enumerate(members, start=1):
      n = len(trajs[i])
      tokens[r, start:start + n] = trajs[i]
      seg[r, start:start + n] = k
      where[i] = (r, slice(start, start + n))
      start += n
  return tokens, seg, where


# Gemma 3 with a window (4) shorter than most trajectories: local layers count
# distances within the segment.
GEMMA3 = dataclasses.replace(DENSE, family="gemma3", sliding_window=4,
                             layer_types=("sliding_attention", "full_attention"))


@pytest.mark.parametrize("impl,block,base", [
    ("dense", 512, DENSE), ("blocked", 4, DENSE), ("blocked", 3, DENSE),
    pytest.param("dense", 512, GEMMA3, marks=pytest.mark.slow, id="gemma3-dense"),
    pytest.param("blocked", 3, GEMMA3, marks=pytest.mark.slow, id="gemma3-blocked")])
def test_packed_row_equals_each_trajectory_alone(impl, block, base):
  """logp, entropy and values of a packed row equal the unpacked rows (fp32)."""
  cfg = dataclasses.replace(base, attention_impl=impl, attention_block=block)
  policy = transformer.init_params(cfg, jax.random.key(0))
  critic = transformer.init_params(cfg, jax.random.key(1), head="value")
  # A non-zero head, so the values depend on the trunk (the fresh head is zero).
  critic["value_head"]["kernel"] = jax.random.normal(jax.random.key(2),
                                                     critic["value_head"]["kernel"].shape)
  trajs = _trajectories()
  u_tokens, u_mask = _unpacked(trajs)
  p_tokens, p_seg, where = _packed(trajs)

  def scores(tokens, seg):
    out = forward.policy_forward(policy, cfg, tokens, seg, temperature=0.8)
    return out.logp_BxT, out.entropy_BxT, forward.value_forward(critic, cfg, tokens, seg)

  unpacked = jax.jit(scores)(u_tokens, u_mask)
  packed = jax.jit(scores)(p_tokens, p_seg)
  for name, u, p in zip(("logp", "entropy", "values"), unpacked, packed):
    u, p = np.asarray(u), np.asarray(p)
    for i, (row, span) in where.items():
      np.testing.assert_allclose(p[row, span], u[i, :LENGTHS[i]], rtol=1e-5, atol=1e-6,
                                 err_msg=f"{name} of trajectory {i}")
      # The first token of a segment has no prefix in it: never scored from the
      # previous trajectory's last token.
      assert p[row, span.start] == 0.0, (name, i)
    np.testing.assert_array_equal(p[p_seg == 0], 0.0)


def test_positions_restart_per_segment():
  seg = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0],
                     [0, 0, 1, 1, 1, 1, 1, 0],    # left and right padding
                     [1, 1, 0, 1, 2, 2, 0, 2]])   # holes: a segment resumes after padding
  np.testing.assert_array_equal(forward.positions(seg), [[0, 1, 2, 0, 1, 0, 0, 0],
                                                         [0, 0, 0, 1, 2, 3, 4, 0],
                                                         [0, 1, 0, 2, 0, 1, 0, 2]])


def _inputs(seed, seg):
  b, t = seg.shape
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, 4, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(b, t, 2, 8)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, t, 2, 8)), jnp.float32)
  return q, k, v


@pytest.mark.parametrize("block", [1, 3, 4, 16])
def test_blocked_equals_dense_on_segments_values_and_grads(block):
  seg = jnp.asarray([[1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 0, 0],
                     [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2],
                     [0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0]])
  q, k, v = _inputs(0, seg)
  real = (seg != 0)[:, :, None, None]  # padding queries: dense and blocked differ by design
  cot = jax.random.normal(jax.random.key(1), q.shape) * real
  dense = lambda q, k, v: attention.dense_attention(
      q, k, v, attention.visible_mask(attention.CausalMask(seg), q.shape[1]))
  blocked = lambda q, k, v: attention.blocked_attention(q, k, v, seg, block)
  np.testing.assert_allclose(jax.jit(blocked)(q, k, v) * real, jax.jit(dense)(q, k, v) * real,
                             atol=1e-5, rtol=1e-5)
  grad = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * cot), argnums=(0, 1, 2)))
  for got, want in zip(grad(blocked)(q, k, v), grad(dense)(q, k, v)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_dense_mask_keeps_segments_apart():
  seg = jnp.asarray([[1, 1, 2, 2, 0]])
  visible = np.asarray(attention.visible_mask(attention.CausalMask(seg), 5))[0]
  np.testing.assert_array_equal(visible, [[1, 0, 0, 0, 0],
                                          [1, 1, 0, 0, 0],
                                          [0, 0, 1, 0, 0],
                                          [0, 0, 1, 1, 0],
                                          [0, 0, 0, 0, 0]])


def test_block_pairs_without_a_shared_segment_are_skipped():
  """Rows of two 4-token segments in blocks of 4: the cross-segment pair is skipped
  unless some row has a segment spanning both blocks."""
  blocks = lambda seg: attention._blocks(jnp.asarray(seg, jnp.int32), 2, 4)
  needed_in = lambda seg_N: attention._needed(seg_N, seg_N, 0, 4)  # queries are the keys
  needed = needed_in(blocks([[1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 2, 2, 0, 0]]))
  np.testing.assert_array_equal(needed, [[True, False], [False, True]])
  needed = needed_in(blocks([[1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 2, 2, 2]]))
  np.testing.assert_array_equal(needed, [[True, False], [True, True]])
  needed = needed_in(blocks([[1, 1, 1, 1, 0, 0, 0, 0]]))  # a padding block
  np.testing.assert_array_equal(needed, [[True, False], [False, False]])
