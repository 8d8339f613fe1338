"""Skip-observation GAE with each sequence split over the mesh's sequence axis (chunk
maps carried between devices) equals the unsplit GAE: turns, observations, segments
and padding straddle the chunk borders."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from gae_reference import loop_reference, random_trajectories
from sao_jax import losses
from sao_jax.config import MeshConfig
from sao_jax.sharding.mesh import make_mesh

LENGTH = 64  # 8 chunks of 8 positions on sequence=8


def _split_gae(mesh_cfg, rewards, values, mask, **kwargs):
  mesh = make_mesh(mesh_cfg)
  layout = NamedSharding(mesh, P("data", "sequence"))
  with jax.set_mesh(mesh):
    args = [jax.device_put(jnp.asarray(x), layout) for x in (rewards, values, mask)]
    seg = kwargs.pop("segment_ids", None)
    if seg is not None:
      kwargs["segment_ids"] = jax.device_put(jnp.asarray(seg), layout)
    return jax.device_get(jax.jit(lambda r, v, m, kw: losses.gae(r, v, m, **kw))(
        *args, kwargs))


@pytest.mark.parametrize("gamma", [1.0, 0.95])
def test_split_gae_matches_python_loop(gamma):
  rng = np.random.default_rng(3)
  rewards, values, mask = random_trajectories(rng, batch=4, length=LENGTH)
  lam = losses.length_adaptive_lam(jnp.asarray(mask), alpha=1.5)
  adv, ret = _split_gae(MeshConfig(fsdp=1, sequence=8), rewards, values, mask, gamma=gamma,
                        lam=lam)
  ref_adv, ref_ret = loop_reference(rewards, values, mask, gamma, np.asarray(lam))
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
  assert np.abs(ref_adv).max() > 1.0


def _packed(rng, rows, length):
  """Rows of segments 1, 2, ... of 3-30 tokens (holes of padding between some), each a
  prompt then action turns and observations of 1-6 tokens; a reward on every action
  token, so every chunk's map matters."""
  seg = np.zeros((rows, length), np.int32)
  mask = np.zeros((rows, length), bool)
  for r in range(rows):
    t, k = 0, 1
    while t < length:
      n = int(rng.integers(3, 31))
      seg[r, t:t + n] = k
      u = t + int(rng.integers(0, 3))
      while u < min(t + n, length):
        turn = int(rng.integers(1, 7))
        mask[r, u:min(u + turn, t + n, length)] = True
        u += turn + int(rng.integers(0, 6))
      k += 1
      t += n + int(rng.integers(0, 3))
  rewards = rng.normal(size=(rows, length)).astype(np.float32)
  values = rng.normal(size=(rows, length)).astype(np.float32)
  return rewards, values, mask, seg


@pytest.mark.parametrize("mesh_cfg", [MeshConfig(fsdp=1, sequence=8),
                                      MeshConfig(data=2, fsdp=1, sequence=4)],
                         ids=["sequence8", "data2xsequence4"])
def test_split_gae_on_packed_rows_equals_unsplit(mesh_cfg):
  rng = np.random.default_rng(4)
  rewards, values, mask, seg = _packed(rng, rows=4, length=LENGTH)
  lam = losses.length_adaptive_lam(jnp.asarray(mask), alpha=1.5, segment_ids=jnp.asarray(seg))
  for gamma in (1.0, 0.97):
    kwargs = dict(gamma=gamma, lam=lam, segment_ids=seg)
    adv, ret = _split_gae(mesh_cfg, rewards, values, mask, **dict(kwargs))
    for method in ("scan", "associative"):
      ref_adv, ref_ret = jax.jit(lambda r, v, m, kw: losses.gae(r, v, m, method=method, **kw))(
          rewards, values, mask, kwargs)
      np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
  # A segment crossing a chunk border and an observation straddling one both occur.
  chunk = LENGTH // 8
  borders = np.arange(chunk, LENGTH, chunk)
  assert np.any(seg[:, borders] == seg[:, borders - 1]) and np.any(seg[:, borders] != 0)
  assert np.any(~mask[:, borders] & ~mask[:, borders - 1] & (seg[:, borders] != 0))
