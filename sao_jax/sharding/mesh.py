"""Builds the (data, fsdp, tensor, expert) device mesh from `MeshConfig`.

All four axes use `AxisType.Auto`: shardings are given explicitly for jit inputs
and outputs (params, batches) and the compiler propagates them through the
program, guided by `sao_jax.sharding.rules.constrain` on key activations. jax's
default for `make_mesh` is `Explicit` axes, which would make every intermediate
shape carry a sharding in its type and reject ambiguous ops; the model code is
written for compiler propagation instead.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax

from sao_jax.config import MESH_AXES, MeshConfig
from sao_jax.sharding import rules


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A mesh with axes `MESH_AXES` sized by `cfg.shape(len(devices))` (default: all devices)."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = cfg.shape(len(devices))
  return jax.make_mesh(
      tuple(sizes[axis] for axis in MESH_AXES), MESH_AXES,
      axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES), devices=devices)


def traced_on(mesh: jax.sharding.Mesh, fn: Callable) -> Callable:
  """`fn`, traced with `mesh` as the abstract mesh and activation hints off.

  Jit the result with shardings on `mesh`. The model's MoE layers need the mesh
  at trace time for their expert-parallel shard_map; activation shardings are
  left to the compiler's propagation from the inputs (see
  `sao_jax.learner.compile.compile_train_step` for why).
  """

  def on_mesh(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), rules.activation_hints(False):
      return fn(*args, **kwargs)

  inner = fn.func if isinstance(fn, functools.partial) else fn
  on_mesh.__name__ = f"{getattr(inner, '__name__', 'program')}_on_mesh"
  return on_mesh


def host_outputs(mesh: jax.sharding.Mesh, fn: Callable) -> Callable:
  """`fn`, its outputs after the first (a cache, laid out as its inputs) replicated
  over `mesh`: the host reads them, and a process of a mesh spanning hosts reads
  only arrays whose every value it holds (`sao_jax.sampler.multihost`)."""

  def replicated(*args, **kwargs):
    first, *rest = fn(*args, **kwargs)
    everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return (first, *jax.lax.with_sharding_constraint(rest, everywhere))

  inner = fn.func if isinstance(fn, functools.partial) else fn
  replicated.__name__ = getattr(inner, "__name__", "program")
  return replicated
