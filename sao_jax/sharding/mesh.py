"""Builds the (data, fsdp, tensor, expert) device mesh from `MeshConfig`.

All four axes use `AxisType.Auto`: shardings are given explicitly for jit inputs
and outputs (params, batches) and the compiler propagates them through the
program, guided by `sao_jax.sharding.rules.constrain` on key activations. jax's
default for `make_mesh` is `Explicit` axes, which would make every intermediate
shape carry a sharding in its type and reject ambiguous ops; the model code is
written for compiler propagation instead.
"""

from __future__ import annotations

from typing import Sequence

import jax

from sao_jax.config import MESH_AXES, MeshConfig


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A mesh with axes `MESH_AXES` sized by `cfg.shape(len(devices))` (default: all devices)."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = cfg.shape(len(devices))
  return jax.make_mesh(
      tuple(sizes[axis] for axis in MESH_AXES), MESH_AXES,
      axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES), devices=devices)
