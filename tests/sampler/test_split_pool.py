"""The paged pool split over the sampler mesh's batch axes, host side
(`sao_jax.sampler.pages`): one allocator per shard with page ids local to it, slots bound
to a shard, sharing within a shard, admission to the shard holding a group's prompt pages
else the least loaded one. The split engine's exactness on a mesh is
tests/models/test_paged_mesh.py (beside the interpreted kernel it also runs)."""

import numpy as np
import pytest

from sao_jax.sampler.pages import PagePool


def test_each_shard_hands_out_its_own_local_page_ids():
  # 2 shards of 4 pages, slots 0-1 in shard 0 and 2-3 in shard 1.
  pool = PagePool(num_pages=8, page_size=4, slots=4, max_seq_len=16, shards=2)
  assert [pool.shard_of(s) for s in range(4)] == [0, 0, 1, 1]
  assert pool.ensure(0, 9) and pool.table_NxM[0].tolist() == [0, 1, 2, -1]
  assert pool.ensure(2, 5) and pool.table_NxM[2].tolist() == [0, 1, -1, -1]  # shard 1's ids
  assert (pool.free_in(0), pool.free_in(1), pool.free_pages) == (1, 2, 3)
  # Slot 1 may not borrow from shard 1: 2 pages needed, its shard has 1 free.
  assert not pool.ensure(1, 8) and pool.held(1) == 0 and pool.free_in(1) == 2
  assert pool.ensure(3, 8) and pool.table_NxM[3].tolist() == [2, 3, -1, -1]
  assert pool.free_in(1) == 0
  pool.release(2)
  assert pool.free_in(1) == 2 and pool.free_in(0) == 1
  assert pool.ensure(1, 4) and pool.table_NxM[1].tolist() == [3, -1, -1, -1]


def test_sharing_stays_within_a_shard_and_within_its_entry_budget():
  pool = PagePool(num_pages=8, page_size=4, slots=4, max_seq_len=16, shards=2)
  assert pool.ensure(0, 8)
  with pytest.raises(ValueError, match=r"one shard \(they are in shards 0, 1\)"):
    pool.share(0, 2, 2)
  assert pool.share(0, 1, 2) and pool.table_NxM[1].tolist() == [0, 1, -1, -1]
  assert pool.extra_entries(0) == 2 and pool.extra_entries(1) == 0
  pool.release(0)
  assert pool.free_in(0) == 2  # pages 0 and 1 are still slot 1's
  pool.release(1)
  assert pool.free_in(0) == 4


def test_a_split_pool_names_what_does_not_divide():
  with pytest.raises(ValueError, match=r"a paged cache of 6 slots does not split over the 4 "
                                       r"page shards of the sampler mesh's data and fsdp axes: "
                                       r"set sampler.slots and sampler.kv_pages to multiples of 4"):
    PagePool(num_pages=16, page_size=4, slots=6, max_seq_len=16, shards=4)
  with pytest.raises(ValueError, match=r"3 pages of 4 tokens per shard \(12 over 4 shards\) "
                                       r"cannot hold one episode"):
    PagePool(num_pages=12, page_size=4, slots=4, max_seq_len=16, shards=4)


def test_admission_tries_the_holders_shard_then_the_least_loaded():
  pool = PagePool(num_pages=12, page_size=4, slots=6, max_seq_len=16, shards=3)
  occupied = np.zeros(3, int)
  assert pool.shard_order((), occupied) == [0, 1, 2]  # a tie: lowest index
  assert pool.ensure(0, 8)  # shard 0: 2 of 4 pages free
  assert pool.shard_order((), occupied) == [1, 2, 0]
  assert pool.shard_order((), np.array([0, 1, 0])) == [2, 1, 0]  # same pages: fewer slots
  assert pool.shard_order([0], occupied) == [0, 1, 2]  # the holder's shard first


def test_an_evaluation_whose_slots_do_not_split_is_refused_before_any_policy_loads(
    monkeypatch):
  """The demo's mesh (fsdp over all 8 devices) as the sampler mesh has 8 page shards:
  4 slots cannot split over them, and `sao-eval` says so before restoring anything."""
  import pathlib

  from sao_jax.config import load_config
  from sao_jax.jobs import evaluate

  demo = pathlib.Path(__file__).resolve().parents[2] / "configs" / "demo_cpu.py"
  restored = []
  monkeypatch.setattr(evaluate, "restore_policy", lambda *a, **k: restored.append(a))
  with pytest.raises(ValueError, match=r"4 slots does not split over the 8 page shards of mesh "
                     r"axes \('fsdp',\): set sampler.slots and sampler.kv_pages to multiples of 8"):
    evaluate.evaluate_checkpoint(load_config(demo, ["sampler.slots=4"]))
  assert restored == []
  assert dict(evaluate.sampler_mesh(load_config(demo, ["sampler.slots=8"])).shape)["fsdp"] == 8
