"""The train step on packed rows equals the step on the same trajectories one per row;
the lag-0 training-inference mismatch metric."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner_fixtures import LENGTH, MODEL, make_batch, make_config
from sao_jax import config as C
from sao_jax.data.pipeline import first_fit, pack_rows, pad_batch
from sao_jax.learner import compile as compile_lib
from sao_jax.learner import state as state_lib
from sao_jax.learner.step import StepConfig, train_step
from sao_jax.models.forward import policy_forward
from sao_jax.sharding.mesh import make_mesh
from sao_jax.types import Trajectory

LENGTHS = (16, 5, 9, 12, 7, 14, 4, 10)  # one row each unpacked: [8, 16]
PACKED = ((0, 6), (3, 4), (5, 1), (2, 7))  # 4 rows of 20 tokens: 20, 19, 19, 19
ROW = 20


def _trajectories(seed: int) -> list[Trajectory]:
  """Prompt of 3, action turns around observations, a 0/1 outcome; pairs share a prompt."""
  rng = np.random.default_rng(seed)
  trajs = []
  for i, n in enumerate(LENGTHS):
    action = np.zeros(n, np.int8)
    action[3:] = rng.random(n - 3) < 0.7
    action[-1] = 1
    logp = np.where(action, rng.normal(-4.0, 0.3, n), 0.0).astype(np.float32)
    rewards = np.zeros(n, np.float32)
    rewards[-1] = rng.integers(0, 2)
    trajs.append(Trajectory(tokens=rng.integers(0, MODEL.vocab_size, n).astype(np.int32),
                            action_mask=action, behavior_logp=logp, rewards=rewards,
                            prompt_id=i // 2, policy_versions=(0, 0)))
  return trajs


def _config(variant: str = "sao", **learner):
  """The tiny learner config at the sampler temperature 0.7, which the step applies
  to its log-probs (a step that forgot it would still pass at 1.0). A large Adam eps
  keeps the first update ~linear in the gradient, so equal gradients (up to
  summation order) show as equal params (test_train_step.py). The lag-0 tests use
  the packed test's configs, so they run the steps it compiled (`_step`)."""
  cfg = make_config(variant, adam_eps=1e-2, **learner)
  return dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, temperature=0.7))


@functools.lru_cache(maxsize=None)
def _step(cfg):
  return jax.jit(functools.partial(train_step, cfg=StepConfig.of(cfg)))


def _run(cfg, batch, state=None):
  state = state_lib.init_state(cfg, jax.random.key(0)) if state is None else state
  state, metrics = _step(cfg)(state, batch, jnp.asarray(True))
  return state, jax.tree.map(float, metrics)


def _leaves(state):
  return [np.asarray(x) for x in jax.tree.leaves((state.policy_params, state.value_params,
                                                   state.baseline))]


@pytest.mark.parametrize("variant,learner", [
    ("sao", {"micro_batches": 2}),
    ("grpo_dis", {}),
    ("ppo", {}),
    ("running_mean", {"micro_batches": 2}),
])
def test_packed_step_equals_unpacked_step(variant, learner):
  unpacked_cfg = _config(variant, **learner)
  packed_cfg = _config(variant, batch_tokens=len(PACKED) * ROW, row_length=ROW, **learner)
  if variant == "grpo_dis":
    algorithm = dataclasses.replace(unpacked_cfg.algorithm, loss_agg="seq_mean_token_mean")
    unpacked_cfg = dataclasses.replace(unpacked_cfg, algorithm=algorithm)
    packed_cfg = dataclasses.replace(packed_cfg, algorithm=algorithm)
  assert packed_cfg.learner.batch_rows == len(PACKED)
  trajs = _trajectories(1)
  unpacked = pad_batch(trajs, len(trajs), LENGTH, pad_id=0)
  packed = pack_rows([[trajs[i] for i in row] for row in PACKED], len(PACKED), ROW, pad_id=0)
  # Batch order (which the running mean pushes in) must agree: packed is row-major.
  order = [i for row in PACKED for i in row]
  unpacked = jax.tree.map(lambda x: x[np.array(order)], unpacked)

  state_u, metrics_u = _run(unpacked_cfg, unpacked)
  state_p, metrics_p = _run(packed_cfg, packed)
  for a, b in zip(_leaves(state_u), _leaves(state_p)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  for name, value in metrics_u.items():
    np.testing.assert_allclose(metrics_p[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
  assert metrics_p["policy/updated"] == 1.0 and metrics_p["policy/grad_norm"] > 0
  assert metrics_p["tokens/total"] == sum(LENGTHS)


def test_sharded_packed_step_equals_unsharded():
  """8 packed rows split over a data=2 x fsdp=4 mesh (one row per device)."""
  cfg = make_config(adam_eps=1e-2, batch_trajectories=16, batch_tokens=8 * 24, row_length=24)
  trajs = _trajectories(1) + _trajectories(2)
  rows = [[] for _ in range(cfg.learner.batch_rows)]
  for traj, row in zip(trajs, first_fit(trajs, [24] * len(rows))):
    rows[row].append(traj)
  batch = pack_rows(rows, len(rows), 24, pad_id=0)
  assert max(batch.segment_ids.max(axis=1)) > 1  # some row holds several trajectories

  def run_on(mesh_cfg, devices):
    mesh = make_mesh(mesh_cfg, devices)
    step = compile_lib.compile_train_step(cfg, mesh, 24)
    state = compile_lib.init_sharded_state(cfg, mesh, jax.random.key(0))
    return step(state, compile_lib.put_batch(batch, compile_lib.batch_shardings(cfg, mesh, 24)),
                jnp.asarray(True))

  ref_state, ref_metrics = run_on(C.MeshConfig(fsdp=1), jax.devices()[:1])
  state, metrics = run_on(C.MeshConfig(data=2, fsdp=4), jax.devices())
  for ref, got in zip(jax.tree.leaves(ref_state), jax.tree.leaves(state)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-6)
  for name in ref_metrics:
    np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)


def _with_sampler_logp(cfg, state, batch, lag0_rows):
  """`batch` with behavior_logp from the state's own policy at the sampler's
  temperature on `lag0_rows` (version = the state's), and lag 1 elsewhere."""
  logp = policy_forward(state.policy_params, cfg.model, jnp.asarray(batch.tokens),
                        jnp.asarray(batch.segment_ids),
                        temperature=cfg.sampler.temperature).logp_BxT
  lag0 = np.zeros(batch.shape, bool)
  lag0[list(lag0_rows)] = True
  behavior = np.where(lag0 & (batch.action_mask > 0), np.asarray(logp), batch.behavior_logp)
  version = int(state.policy_version)
  versions = np.where(batch.segment_ids > 0, np.where(lag0, version, version - 1), -1)
  return batch._replace(behavior_logp=behavior.astype(np.float32),
                        behavior_version=versions.astype(np.int32))


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_lag0_mismatch_metric(micro_batches):
  cfg = _config(micro_batches=micro_batches)  # 2: the packed test's "sao" step
  state = state_lib.init_state(cfg, jax.random.key(0))
  state = state.replace(policy_version=jnp.asarray(3, jnp.int32))
  # Micro-batch m takes rows m, m + 2, ...: three lag-0 rows in one, one in the other.
  lag0_rows = (0, 2, 4, 5)
  batch = _with_sampler_logp(cfg, state, make_batch(9), lag0_rows)
  action = batch.action_mask > 0
  lag0_tokens = sum(int(action[r].sum()) for r in lag0_rows)

  _, metrics = _run(cfg, batch, state)
  assert metrics["mismatch/lag0_tokens"] == lag0_tokens
  assert metrics["mismatch/lag0_abs_logp"] < 1e-5

  # Perturb the recorded log-probs by known amounts; lag-1 rows (whatever their
  # log-probs: here the fixture's random ones) never count.
  rng = np.random.default_rng(0)
  delta = np.where(action, rng.uniform(0.01, 0.5, batch.shape), 0.0).astype(np.float32)
  perturbed = batch._replace(behavior_logp=batch.behavior_logp + delta)
  _, metrics = _run(cfg, perturbed, state)
  want = sum(delta[r].sum() for r in lag0_rows) / lag0_tokens
  np.testing.assert_allclose(metrics["mismatch/lag0_abs_logp"], want, rtol=1e-4)
  assert metrics["mismatch/lag0_tokens"] == lag0_tokens


def test_no_lag0_tokens_reads_nan():
  """Without lag-0 tokens the mismatch is undefined: NaN, never a 0 that reads as
  "sampler and learner agree" (also on value-only steps, which update no policy)."""
  cfg = _config()  # test_lag0_mismatch_metric[1]'s step
  batch = make_batch(10)  # behavior_version -1: several versions
  for update_policy in (True, False):
    state = state_lib.init_state(cfg, jax.random.key(0))
    _, metrics = _step(cfg)(state, batch, jnp.asarray(update_policy))
    assert float(metrics["mismatch/lag0_tokens"]) == 0.0
    assert np.isnan(float(metrics["mismatch/lag0_abs_logp"]))


def test_packing_config_errors_name_the_field_and_fix():
  with pytest.raises(ValueError, match=r"learner.row_length=None .*batch_tokens=64"):
    C.LearnerConfig(batch_tokens=64).validate()
  with pytest.raises(ValueError, match=r"learner.batch_tokens=100 .*multiple of row_length=32"):
    C.LearnerConfig(batch_tokens=100, row_length=32).validate()
  with pytest.raises(ValueError, match=r"learner.batch_tokens=96 .*batch_rows=3.*multiple of 64"):
    C.LearnerConfig(batch_tokens=96, row_length=32, micro_batches=2,
                    batch_trajectories=8).validate()
  with pytest.raises(ValueError, match=r"learner.row_length=32 .*set learner.batch_tokens"):
    C.LearnerConfig(row_length=32).validate()
  with pytest.raises(ValueError, match=r"learner.batch_tokens=0 .*positive integer"):
    C.LearnerConfig(batch_tokens=0, row_length=32).validate()
  assert C.LearnerConfig(batch_tokens=128, row_length=32).batch_rows == 4
  assert C.LearnerConfig(batch_trajectories=16).batch_rows == 16
