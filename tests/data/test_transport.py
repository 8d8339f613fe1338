"""Queue and directory transports: order, backpressure, close, atomic records."""

import multiprocessing
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
