"""A sharded sampler lays its engine out on `sampler.mesh` (else the learner's mesh):
the mesh `sao_jax.sampler.worker.engine_mesh` builds is the one params and the paged
KV pool are placed on (pages over the batch axes, KV heads over tensor)."""

import dataclasses

import jax
import numpy as np
import pytest

from engine_fixtures import MODEL, engine, with_sampler
from sao_jax.config import Config, MeshConfig
from sao_jax.models import transformer
from sao_jax.sampler.paged_engine import PagedEngine
from sao_jax.sampler.worker import engine_mesh

# The learner shards fsdp over all 8 devices; the sampler splits pages over fsdp and KV
# heads over tensor. 8 slots over 96 pages: 4 or 8 page shards of 24 or 12 pages.
CFG = Config(mesh=MeshConfig(fsdp=8), model=MODEL, sampler=with_sampler(
    kv_layout="paged", kv_page_size=8, slots=8, sharded=True, mesh=MeshConfig(fsdp=-1, tensor=2)))


@pytest.fixture(scope="module")
def weights():
  """Zeros of the params' shapes: only their placement is checked (host arrays, no
  random init to compile)."""
  shapes = jax.eval_shape(lambda: transformer.init_params(MODEL, jax.random.key(0)))
  return jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), shapes)


def _pool_specs(eng):
  return {tuple(layer.sharding.spec) for layer in eng._cache.kv}


def test_a_sampler_mesh_beyond_the_process_devices_names_the_fix():
  """What a sao-sampler worker on one host of a multi-host sampler slice meets: its
  mesh asks for 16 devices, the process has 8."""
  cfg = dataclasses.replace(CFG, sampler=dataclasses.replace(
      CFG.sampler, mesh=MeshConfig(data=2, fsdp=1, tensor=8)))
  with pytest.raises(ValueError, match=r"a sampler process lays its engine over its own "
                     r"devices, 8 here .*give each host its own sampler process"):
    engine_mesh(cfg.validate())


def test_sharded_engine_is_placed_on_the_sampler_mesh(weights):
  mesh = engine_mesh(CFG.validate())
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "sequence": 1, "tensor": 2, "expert": 1}
  eng = engine(weights, CFG.sampler, engine_cls=PagedEngine, mesh=mesh)
  # Pools [P, page, 2K, H]: pages over fsdp (24 a device), the 2 KV heads over tensor,
  # one (k, v) pair per device.
  assert _pool_specs(eng) == {("fsdp", None, "tensor", None)}
  assert all(layer.addressable_shards[0].data.shape == (24, 8, 2, MODEL.head_dim)
             for layer in eng._cache.kv)
  # q_proj [D, N, H]: embed over fsdp, heads over tensor.
  q_proj = eng._params["layers"][0]["attn"]["q_proj"]
  assert q_proj.sharding.mesh.shape == mesh.shape
  assert tuple(q_proj.sharding.spec) == ("fsdp", "tensor", None)


def test_without_a_sampler_mesh_the_engine_uses_the_learners(weights):
  learner = dataclasses.replace(CFG, sampler=dataclasses.replace(CFG.sampler, mesh=None))
  mesh = engine_mesh(learner.validate())
  assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "sequence": 1, "tensor": 1, "expert": 1}
  eng = engine(weights, learner.sampler, engine_cls=PagedEngine, mesh=mesh)
  assert _pool_specs(eng) == {("fsdp", None, None, None)}  # 12 pages on each chip
  one_device = dataclasses.replace(learner, sampler=dataclasses.replace(learner.sampler,
                                                                        sharded=False))
  assert engine_mesh(one_device) is None
