"""The jitted, sharded train step on an emulated 2x4 mesh equals the unsharded step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import dataclasses

from learner_fixtures import LENGTH, make_batch, make_config, replace_model, with_routing
from sao_jax import config as C
from sao_jax.learner import compile as compile_lib
from sao_jax.sharding.mesh import make_mesh

# GQA with 8 query / 4 kv heads so a tensor axis of 4 divides every head dimension.
# Adam's first step is ~lr * sign(g); a large eps keeps it ~linear in g so that
# round-off-level gradient entries cannot flip a whole lr between reduction orders.
CFG = replace_model(make_config(adam_eps=1e-2), num_attention_heads=8, num_key_value_heads=4,
                    head_dim=4)
# Every layer sparse: 4 experts, top-2, so an expert axis of 4 holds one each.
MOE_CFG = replace_model(CFG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def run_on(mesh_cfg, devices, steps=2, cfg=CFG, program=None, routed=False):
  """(mesh, state, metrics) after `steps` steps; `program(step, state, batch)`, if
  given, sees the compiled step and the arguments of its last call. `routed`: the
  batches carry sampler routing records (`with_routing`)."""
  mesh = make_mesh(mesh_cfg, devices)
  step = compile_lib.compile_train_step(cfg, mesh, LENGTH)
  state = compile_lib.init_sharded_state(cfg, mesh, jax.random.key(0))
  metrics = []
  for i in range(steps):
    batch = make_batch(10 + i, behavior_shift=0.2)
    if routed:
      batch = with_routing(batch, cfg, seed=i)
    batch = compile_lib.put_batch(batch, compile_lib.batch_shardings(cfg, mesh, LENGTH))
    if program is not None and i == steps - 1:
      program(step, state, batch)
    state, m = step(state, batch, jnp.asarray(True))
    metrics.append(m)
  return mesh, state, metrics


@pytest.fixture(scope="module")
def unsharded():
  return run_on(C.MeshConfig(fsdp=1), jax.devices()[:1])


@pytest.fixture(scope="module")
def fsdp2xtensor4():
  """Also the layout test's run: the step on this mesh is compiled and run once."""
  return run_on(C.MeshConfig(fsdp=2, tensor=4), jax.devices())


@pytest.fixture(scope="module")
def data2xfsdp4():
  return run_on(C.MeshConfig(data=2, fsdp=4), jax.devices())


@pytest.mark.parametrize("mesh", ["fsdp2xtensor4", "data2xfsdp4"])
def test_sharded_step_equals_unsharded(unsharded, mesh, request):
  _assert_same_run(unsharded, request.getfixturevalue(mesh))


def test_expert_parallel_moe_step_equals_unsharded():
  """The train step routes through the MoE's shard_map (it is traced on the mesh)."""
  reference = run_on(C.MeshConfig(fsdp=1), jax.devices()[:1], cfg=MOE_CFG)
  programs = []
  run = run_on(C.MeshConfig(fsdp=2, tensor=1, expert=4), jax.devices(), cfg=MOE_CFG,
               program=lambda step, state, batch: programs.append(
                   step.lower(state, batch, jnp.asarray(True)).as_text()))
  assert "reduce_scatter" in programs[0]
  _assert_same_run(reference, run)


def test_expert_parallel_router_replay_step_equals_unsharded():
  """Router replay with routing records in the batch, expert parallel: the replayed
  forward and the routing-mismatch metrics equal the single-device step's."""
  cfg = dataclasses.replace(MOE_CFG, learner=dataclasses.replace(MOE_CFG.learner,
                                                                 router_replay=True))
  reference = run_on(C.MeshConfig(fsdp=1), jax.devices()[:1], cfg=cfg, routed=True)
  run = run_on(C.MeshConfig(fsdp=2, tensor=1, expert=4), jax.devices(), cfg=cfg, routed=True)
  assert reference[2][0]["routing/changed_frac"] > 0.5  # random records: most tokens differ
  _assert_same_run(reference, run)


def _assert_same_run(reference, run):
  _, ref_state, ref_metrics = reference
  mesh, state, metrics = run
  assert mesh.devices.size == 8
  ref_leaves = jax.tree.leaves(ref_state)
  leaves = jax.tree.leaves(state)
  assert len(ref_leaves) == len(leaves)
  for ref, got in zip(ref_leaves, leaves):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-6)
  for ref_m, m in zip(ref_metrics, metrics):
    for name in ref_m:
      np.testing.assert_allclose(m[name], ref_m[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_state_is_laid_out_as_the_rules_say(fsdp2xtensor4):
  mesh, state, _ = fsdp2xtensor4  # after two steps: the step keeps the layout it was given
  expected = compile_lib.state_shardings(CFG, mesh)
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
    assert got.sharding == want
  # vocab over tensor, model dimension over fsdp; Adam moments mirror their params.
  assert state.policy_params["embed"].sharding.spec == P("tensor", "fsdp")
  mu = state.policy_opt_state[1][0].mu["embed"]
  assert mu.sharding.spec == P("tensor", "fsdp")
  shard_shape = state.policy_params["embed"].addressable_shards[0].data.shape
  assert shard_shape == (64 // 4, 32 // 2)


def test_batch_that_does_not_divide_the_mesh_is_named():
  mesh = make_mesh(C.MeshConfig(data=2, fsdp=4), jax.devices())
  bad = make_config(batch_trajectories=6)
  with pytest.raises(ValueError, match="6"):
    compile_lib.batch_shardings(bad, mesh, LENGTH)
