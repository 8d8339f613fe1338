"""Queue and directory transports: order, backpressure, close, atomic records."""

import multiprocessing
import pickle
import queue
import threading
import time

import numpy as np
import pytest

from sao_jax.data.transport import DirectoryTransport, QueueTransport, TransportClosed
from traj_factory import make_traj


def transports(tmp_path, capacity):
  return [QueueTransport(capacity, multiprocessing.get_context("spawn")),
          DirectoryTransport(tmp_path / "records", capacity)]


@pytest.mark.parametrize("index", [0, 1], ids=["queue", "directory"])
def test_in_order_delivery_and_backpressure(tmp_path, index):
  transport = transports(tmp_path, capacity=2)[index]
  transport.put(make_traj(seed=1))
  time.sleep(0.01)  # distinct mtimes for the directory backend
  transport.put(make_traj(seed=2))
  with pytest.raises(queue.Full):  # full: the writer is held back
    transport.put(make_traj(seed=3), timeout=0.3)
  first = transport.get(timeout=1.0)
  np.testing.assert_array_equal(first.tokens, make_traj(seed=1).tokens)
  transport.put(make_traj(seed=3), timeout=1.0)  # room again
  assert transport.get(timeout=1.0) is not None and transport.get(timeout=1.0) is not None
  assert transport.get(timeout=0.1) is None


@pytest.mark.parametrize("index", [0, 1], ids=["queue", "directory"])
def test_close_releases_a_blocked_writer(tmp_path, index):
  transport = transports(tmp_path, capacity=1)[index]
  transport.put(make_traj())
  errors = []

  def writer():
    try:
      transport.put(make_traj())
    except TransportClosed as error:
      errors.append(error)

  thread = threading.Thread(target=writer)
  thread.start()
  time.sleep(0.2)
  transport.close()
  thread.join(timeout=5)
  assert not thread.is_alive() and errors and transport.closed


def test_directory_reader_ignores_partial_records(tmp_path):
  transport = DirectoryTransport(tmp_path, capacity=4)
  (tmp_path / "w-000000000001.traj.tmp").write_bytes(b"half a record")
  assert transport.get(timeout=0.1) is None
  transport.put(make_traj(seed=5))
  assert transport.get(timeout=0.5) is not None


def test_bad_capacity_is_named(tmp_path):
  with pytest.raises(ValueError, match="capacity=0"):
    QueueTransport(0)
  with pytest.raises(ValueError, match="capacity=-1"):
    DirectoryTransport(tmp_path, -1)


@pytest.mark.parametrize("by_prompt", [False, True], ids=["by_record", "by_prompt"])
def test_directory_readers_split_the_records_without_overlap(tmp_path, by_prompt):
  writers = [DirectoryTransport(tmp_path, capacity=64, writer_id=f"w{i}") for i in range(2)]
  for seed in range(12):
    writers[seed % 2].put(make_traj(seed=seed, prompt_id=seed % 5))
  readers = [DirectoryTransport(tmp_path, capacity=64, shard=(i, 3), by_prompt=by_prompt)
             for i in range(3)]
  got = [[] for _ in readers]
  for reader, mine in zip(readers, got):
    while (traj := reader.get()) is not None:
      mine.append(traj)
  tokens = [sorted(t.tokens.tobytes() for t in mine) for mine in got]
  everything = sorted(make_traj(seed=s).tokens.tobytes() for s in range(12))
  assert sorted(sum(tokens, [])) == everything, "every record read exactly once"
  assert all(len(mine) > 0 for mine in got), [len(m) for m in got]
  if by_prompt:  # a prompt's records (a GRPO group) all reach one reader
    owners = {t.prompt_id: i for i, mine in enumerate(got) for t in mine}
    assert all(owners[t.prompt_id] == i for i, mine in enumerate(got) for t in mine)
    assert all(t.prompt_id % 3 == i for i, mine in enumerate(got) for t in mine)


def test_directory_copies_in_other_processes_are_new_writers(tmp_path):
  writer = DirectoryTransport(tmp_path, capacity=8)
  copies = [pickle.loads(pickle.dumps(writer)) for _ in range(2)]
  for seed, copy in enumerate(copies):  # same sequence number 0 in each copy
    copy.put(make_traj(seed=seed))
  assert len(list(tmp_path.glob("*.traj"))) == 2, "a copy overwrote another's record"


def test_directory_shard_is_checked_and_reopen_clears_close(tmp_path):
  with pytest.raises(ValueError, match=r"shard=\(2, 2\)"):
    DirectoryTransport(tmp_path, 4, shard=(2, 2))
  transport = DirectoryTransport(tmp_path, 4)
  transport.close()
  with pytest.raises(TransportClosed):
    transport.put(make_traj(seed=0))
  transport.reopen()
  transport.put(make_traj(seed=0))
  assert not transport.closed and transport.get() is not None
