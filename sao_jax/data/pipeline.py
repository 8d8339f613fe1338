"""The learner's input pipeline: a grain `IterDataset` over a trajectory transport.

    transport -> TransportDataset        trajectories as they finish (blocks, never polls a round)
              -> GroupDataset            single mode: each trajectory at once; group mode
                                         (GRPO): a prompt's group once all members finished
              -> AdmitDataset            drops, counted per reason: environment failures,
                                         malformed trajectories, lag > max_lag, too long
              -> BatchDataset            `batch_trajectories` rows right-padded to the
                                         smallest length bucket -> (Batch, BatchInfo)

Units flow as lists: one trajectory in single mode, a group in group mode, so a
group is never split across batches. A unit that does not fit the rest of a batch
starts the next one and the batch is completed with empty rows (action_mask 0:
they contribute nothing to any loss).

Staleness (SAO.md §1): `lag = current policy version - first policy version`,
with the version read when the trajectory is admitted. SAO.md counts learner
steps; we count policy updates, which is the same once the critic warm-up is
over, and does not age trajectories during value-only steps (value
pretraining, critic warm-up), when the policy does not change. Nothing is dropped silently:
`Drops` counts every rejected trajectory by reason for the metrics.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Iterator

import grain
import numpy as np

from sao_jax.data import records
from sao_jax.data.records import Trajectory
from sao_jax.types import Batch


class Drops(collections.Counter):
  """Rejected trajectories by reason ('stale', 'env_failure', 'nan_logp', ...), and
  `examples[reason]`: a detail of the latest one (the failure text, the lag)."""

  def __init__(self):
    super().__init__()
    self.examples: dict[str, str] = {}


@dataclasses.dataclass
class BatchInfo:
  """Host-side facts about a batch, for metrics."""

  lags: np.ndarray  # [real rows] current - first policy version
  version_spans: np.ndarray  # [real rows] last - first policy version
  lengths: np.ndarray  # [real rows] tokens
  padding_rows: int


class _Iterator(grain.DatasetIterator):
  """A pipeline stage's iterator: `_next()` plus a JSON-able state of counters."""

  def __init__(self, parent: grain.DatasetIterator | None = None):
    super().__init__(parent if parent is not None else ())
    self._counts: dict[str, int] = {}

  def get_state(self) -> dict:
    return {"counts": dict(self._counts),
            "parent": self._parent.get_state() if self._parents else {}}

  def set_state(self, state: dict) -> None:
    self._counts = dict(state.get("counts", {}))
    if self._parents:
      self._parent.set_state(state.get("parent", {}))


class TransportDataset(grain.IterDataset):
  """Trajectories from `transport` as they arrive; ends when `should_stop()` or the
  transport is closed and empty."""

  def __init__(self, transport, *, should_stop: Callable[[], bool] = lambda: False,
               poll_s: float = 0.2):
    super().__init__()
    self._transport, self._should_stop, self._poll_s = transport, should_stop, poll_s

  def __iter__(self):
    return _TransportIterator(self._transport, self._should_stop, self._poll_s)


class _TransportIterator(_Iterator):

  def __init__(self, transport, should_stop, poll_s):
    super().__init__()
    self._transport, self._should_stop, self._poll_s = transport, should_stop, poll_s

  def __next__(self) -> Trajectory:
    while True:
      traj = self._transport.get(timeout=self._poll_s)
      if traj is not None:
        self._counts["received"] = self._counts.get("received", 0) + 1
        return traj
      if self._should_stop() or self._transport.closed:
        raise StopIteration


class GroupDataset(grain.IterDataset):
  """Lists of trajectories: singletons (`group_size == 1`) or whole prompt groups."""

  def __init__(self, parent: grain.IterDataset, group_size: int):
    super().__init__(parent)
    self._group_size = group_size

  def __iter__(self):
    return _GroupIterator(self._parent.__iter__(), self._group_size)


class _GroupIterator(_Iterator):

  def __init__(self, parent, group_size):
    super().__init__(parent)
    self._group_size = group_size
    self._waiting: dict[int, list[Trajectory]] = collections.defaultdict(list)

  def __next__(self) -> list[Trajectory]:
    while True:
      traj = next(self._parent)
      if self._group_size == 1:
        return [traj]
      members = self._waiting[traj.prompt_id]
      members.append(traj)
      if len(members) == self._group_size:
        del self._waiting[traj.prompt_id]
        return members


class AdmitDataset(grain.IterDataset):
  """Filters each unit's members; counts every drop in `drops`."""

  def __init__(self, parent: grain.IterDataset, *, current_version: Callable[[], int],
               max_lag: int,
               max_length: int, vocab_size: int, drops: Drops, num_prompt_slots: int | None = None):
    super().__init__(parent)
    self._kwargs = dict(current_version=current_version, max_lag=max_lag, max_length=max_length,
                        vocab_size=vocab_size, drops=drops, num_prompt_slots=num_prompt_slots)

  def __iter__(self):
    return _AdmitIterator(self._parent.__iter__(), **self._kwargs)


class _AdmitIterator(_Iterator):

  def __init__(self, parent, *, current_version, max_lag, max_length, vocab_size, drops,
               num_prompt_slots):
    super().__init__(parent)
    self._current_version, self._max_lag, self._max_length = current_version, max_lag, max_length
    self._vocab_size, self._drops, self._slots = vocab_size, drops, num_prompt_slots

  def _reason(self, traj: Trajectory, version: int) -> str | None:
    if traj.env_failure is not None:
      return "env_failure"
    found = records.problems(traj, self._vocab_size)
    if found:
      return found[0]
    if self._slots is not None and not 0 <= traj.prompt_id < self._slots:
      return "prompt_id_out_of_range"
    if traj.length > self._max_length:
      return "too_long"
    if version - traj.policy_versions[0] > self._max_lag:
      return "stale"
    return None

  def __next__(self) -> list[Trajectory]:
    while True:
      unit = next(self._parent)
      version = self._current_version()
      kept = []
      for traj in unit:
        reason = self._reason(traj, version)
        if reason is None:
          kept.append(traj)
        else:
          self._drops[reason] += 1
          self._drops.examples[reason] = (
              traj.env_failure if reason == "env_failure" else
              f"lag {version - traj.policy_versions[0]}" if reason == "stale" else
              f"task {traj.info.get('task', '?')}, {traj.length} tokens")
          self._counts[reason] = self._counts.get(reason, 0) + 1
      if kept:
        return kept


class BatchDataset(grain.IterDataset):
  """(Batch, BatchInfo) of `batch_size` rows padded to a length bucket."""

  def __init__(self, parent: grain.IterDataset, *, batch_size: int, buckets: tuple[int, ...],
               pad_id: int, current_version: Callable[[], int]):
    super().__init__(parent)
    self._kwargs = dict(batch_size=batch_size, buckets=buckets, pad_id=pad_id,
                        current_version=current_version)

  def __iter__(self):
    return _BatchIterator(self._parent.__iter__(), **self._kwargs)


def pad_batch(trajs: list[Trajectory], batch_size: int, length: int, pad_id: int) -> Batch:
  """Right-pads `trajs` to `[batch_size, length]`; missing rows are empty (all masks 0)."""
  tokens = np.full((batch_size, length), pad_id, np.int32)
  attention = np.zeros((batch_size, length), np.int32)
  action = np.zeros((batch_size, length), np.int32)
  logp = np.zeros((batch_size, length), np.float32)
  rewards = np.zeros((batch_size, length), np.float32)
  # Empty rows get distinct negative ids: their own (empty) GRPO group.
  prompt_ids = -1 - np.arange(batch_size, dtype=np.int32)
  for row, traj in enumerate(trajs):
    n = traj.length
    tokens[row, :n] = traj.tokens
    attention[row, :n] = 1
    action[row, :n] = traj.action_mask
    logp[row, :n] = traj.behavior_logp
    rewards[row, :n] = traj.rewards
    prompt_ids[row] = traj.prompt_id
  return Batch(tokens, attention, action, logp, rewards, prompt_ids)


class _BatchIterator(_Iterator):

  def __init__(self, parent, *, batch_size, buckets, pad_id, current_version):
    super().__init__(parent)
    self._batch_size, self._buckets, self._pad_id = batch_size, buckets, pad_id
    self._current_version = current_version
    self._carry: list[Trajectory] = []

  def __next__(self) -> tuple[Batch, BatchInfo]:
    rows = self._carry
    self._carry = []
    while len(rows) < self._batch_size:
      try:
        unit = next(self._parent)
      except StopIteration:
        if not rows:
          raise
        break
      if len(rows) + len(unit) > self._batch_size:
        self._carry = unit
        break
      rows = rows + unit
    longest = max(traj.length for traj in rows)
    length = next(b for b in self._buckets if b >= longest)
    version = self._current_version()
    info = BatchInfo(
        lags=np.array([version - t.policy_versions[0] for t in rows]),
        version_spans=np.array([t.policy_versions[1] - t.policy_versions[0] for t in rows]),
        lengths=np.array([t.length for t in rows]),
        padding_rows=self._batch_size - len(rows))
    self._counts["batches"] = self._counts.get("batches", 0) + 1
    return pad_batch(rows, self._batch_size, length, self._pad_id), info


def learner_pipeline(transport, *, batch_size: int, group_size: int, max_lag: int,
                     buckets: tuple[int, ...], pad_id: int, vocab_size: int,
                     current_version: Callable[[], int], drops: Drops,
                     num_prompt_slots: int | None = None,
                     should_stop: Callable[[], bool] = lambda: False) -> Iterator:
  """The whole pipeline as one grain iterator of (Batch, BatchInfo)."""
  if group_size > batch_size:
    raise ValueError(f"group_size={group_size} does not fit batch_size={batch_size}")
  dataset = TransportDataset(transport, should_stop=should_stop)
  dataset = GroupDataset(dataset, group_size)
  dataset = AdmitDataset(dataset, current_version=current_version, max_lag=max_lag,
                         max_length=buckets[-1], vocab_size=vocab_size, drops=drops,
                         num_prompt_slots=num_prompt_slots)
  dataset = BatchDataset(dataset, batch_size=batch_size, buckets=buckets, pad_id=pad_id,
                         current_version=current_version)
  return iter(dataset)
