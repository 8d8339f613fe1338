"""The paged engine samples what the dense engine and the learner's policy_forward
give: same tokens, behavior_logp within 1e-5, with preemption, batched prefill and
no compilation after warm-up; on one device and on a mesh."""

import dataclasses

import jax
import numpy as np
import pytest

from engine_fixtures import MODEL, SAMPLER, STOP, VOCAB, engine, params, prompts, with_sampler
from sao_jax.config import MeshConfig
from sao_jax.models import forward, transformer
from sao_jax.sampler.engine import Engine
from sao_jax.sampler.paged_engine import PagedEngine
from sao_jax.sampler.pages import PagePool
from sao_jax.sharding.mesh import make_mesh
from same_trajectories import assert_same_trajectories

MAX_NEW = [2, 24, 5, 17, 9, 24, 3, 12]
OBSERVATIONS = [[1, 2, 3], list(range(20, 40))]  # appended after turns 1 and 2
# 6 slots over 14 pages of 8 tokens (112 tokens, vs 3 x 96 for the dense engine):
# 8 multi-turn episodes run out of pages, so some are preempted.
PAGED = with_sampler(kv_layout="paged", slots=6, kv_page_size=8, kv_pages=14,
                     prefill_row_buckets=(1, 4))
policy_forward = jax.jit(forward.policy_forward, static_argnums=1)


@pytest.fixture(scope="module")
def weights():
  return params(0)


def _rollout(eng, prompt_list=None):
  """8 episodes of 3 turns (observations between turns); -> ({id: trajectory}, turns)."""
  for i, prompt in enumerate(prompt_list or prompts(len(MAX_NEW))):
    eng.submit(i, prompt, seed=100 + i, max_new_tokens=MAX_NEW[i])
  left = {i: list(OBSERVATIONS) for i in range(len(MAX_NEW))}
  trajectories, turns = {}, []
  while eng.busy:
    for turn in eng.step():
      turns.append(turn)
      if left[turn.episode_id]:
        eng.submit(turn.episode_id, left[turn.episode_id].pop(0))
      else:
        trajectories[turn.episode_id] = eng.finish(turn.episode_id)
  return trajectories, turns


@pytest.fixture(scope="module")
def dense_rollout(weights):
  return _rollout(engine(weights))[0]


def _assert_same(got, want):
  assert_same_trajectories(got, want, len(MAX_NEW), turns=3)


@pytest.mark.slow  # compiles 4 prefill and 2 decode programs: ~50 s on 2 cores
def test_paged_engine_matches_dense_and_learner_with_preemption(weights, dense_rollout):
  compiles = []

  def on_event(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(kwargs.get("fun_name"))

  eng = engine(weights, PAGED, engine_cls=PagedEngine)
  eng.warmup()
  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    got, _ = _rollout(eng)
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
  assert compiles == []  # batched prefill shapes are all bucketed and warmed up
  _assert_same(got, dense_rollout)
  assert eng.stats["preemptions"] > 0, eng.stats
  assert eng.stats["prefill_rows"] > eng.stats["prefill_calls"]  # several rows per call
  assert eng.free_pages == PAGED.kv_pages  # every page came back
  for trajectory in got.values():
    t = len(trajectory.tokens)
    tokens, mask = np.zeros((1, 96), np.int32), np.zeros((1, 96), np.int32)
    tokens[0, :t], mask[0, :t] = trajectory.tokens, 1
    learner = np.asarray(policy_forward(weights, MODEL, tokens, mask, np.float32(1.0)).logp_BxT)[0, :t]
    on = trajectory.action_mask == 1
    np.testing.assert_allclose(trajectory.behavior_logp[on], learner[on], rtol=0, atol=1e-5)


# 3 GRPO-like groups: 8 episodes, 3 prompts of 21 tokens (2 full pages of 8 shared).
GROUPS = [np.random.default_rng(g).integers(0, VOCAB, 21) for g in (0, 0, 0, 1, 1, 1, 2, 2)]


@pytest.mark.slow  # one more dense and paged rollout: ~30 s on 2 cores
def test_groups_share_prompt_pages_and_sample_like_dense(weights):
  want, _ = _rollout(engine(weights), GROUPS)
  eng = engine(weights, with_sampler(kv_layout="paged", slots=6, kv_page_size=8, kv_pages=24,
                                     prefill_row_buckets=(1, 4)), engine_cls=PagedEngine)
  got, _ = _rollout(eng, GROUPS)
  _assert_same(got, want)
  # The first two groups are admitted together: their 4 followers take 2 pages each.
  # (Episode 6's three short turns end before episode 7 gets a slot: nothing to share.)
  assert eng.stats["shared_pages"] == 4 * 2, eng.stats
  assert eng.free_pages == 24


@pytest.mark.slow
def test_sharded_paged_engine_matches_dense(weights, dense_rollout):
  # fsdp=4 splits the pool into 4 page shards (2 slots over 12 pages each).
  mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
  eng = engine(weights, dataclasses.replace(PAGED, slots=8, kv_pages=48), engine_cls=PagedEngine,
               mesh=mesh)
  got, _ = _rollout(eng)
  _assert_same(got, dense_rollout)
  assert eng.stats["preemptions"] > 0, eng.stats


@pytest.mark.slow  # a dense and an expert-parallel paged rollout of an MoE model
def test_expert_parallel_paged_engine_matches_dense():
  moe = dataclasses.replace(MODEL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                            tie_word_embeddings=False)
  base = transformer.init_params(moe, jax.random.key(0))
  weights = jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, base)
  want, _ = _rollout(Engine(SAMPLER, moe, weights, stop_token_ids=(STOP,)))
  mesh = make_mesh(MeshConfig(fsdp=2, tensor=1, expert=4))
  # Pages split over fsdp=2 (not expert): 2 shards of 3 slots over 14 pages.
  eng = PagedEngine(dataclasses.replace(PAGED, kv_pages=28), moe, weights, stop_token_ids=(STOP,),
                    mesh=mesh)
  got, _ = _rollout(eng)
  _assert_same(got, want)
  assert eng.stats["preemptions"] > 0, eng.stats


def test_page_pool_hands_out_and_takes_back_pages():
  pool = PagePool(num_pages=5, page_size=4, slots=2, max_seq_len=16)
  assert pool.ensure(0, 9) and pool.table_NxM[0].tolist() == [0, 1, 2, -1]
  assert pool.ensure(1, 4) and not pool.ensure(1, 12)  # 2 more pages needed, 1 free
  assert pool.table_NxM[1].tolist() == [3, -1, -1, -1] and pool.free_pages == 1
  pool.trim(0, 4)
  assert pool.table_NxM[0].tolist() == [0, -1, -1, -1] and pool.free_pages == 3
  assert pool.ensure(1, 100)  # capped at max_seq_len: 4 pages
  assert pool.table_NxM[1].tolist() == [3, 1, 2, 4] and pool.free_pages == 0
  pool.release(1)
  assert pool.free_pages == 4
  with pytest.raises(ValueError, match="3 pages of 8 tokens cannot hold one episode"):
    PagePool(num_pages=3, page_size=8, slots=1, max_seq_len=VOCAB)


def test_dense_engine_refuses_a_paged_config(weights):
  with pytest.raises(ValueError, match="kv_layout='paged' is not the layout of Engine"):
    engine(weights, PAGED)
