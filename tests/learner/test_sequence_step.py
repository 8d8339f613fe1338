"""The whole SAO train step over sequences split by the mesh's sequence axis equals the
unsplit step: critic values, skip-observation GAE, DIS masking, the aggregated losses,
gradients and one optimizer step, on packed rows whose trajectories and observations
cross chunk borders; dense and MoE."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner_fixtures import MODEL, make_config, replace_model
from sao_jax import config as C
from sao_jax.data.pipeline import first_fit, pack_rows
from sao_jax.learner import compile as compile_lib
from sao_jax.sharding.mesh import make_mesh
from sao_jax.types import Trajectory

ROW = 24  # sequence=4: 8 chunks of 3 positions
# A large Adam eps keeps the first update ~linear in the gradient (test_sharded_step.py).
CFG = make_config(adam_eps=1e-2, batch_trajectories=16, batch_tokens=8 * ROW, row_length=ROW)
MOE_CFG = replace_model(CFG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def _trajectories(seed: int) -> list[Trajectory]:
  """16 trajectories of 4-16 tokens: a prompt of 3, then action turns and observations
  of random lengths, a 0/1 outcome; pairs share a prompt."""
  rng = np.random.default_rng(seed)
  trajs = []
  for i in range(16):
    n = int(rng.integers(4, 17))
    action = (np.arange(n) >= 3) & (rng.random(n) < 0.7)
    action[-1] = True
    rewards = np.zeros(n, np.float32)
    rewards[-1] = rng.integers(0, 2)
    trajs.append(Trajectory(
        tokens=rng.integers(0, MODEL.vocab_size, n).astype(np.int32),
        action_mask=action.astype(np.int8),
        behavior_logp=np.where(action, rng.normal(-4.0, 0.3, n), 0.0).astype(np.float32),
        rewards=rewards, prompt_id=i // 2, policy_versions=(0, 0)))
  return trajs


def _batch():
  trajs = _trajectories(1)
  rows = [[] for _ in range(CFG.learner.batch_rows)]
  for traj, row in zip(trajs, first_fit(trajs, [ROW] * len(rows))):
    rows[row].append(traj)
  batch = pack_rows(rows, len(rows), ROW, pad_id=0)
  assert max(batch.segment_ids.max(axis=1)) > 1  # some row holds several trajectories
  return batch


def _run_on(cfg, mesh_cfg, devices):
  mesh = make_mesh(mesh_cfg, devices)
  step = compile_lib.compile_train_step(cfg, mesh, ROW)
  state = compile_lib.init_sharded_state(cfg, mesh, jax.random.key(0))
  batch = compile_lib.put_batch(_batch(), compile_lib.batch_shardings(cfg, mesh, ROW))
  assert tuple(batch.tokens.sharding.spec)[1] == ("sequence" if mesh.shape["sequence"] > 1
                                                  else None)
  return step(state, batch, jnp.asarray(True))


@pytest.mark.parametrize("cfg,mesh_cfg", [
    (CFG, C.MeshConfig(data=2, fsdp=1, sequence=4)),
    # Two MoE step compiles take minutes on a loaded 2-core machine.
    pytest.param(MOE_CFG, C.MeshConfig(fsdp=1, sequence=4, expert=2), marks=pytest.mark.slow),
], ids=["dense", "moe"])
def test_split_step_equals_unsplit(cfg, mesh_cfg):
  ref_state, ref_metrics = _run_on(cfg, C.MeshConfig(fsdp=1), jax.devices()[:1])
  state, metrics = _run_on(cfg, mesh_cfg, jax.devices())
  assert float(ref_metrics["policy/updated"]) == 1.0
  assert 0 < float(ref_metrics["policy/grad_norm"]) and 0 < float(ref_metrics["value/grad_norm"])
  for name in ref_metrics:
    np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  for ref, got in zip(jax.tree.leaves(ref_state), jax.tree.leaves(state)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-6)
