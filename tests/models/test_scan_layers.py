"""`scan_layers`: the decoder layers as one lax.scan equal the unrolled layers."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.config import MeshConfig, ModelConfig
from sao_jax.models import forward, transformer
from sao_jax.sharding.mesh import make_mesh
from tiny import DENSE, MOE, padded_batch

ALL_MOE = dataclasses.replace(MOE, mlp_only_layers=())


@functools.cache  # the unrolled MoE reference is shared by two tests: compiled once
def _outputs(cfg, mesh=None):
  """logp, entropy, router logits, values and policy gradients of one padded batch
  (with `mesh`: params sharded by the rules and the program traced on the mesh)."""
  params = transformer.init_params(cfg, jax.random.key(3), mesh=mesh)
  value_params = transformer.init_params(cfg, jax.random.key(4), head="value", mesh=mesh)
  # A non-zero value head, so the values depend on the trunk.
  value_params["value_head"]["kernel"] = jnp.linspace(-1.0, 1.0, cfg.hidden_size)
  tokens, mask = padded_batch(2)

  def run(params, value_params):
    out = forward.policy_forward(params, cfg, tokens, mask)
    grads = jax.grad(lambda p: jnp.sum(forward.policy_forward(p, cfg, tokens, mask).logp_BxT))(
        params)
    return (out.logp_BxT, out.entropy_BxT, out.router_logits,
            forward.value_forward(value_params, cfg, tokens, mask), grads)

  if mesh is None:
    return jax.jit(run)(params, value_params)
  with jax.set_mesh(mesh):
    return jax.jit(run)(params, value_params)


# Remat wraps the scanned body whatever it holds: the dense cases scan with and
# without it, the MoE case (whose unrolled reference the mesh test below reuses) with.
@pytest.mark.parametrize("base, remat", [(DENSE, "none"), (ALL_MOE, "full"), (DENSE, "full")],
                         ids=["dense", "moe-remat", "dense-remat"])
def test_scanned_layers_equal_unrolled(base, remat):
  unrolled = dataclasses.replace(base, remat_policy=remat)
  want = _outputs(unrolled)
  got = _outputs(dataclasses.replace(unrolled, scan_layers=True))
  assert len(got[2]) == len(want[2]) == (base.num_hidden_layers if base.num_experts else 0)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-5)


def test_scanned_layers_on_a_mesh_equal_unrolled_on_one_device():
  """Stacked layer params pinned to their shardings; MoE routed expert-parallel."""
  unrolled = dataclasses.replace(ALL_MOE, remat_policy="full")
  want = _outputs(unrolled)
  mesh = make_mesh(MeshConfig(fsdp=2, tensor=1, expert=4))
  got = _outputs(dataclasses.replace(unrolled, scan_layers=True), mesh)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, atol=1e-6, rtol=1e-5)


def test_scan_layers_rejects_mixed_dense_and_moe_layers():
  with pytest.raises(ValueError, match=r"model.scan_layers=True.*mlp_only_layers"):
    dataclasses.replace(MOE, scan_layers=True).validate()
  ModelConfig(scan_layers=True).validate()  # a dense model scans
