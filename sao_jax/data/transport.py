"""`TrajectoryTransport`: finished trajectories from sampler processes to the learner.

Both backends are bounded: `put` blocks while `capacity` trajectories wait
unread (backpressure — a sampler far ahead of the learner pauses instead of
filling memory or disk), and `get` returns None after `timeout` seconds with
nothing to read.

- `QueueTransport`: same host; a `multiprocessing` queue from a given context
  (use "spawn" with JAX). Trajectories are small host arrays, pickled once.
- `DirectoryTransport`: many hosts sharing a directory (NFS, a mounted bucket).
  A writer (each unpickled copy is a new one) writes
  `<writer>-<seq>.p<prompt id>.traj.tmp` and renames it to `.traj` (atomic on
  POSIX), so a reader never sees a partial record; the reader consumes files in
  (time, name) order and deletes them.

  Several readers (the hosts of a multi-host learner, each loading its own rows)
  share one directory without ever reading the same record: reader `i` of `n`
  (`shard=(i, n)`) takes only the records whose key is `i` modulo `n`. The key is
  the writer's record index `<seq>` (each writer's records go round-robin to the
  readers), or, with `by_prompt=True` (GRPO groups, which must reach one reader
  whole), the trajectory's `prompt_id`. The partition is a function of the file
  name alone, so it needs no coordination and survives restarts.
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

  def __init__(self, directory: str | os.PathLike, capacity: int, writer_id: str | None = None,
               *, shard: tuple[int, int] = (0, 1), by_prompt: bool = False):
    """`shard=(i, n)`: this reader takes the records of key i mod n (module docstring)."""
    if capacity <= 0:
      raise ValueError(f"transport capacity={capacity} must be positive")
    if not 0 <= shard[0] < shard[1]:
      raise ValueError(f"transport shard={shard} must be (index, count) with 0 <= index < count")
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self.capacity = capacity
    self._writer_id = writer_id or uuid.uuid4().hex[:12]
    self._seq = 0
    self.shard, self.by_prompt = shard, by_prompt

  def __setstate__(self, state: dict) -> None:
    """A copy in another process (a spawned sampler, or its restart) is a new writer:
    with the sender's id and counter it would overwrite the sender's unread records."""
    self.__dict__.update(state)
    self._writer_id = f"{state['_writer_id']}.{uuid.uuid4().hex[:8]}"
    self._seq = 0

  def _pending(self) -> list[pathlib.Path]:
    return list(self.directory.glob(f"*{self.SUFFIX}"))

  def _mine(self, path: pathlib.Path) -> bool:
    """Whether the record at `path` belongs to this reader's shard."""
    index, count = self.shard
    if count == 1:
      return True
    record, _, prompt_id = path.name[:-len(self.SUFFIX)].rpartition(".p")
    seq = record.rpartition("-")[2]
    return int(prompt_id if self.by_prompt else seq) % count == index

  def reopen(self) -> None:
    """Clears a previous run's close marker, so writers of this run are not turned away."""
    (self.directory / "CLOSED").unlink(missing_ok=True)

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
    name = f"{self._writer_id}-{self._seq:012d}.p{traj.prompt_id}"
    self._seq += 1
    tmp = self.directory / f"{name}{self.SUFFIX}.tmp"
    tmp.write_bytes(records.to_bytes(traj))
    tmp.rename(self.directory / f"{name}{self.SUFFIX}")

  def get(self, timeout: float = 0.0) -> Trajectory | None:
    deadline = time.monotonic() + timeout
    while True:
      pending = sorted(filter(self._mine, self._pending()),
                       key=lambda p: (p.stat().st_mtime_ns, p.name))
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
