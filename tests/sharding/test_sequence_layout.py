"""The sequence axis: mesh config, the balanced chunk order and its checks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.learner import compile as compile_lib
from sao_jax.sharding import sequence
from sao_jax.sharding.mesh import make_mesh


def test_mesh_config_parses_and_builds_the_sequence_axis():
  mesh_cfg = C.MeshConfig.parse("data=2,sequence=4,fsdp=1")
  assert mesh_cfg.text() == "data=2,fsdp=1,sequence=4,tensor=1,expert=1"
  mesh = make_mesh(mesh_cfg)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 1, "sequence": 4, "tensor": 1, "expert": 1}
  assert sequence.axes(mesh.abstract_mesh) == ("sequence",)
  assert sequence.shards(mesh.abstract_mesh) == 4
  assert sequence.shards(make_mesh(C.MeshConfig(fsdp=8)).abstract_mesh) == 1


def test_balanced_order_gives_device_d_chunks_d_and_2s_minus_1_minus_d():
  shards, chunk = 4, 3
  x = np.arange(2 * shards * chunk)[None, :] + np.array([[0], [100]])  # two rows
  balanced = np.asarray(sequence.to_balanced(jnp.asarray(x), shards))
  for d in range(shards):
    local = balanced[:, d * 2 * chunk:(d + 1) * 2 * chunk]
    first, second = d, 2 * shards - 1 - d
    np.testing.assert_array_equal(local[:, :chunk], x[:, first * chunk:(first + 1) * chunk])
    np.testing.assert_array_equal(local[:, chunk:], x[:, second * chunk:(second + 1) * chunk])
  # Trailing dimensions move with their position; from_balanced undoes it.
  y = jnp.asarray(np.random.default_rng(0).normal(size=(2, 24, 5)))
  np.testing.assert_array_equal(sequence.from_balanced(sequence.to_balanced(y, shards), shards), y)
  assert sequence.to_balanced(y, 1) is y


def test_length_that_does_not_cut_into_2s_chunks_is_named():
  with pytest.raises(ValueError, match=r"length 20 .*mesh.sequence=4.*multiple of 8"):
    sequence.check_length(20, 4)
  mesh = make_mesh(C.MeshConfig(data=2, fsdp=1, sequence=4))
  cfg = C.Config(learner=C.LearnerConfig(batch_trajectories=8)).validate()
  with pytest.raises(ValueError, match="multiple of 8"):
    compile_lib.batch_shardings(cfg, mesh, 20)
  spec = compile_lib.batch_shardings(cfg, mesh, 24).tokens.spec
  assert tuple(spec) == ("data", "sequence")


def test_sampler_mesh_cannot_split_sequences():
  base = C.Config(mesh=C.MeshConfig(fsdp=-1, sequence=2),
                  sampler=C.SamplerConfig(sharded=True))
  with pytest.raises(ValueError, match=r"mesh.sequence=2 is invalid.*sampler.mesh"):
    base.validate()
  own = dataclasses.replace(base, sampler=dataclasses.replace(
      base.sampler, mesh=C.MeshConfig.parse("fsdp=-1,sequence=2")))
  with pytest.raises(ValueError, match=r"sampler.mesh=.*sequence=2.*set its sequence axis to 1"):
    own.validate()
  dataclasses.replace(own, sampler=dataclasses.replace(
      base.sampler, mesh=C.MeshConfig(fsdp=-1))).validate()
  dataclasses.replace(base, sampler=C.SamplerConfig()).validate()  # unsharded sampler


def test_padded_lengths_must_split_into_2s_chunks():
  split = C.MeshConfig(fsdp=-1, sequence=4)
  with pytest.raises(ValueError, match=r"data.length_buckets=\(256, 500\).*multiples of 8"):
    C.Config(mesh=split, data=C.DataConfig(length_buckets=(256, 500))).validate()
  packed = C.LearnerConfig(batch_trajectories=8, batch_tokens=8 * 36, row_length=36)
  with pytest.raises(ValueError, match=r"learner.row_length=36.*multiple of 8"):
    C.Config(mesh=split, learner=packed).validate()
  C.Config(mesh=split, data=C.DataConfig(length_buckets=(256, 504))).validate()
  C.Config(mesh=C.MeshConfig(), data=C.DataConfig(length_buckets=(256, 500))).validate()
