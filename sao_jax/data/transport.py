"""`TrajectoryTransport`: finished trajectories from sampler processes to the learner.

Both backends are bounded: `put` blocks while `capacity` trajectories wait
unread (backpressure — a sampler far ahead of the learner pauses instead of
filling memory or disk), and `get` returns None after `timeout` seconds with
nothing to read.

- `QueueTransport`: same host; a `multiprocessing` queue from a given context
  (use "spawn" with JAX). Trajectories are small host arrays, pickled once.
- `DirectoryTransport`: many hosts sharing a directory (NFS, a mounted bucket).
  A writer writes `<writer>-<seq>.traj.tmp` and renames it to `.traj` (atomic on
  POSIX), so a reader never sees a partial record; the reader consumes files in
  (time, name) order and deletes them.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import queue
import time
import uuid

from sao_jax.data import records
from sao_jax.data.records import Trajectory


class TransportClosed(Exception):
  """Raised by `put` after `close()`."""


class QueueTransport:
  """Same-host transport over a bounded multiprocessing queue (picklable to children)."""

  def __init__(self, capacity: int, context: multiprocessing.context.BaseContext | None = None):
    if capacity <= 0:
      raise ValueError(f"transport capacity={capacity} must be positive")
    context = context or multiprocessing.get_context("spawn")
    self._queue = context.Queue(maxsize=capacity)
    self._closed = context.Event()

  def put(self, traj: Trajectory, timeout: float | None = None) -> None:
    """Blocks while the queue is full; raises TransportClosed once closed,
    queue.Full after `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      if self._closed.is_set():
        raise TransportClosed("the learner closed the trajectory transport")
      wait = 0.1 if deadline is None else min(0.1, max(deadline - time.monotonic(), 0.0))
      try:
        self._queue.put(traj, timeout=wait)
        return
      except queue.Full:
        if deadline is not None and time.monotonic() >= deadline:
          raise

  def get(self, timeout: float = 0.0) -> Trajectory | None:
    try:
      return self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
    except queue.Empty:
      return None

  def close(self) -> None:
    self._closed.set()

  @property
  def closed(self) -> bool:
    return self._closed.is_set()


class DirectoryTransport:
  """Cross-host transport through record files in a shared directory."""

  SUFFIX = ".traj"

  def __init__(self, directory: str | os.PathLike, capacity: int, writer_id: str | None = None):
    if capacity <= 0:
      raise ValueError(f"transport capacity={capacity} must be positive")
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self.capacity = capacity
    self._writer_id = writer_id or uuid.uuid4().hex[:12]
    self._seq = 0

  def _pending(self) -> list[pathlib.Path]:
    return list(self.directory.glob(f"*{self.SUFFIX}"))

  @property
  def closed(self) -> bool:
    return (self.directory / "CLOSED").exists()

  def put(self, traj: Trajectory, timeout: float | None = None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(self._pending()) >= self.capacity:
      if self.closed:
        raise TransportClosed(f"the learner closed {self.directory}")
      if deadline is not None and time.monotonic() >= deadline:
        raise queue.Full(f"{self.directory} holds {self.capacity} unread trajectories")
      time.sleep(0.05)
    if self.closed:
      raise TransportClosed(f"the learner closed {self.directory}")
    name = f"{self._writer_id}-{self._seq:012d}"
    self._seq += 1
    tmp = self.directory / f"{name}{self.SUFFIX}.tmp"
    tmp.write_bytes(records.to_bytes(traj))
    tmp.rename(self.directory / f"{name}{self.SUFFIX}")

  def get(self, timeout: float = 0.0) -> Trajectory | None:
    deadline = time.monotonic() + timeout
    while True:
      pending = sorted(self._pending(), key=lambda p: (p.stat().st_mtime_ns, p.name))
      if pending:
        path = pending[0]
        traj = records.from_bytes(path.read_bytes())
        path.unlink()
        return traj
      if time.monotonic() >= deadline:
        return None
      time.sleep(0.02)

  def close(self) -> None:
    (self.directory / "CLOSED").touch()
