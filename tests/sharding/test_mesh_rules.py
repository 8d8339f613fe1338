"""Mesh construction and the logical-axis rules table."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from sao_jax.config import MeshConfig
from sao_jax.sharding.mesh import make_mesh
from sao_jax.sharding.rules import logical_sharding, logical_to_spec

MESH = {"data": 1, "fsdp": 2, "tensor": 4, "expert": 1}


def test_make_mesh_fills_free_axis_with_auto_types():
  mesh = make_mesh(MeshConfig(fsdp=-1, tensor=4))
  assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "sequence": 1, "tensor": 4, "expert": 1}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_make_mesh_errors_name_the_sizes():
  with pytest.raises(ValueError, match="8 devices"):
    make_mesh(MeshConfig(fsdp=-1, tensor=3))
  with pytest.raises(ValueError, match="use 4 devices but 8"):
    make_mesh(MeshConfig(fsdp=2, tensor=2))


def test_specs_follow_rules_and_skip_size_one_axes():
  assert logical_to_spec(("embed", "heads", "head_dim"), (64, 8, 8), MESH, strict=True) == P("fsdp", "tensor", None)
  assert logical_to_spec(("activation_batch", "activation_length"), (8, 5), MESH, strict=True) == P("fsdp", None)
  full = {"data": 2, "fsdp": 2, "tensor": 1, "expert": 2}
  assert logical_to_spec(("activation_batch", None), (8, 3), full, strict=True) == P(("data", "fsdp", "expert"), None)
  # A mesh axis shards at most one dimension: "expert" is taken by the batch first.
  assert logical_to_spec(("activation_batch", "activation_expert"), (8, 4), full, strict=True) == P(("data", "fsdp", "expert"), None)


def test_strict_divisibility_error_and_lenient_activations():
  with pytest.raises(ValueError, match=r"param 'k'.*kv_heads=2.*'tensor'"):
    logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 2, 8), MESH, strict=True, what="param 'k'")
  assert logical_to_spec(("activation_batch", "activation_length"), (1, 5), MESH, strict=False) == P(None, None)
  with pytest.raises(ValueError, match="'nonsense'"):
    logical_to_spec(("nonsense",), (4,), MESH, strict=True)


def test_logical_sharding_for_inputs():
  mesh = make_mesh(MeshConfig(fsdp=2, tensor=4))
  sharding = logical_sharding(mesh, ("activation_batch", "activation_length"), (4, 16))
  assert sharding.spec == P("fsdp", None)
  with pytest.raises(ValueError, match="activation_batch=3"):
    logical_sharding(mesh, ("activation_batch", "activation_length"), (3, 16), what="tokens")
