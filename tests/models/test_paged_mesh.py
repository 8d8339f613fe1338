"""The paged pool split over a mesh's batch axes (`sao_jax.models.paged_mesh`): pages over
data, KV heads over tensor, page ids local to the shard. `extend_paged` on data 2 and
data 4 x tensor 2 with local ids gives the logits, lengths and pool that one device gives
with the same pages under global ids, through the reference paths (gathered prefill,
ragged decode over per-shard entries) and the interpreted Pallas kernel; each device
holds pool / (data x tensor). The paged engine on data 2 x tensor 2 (both paths) and
data 4 x tensor 2 (reference path) samples what the one-device dense engine and the
learner's policy_forward give, with preemptions and shared prompt pages."""

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from sao_jax.config import MeshConfig, ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import forward, paged, transformer
from sao_jax.models.paged_mesh import page_axes, page_shards, pool_spec
from sao_jax.sampler.engine import Engine
from sao_jax.sampler.paged_engine import PagedEngine
from sao_jax.sampler.paged_steps import cache_shardings
from sao_jax.sharding.mesh import make_mesh, traced_on
from same_trajectories import assert_same_trajectories
from tpu_interpret import interpret

# head_dim 128 so that the kernel takes it; 2 KV heads, one per tensor shard.
MODEL = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, head_dim=128,
                    num_attention_heads=4, num_key_value_heads=2, logits_chunk=16)
PER_SHARD, PAGE, CHUNK = 6, 4, 12
# Two shards' slots (2 each), ids local to the shard: shard d's page j is page 6 d + j of
# the whole pool. The second shard's first slot reuses local ids the first's holds.
TWO_SHARDS_4xM = np.array([[0, 3, 5, -1], [1, 2, -1, -1], [4, 0, 1, -1], [2, -1, -1, -1]],
                          np.int32)
# Prefill rows of two shards: two blocks of two (block d: shard d's slots; one padding row).
TWO_SHARDS_ROWS = np.array([0, 1, 2, -1], np.int32)  # -1: padding, set to N below
TWO_SHARDS_NEW = np.array([9, 6, 11, 0], np.int32)


def _layout(shards: int):
  """(local tables, global tables, prefill rows, new tokens per row) for `shards` shards of
  2 slots, the two-shard pattern repeated."""
  repeat = shards // 2
  local_NxM = np.concatenate([TWO_SHARDS_4xM] * repeat)
  shard_N = np.arange(2 * shards) // 2
  global_NxM = np.where(local_NxM >= 0, local_NxM + PER_SHARD * shard_N[:, None], -1)
  rows_B = np.concatenate([TWO_SHARDS_ROWS + 4 * r for r in range(repeat)])
  rows_B[np.tile(TWO_SHARDS_ROWS, repeat) < 0] = 2 * shards  # padding rows
  return local_NxM, global_NxM, rows_B.astype(np.int32), np.tile(TWO_SHARDS_NEW, repeat)


policy_forward = jax.jit(forward.policy_forward, static_argnums=1)


def test_page_axes_are_the_batch_axes_but_expert():
  shape = {"data": 2, "fsdp": 2, "tensor": 2, "expert": 2}
  assert page_axes(shape) == ("data", "fsdp") and page_shards(shape) == 4
  assert page_axes({"data": 1, "fsdp": 1, "tensor": 4, "expert": 1}) == ()
  assert page_shards({"data": 1, "fsdp": 1, "tensor": 4, "expert": 1}) == 1
  assert pool_spec({"data": 2, "fsdp": 1, "tensor": 2, "expert": 1}, 2) == PartitionSpec(
      "data", None, "tensor", None)
  assert pool_spec(shape, 1) == PartitionSpec(("data", "fsdp"), None, None, None)


def _run(mesh, shards: int, kernel: bool):
  """Prefill the rows of `_layout(shards)`, then two decode steps of every slot; ->
  (prefill logits, decode logits, the pool of layer 0, lengths), as numpy. On `mesh`
  with local page ids, else on one device with global ones."""
  local_NxM, global_NxM, rows_B, new_B = _layout(shards)
  n = 2 * shards
  params = transformer.init_params(MODEL, jax.random.key(0))
  cache = paged.init_paged_cache(MODEL, shards * PER_SHARD, PAGE, n)
  rng = np.random.default_rng(0)
  tokens_BxC = rng.integers(0, 64, (len(rows_B), CHUNK)).astype(np.int32)
  mask_BxC = (np.arange(CHUNK)[None, :] < new_B[:, None]).astype(np.int32)
  entries = shards * PER_SHARD if mesh is None else PER_SHARD  # every page of a shard
  active_N = (np.arange(n) % 4 != 3).astype(np.int32)[:, None]  # each 4th slot holds nothing
  token_KxN = rng.integers(0, 64, (2, n, 1)).astype(np.int32)

  def program(params, cache, table_NxM):
    logits_pre, cache = paged.extend_paged(params, MODEL, cache, table_NxM, rows_B, tokens_BxC,
                                           mask_BxC, kernel=kernel)
    decoded = []
    for token_N in token_KxN:
      logits, cache = paged.extend_paged(params, MODEL, cache, table_NxM,
                                         jnp.arange(n, dtype=jnp.int32), token_N, active_N,
                                         entries=None if kernel else entries, kernel=kernel)
      decoded.append(logits)
    return logits_pre, jnp.stack(decoded), cache

  if mesh is None:
    out = jax.jit(program)(params, cache, global_NxM)
  else:
    cache = jax.device_put(cache, cache_shardings(cache, mesh))
    out = jax.jit(traced_on(mesh, program))(params, cache, local_NxM)
    pool = out[2].kv[0]
    # Each device holds its shard's pages and its tensor shard's heads: pool / (D x 2).
    assert pool.sharding.shard_shape(pool.shape) == (PER_SHARD, PAGE, 2, 128)
    assert {s.data.nbytes for s in pool.addressable_shards} == {pool.nbytes // (2 * shards)}
  logits_pre, logits_dec, cache = out
  return (np.asarray(logits_pre), np.asarray(logits_dec), np.asarray(cache.kv[0]),
          np.asarray(cache.length_N))


@pytest.mark.parametrize("shards,kernel", [
    (2, False), pytest.param(2, True, marks=pytest.mark.slow),
    pytest.param(4, False, marks=pytest.mark.slow), pytest.param(4, True, marks=pytest.mark.slow)],
    ids=["data2-reference", "data2-kernel", "data4-reference", "data4-kernel"])
def test_split_pool_on_data_x_tensor2_matches_one_device(shards, kernel):
  mesh = make_mesh(MeshConfig(data=shards, fsdp=1, tensor=2), jax.devices()[:2 * shards])
  with interpret() if kernel else contextlib.nullcontext():
    want = _run(None, shards, kernel)
    got = _run(mesh, shards, kernel)
  live_B, active_N = _layout(shards)[3] > 0, np.arange(2 * shards) % 4 != 3
  np.testing.assert_allclose(got[0][live_B], want[0][live_B], rtol=0, atol=1e-5)
  np.testing.assert_allclose(got[1][:, active_N], want[1][:, active_N], rtol=0, atol=1e-5)
  np.testing.assert_allclose(got[2], want[2], rtol=0, atol=1e-5)  # the same pages written
  np.testing.assert_array_equal(got[3], want[3])
  assert np.abs(want[2]).sum() > 0


# The split engine: GRPO-like groups (3 prompts of 21 tokens, 2 full pages of 8 shared),
# 3 turns each; 8 slots over 48 pages of 8 tokens in 2 or 4 shards (4 or 2 slots over 24
# or 12 pages each): episodes of up to 96 tokens (12 pages) run out of pages.
STOP = 5
GROUPS = [np.random.default_rng(g).integers(0, 64, 21) for g in (0, 0, 0, 1, 1, 1, 2, 2)]
MAX_NEW = [2, 24, 5, 17, 9, 24, 3, 12]
OBSERVATIONS = [[1, 2, 3], list(range(20, 40))]
DENSE = SamplerConfig(kv_layout="dense", slots=3, max_seq_len=96, prefill_buckets=(8, 16),
                      steps_per_call=4, max_new_tokens=12, stop_patterns=())
SPLIT = dataclasses.replace(DENSE, kv_layout="paged", slots=8, kv_page_size=8, kv_pages=48,
                            prefill_row_buckets=(1, 4))
MESHES = {"data2_tensor2": MeshConfig(data=2, fsdp=1, tensor=2),
          "data4_tensor2": MeshConfig(data=4, fsdp=1, tensor=2)}


@pytest.fixture(scope="module")
def weights():
  """init_params scaled x10: peaked next-token distributions (stop tokens matter)."""
  base = transformer.init_params(MODEL, jax.random.key(0))
  return jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, base)


def _rollout(eng):
  """GROUPS' 8 episodes of 3 turns; -> {id: trajectory}."""
  for i, prompt in enumerate(GROUPS):
    eng.submit(i, prompt, seed=100 + i, max_new_tokens=MAX_NEW[i])
  left = {i: list(OBSERVATIONS) for i in range(len(GROUPS))}
  trajectories = {}
  while eng.busy:
    for turn in eng.step():
      if left[turn.episode_id]:
        eng.submit(turn.episode_id, left[turn.episode_id].pop(0))
      else:
        trajectories[turn.episode_id] = eng.finish(turn.episode_id)
  return trajectories


@pytest.fixture(scope="module")
def dense_rollout(weights):
  return _rollout(Engine(DENSE, MODEL, weights, stop_token_ids=(STOP,)))


# The interpreted kernel on data 4 x tensor 2 is checked call by call above, not as an
# engine: jax 0.10.2's TPU interpreter deadlocks in the engine's rollout on 8 CPU devices
# (device threads stuck between its per-call barrier and buffer allocation).
@pytest.mark.slow  # per case a paged rollout on 4 or 8 devices (the kernel interpreted)
@pytest.mark.parametrize("mesh_name,path", [("data2_tensor2", "reference"),
                                            ("data2_tensor2", "pallas"),
                                            ("data4_tensor2", "reference")])
def test_split_pool_engine_samples_like_dense_and_learner(weights, dense_rollout, mesh_name,
                                                          path):
  mesh_cfg = MESHES[mesh_name]
  mesh = make_mesh(mesh_cfg, jax.devices()[:mesh_cfg.data * mesh_cfg.tensor])
  with interpret() if path == "pallas" else contextlib.nullcontext():
    eng = PagedEngine(dataclasses.replace(SPLIT, paged_attention=path), MODEL, weights,
                      stop_token_ids=(STOP,), mesh=mesh)
    got = _rollout(eng)
  pool = eng._cache.kv[0]
  # Each device holds pool / (data x tensor): its shard's pages, its tensor shard's heads.
  assert {s.data.nbytes for s in pool.addressable_shards} == {
      pool.nbytes // (mesh_cfg.data * mesh_cfg.tensor)}
  want = dense_rollout
  assert_same_trajectories(got, want, len(GROUPS), turns=3)
  assert eng.stats["preemptions"] > 0, eng.stats
  assert eng.stats["shared_pages"] > 0, eng.stats  # followers went to their holder's shard
  assert eng.free_pages == SPLIT.kv_pages
  for trajectory in got.values():
    t = len(trajectory.tokens)
    tokens, mask = np.zeros((1, 96), np.int32), np.zeros((1, 96), np.int32)
    tokens[0, :t], mask[0, :t] = trajectory.tokens, 1
    learner = np.asarray(policy_forward(weights, MODEL, tokens, mask, np.float32(1.0)).logp_BxT)
    on = trajectory.action_mask == 1
    np.testing.assert_allclose(trajectory.behavior_logp[on], learner[0, :t][on], rtol=0,
                               atol=1e-5)
