"""The learner's input pipeline: a grain `IterDataset` over a trajectory transport.

    transport -> TransportDataset        trajectories as they finish (blocks, never polls a round)
              -> GroupDataset            single mode: each trajectory at once; group mode
                                         (GRPO): a prompt's group once all members finished
              -> PositionsDataset        records each unit's task as reached (`task_positions`:
                                         where a restarted sampler's task stream goes on)
              -> AdmitDataset            drops, counted per reason: environment failures,
                                         malformed trajectories, lag > max_lag, too long
              -> BatchDataset            `batch_trajectories` rows right-padded to the
                                         smallest length bucket -> (Batch, BatchInfo)
              or PackDataset             (learner.batch_tokens) trajectories packed first-fit
                                         into `rows` rows of `row_length` -> (Batch, BatchInfo)

Units flow as lists: one trajectory in single mode, a group in group mode, so a
group is never split across batches. A unit that does not fit the rest of a batch
starts the next one and the batch is completed with empty rows (action_mask 0:
they contribute nothing to any loss). State (`get_state`, checkpointed by
`run_learner`) includes what a stage holds after taking it from upstream: the
unit held back for the next batch and the members of unfinished groups, so a
resumed pipeline loses none of them.

Packing (`PackDataset`): each member of an arriving unit goes to the first row
with room for it (first fit, in arrival order), as segment 1, 2, ... of that row
(`Batch.segment_ids`, `sao_jax.segments`). A batch holds at most
`max_trajectories`; it closes as soon as the next unit does not fit (a member
finds no row with room, or the cap would be exceeded), and that unit opens the
next batch, or earlier when it is full. The shape is always `[rows, row_length]`:
one compiled step. `BatchInfo.padding_fraction` says what padding costs.

Versions: a trajectory whose last policy version is past the learner's
(`future_version`: a peer's forgery, or records a crashed run wrote after the
checkpoint it resumed from) is dropped; an unfinished group that can no longer
be trained (stale or future) is let go when the next group opens (`GroupDataset`).

Staleness (docs/algorithm.md §1): `lag = current policy version - first policy version`,
checked when the trajectory is admitted and again when a unit held back for a
later batch is taken into it (`StaleFilter`), so the check holds for the version
the batch is trained at. docs/algorithm.md counts learner
steps; we count policy updates, which is the same once the critic warm-up is
over, and does not age trajectories during value-only steps (value
pretraining, critic warm-up), when the policy does not change. Nothing is dropped silently:
`Drops` counts every rejected trajectory by reason for the metrics. What a
trajectory says about itself is bounded there: environment failures are also
counted by their `info["failure_kind"]` for the first `MAX_FAILURE_KINDS` kinds
(later ones as `env_failure/other`), each kind keeps its first example, which holds at most
`MAX_EXAMPLE_CHARS` characters with its control characters escaped, so a peer's
records cannot add metric keys, log lines or memory without end, nor write escape
sequences or forged lines into the learner's log. Admission tells a
`failures.Intake` of every trajectory it judges: its bound stops a run whose
episodes (nearly) all fail, naming each failure kind and its first message.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import time
from typing import Callable, Iterator

import grain
import numpy as np

from sao_jax.channel import records
from sao_jax.config.learner import packed_rows
from sao_jax.data import failures
from sao_jax.data.sampler_phases import read_sampler_phases
from sao_jax.data.task_positions import TaskPositions
from sao_jax.log_text import untrusted
from sao_jax.types import Batch
from sao_jax.types import Trajectory


MAX_FAILURE_KINDS = 32  # exception types a sampler reports: a few in practice
MAX_EXAMPLE_CHARS = 300


class Drops(collections.Counter):
  """Rejected trajectories by reason ('stale', 'env_failure', 'nan_logp', ...), and
  `examples[reason]`: a detail of the first one (the failure text, the lag), as one
  printable line (`log_text.untrusted`: the learner logs it, and a sampler's failure
  text can hold whatever the policy, a tool or a peer wrote). The first, not the
  latest: reports name each kind by its first message (`data.failures`)."""

  def __init__(self):
    super().__init__()
    self.examples: dict[str, str] = {}

  def add(self, reason: str, count: int, example: str) -> None:
    """Counts `count` drops for `reason`; `example` (cut to MAX_EXAMPLE_CHARS) says why,
    kept when it is the reason's first."""
    self[reason] += count
    self.examples.setdefault(reason, untrusted(example[:MAX_EXAMPLE_CHARS]))


@dataclasses.dataclass
class BatchInfo:
  """Host-side facts about a batch, for metrics."""

  lags: np.ndarray  # [trajectories] current - first policy version
  version_spans: np.ndarray  # [trajectories] last - first policy version
  lengths: np.ndarray  # [trajectories] tokens
  padding_rows: int  # rows without any trajectory
  capacity: int  # tokens in the batch arrays, rows * T
  # [trajectories] (why the episode ended, why its last turn ended): the sampler's
  # `info["end"]` and `info["last_turn_end"]` ("" when not recorded).
  ends: tuple[tuple[str, str], ...] = ()
  # [trajectories] tools the environment ran (`info["tool_calls"]`; 0 when not a
  # non-negative number, as from a peer that does not record it).
  tool_calls: tuple[int, ...] = ()
  # [trajectories] the task's data source (`info["source"]`; "" when absent or not a
  # short printable string), the outcome (final reward), and the episode's metrics
  # (`info["metrics"]`, finite numbers by name; what a peer wrote is bounded here).
  sources: tuple[str, ...] = ()
  outcomes: tuple[float, ...] = ()
  episode_metrics: tuple[dict[str, float], ...] = ()
  # [trajectories] weight-channel network faults its sampler waited out, and peer errors
  # or refused versions it counted, since its previous trajectory (`sampler.worker`).
  weight_waits: tuple[int, ...] = ()
  weight_errors: tuple[int, ...] = ()
  # [trajectories] the sampler's phases since its previous trajectory (`info["phases"]`,
  # `data.sampler_phases`; {} from a peer that does not report them).
  sampler_phases: tuple[dict[str, float], ...] = ()
  # [groups completed into this batch] seconds from a group's first member reaching the
  # learner to its last (`GroupDataset`; empty in single mode).
  group_release_s: tuple[float, ...] = ()

  @property
  def padding_fraction(self) -> float:
    """Share of the batch's token slots that hold padding (compute spent on nothing)."""
    return 1.0 - float(np.sum(self.lengths)) / self.capacity


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


def _encode(trajs: list[Trajectory]) -> list[str]:
  """Trajectories as JSON-able text (base64 of `records.to_bytes`), for iterator state."""
  return [base64.b64encode(records.to_bytes(traj)).decode("ascii") for traj in trajs]


def _decode(texts: list[str]) -> list[Trajectory]:
  return [records.from_bytes(base64.b64decode(text)) for text in texts]


class StaleFilter:
  """Drops members of a unit with `lag = current_version() - first policy version >
  max_lag`, counting each in `drops` (docs/algorithm.md §1)."""

  def __init__(self, current_version: Callable[[], int], max_lag: int, drops: Drops):
    self.current_version, self._max_lag, self.drops = current_version, max_lag, drops

  def is_stale(self, traj: Trajectory, version: int) -> bool:
    return version - traj.policy_versions[0] > self._max_lag

  @staticmethod
  def is_future(traj: Trajectory, version: int) -> bool:
    """Sampled by a policy the learner has not made (yet, or any more after a resume
    from an older checkpoint): a peer's forgery or a lost future, never trainable."""
    return traj.policy_versions[1] > version

  def keep(self, unit: list[Trajectory]) -> list[Trajectory]:
    """The members of `unit` that are not stale now; the others are counted."""
    version = self.current_version()
    kept = []
    for traj in unit:
      if self.is_stale(traj, version):
        self.drops.add("stale", 1, f"lag {version - traj.policy_versions[0]}")
      else:
        kept.append(traj)
    return kept


class _CarryingIterator(_Iterator):
  """A batcher that may hold back one unit (a trajectory or a whole group) that did
  not fit its batch; the unit opens the next batch and is part of the state. The
  policy may have moved on meanwhile, so the held-back unit passes `stale` again
  when it is taken (`_take_carry`)."""

  def __init__(self, parent, stale: StaleFilter):
    super().__init__(parent)
    self._carry: list[Trajectory] = []
    self._stale = stale

  def _take_carry(self) -> list[Trajectory]:
    """The held-back unit, less the members that have gone stale (counted)."""
    unit, self._carry = self._carry, []
    kept = self._stale.keep(unit)
    if len(kept) < len(unit):
      self._counts["stale"] = self._counts.get("stale", 0) + len(unit) - len(kept)
    return kept

  def get_state(self) -> dict:
    # The unit held back for the next batch was consumed upstream: it lives only here.
    return {**super().get_state(), "carry": _encode(self._carry)}

  def set_state(self, state: dict) -> None:
    super().set_state(state)
    self._carry = _decode(state.get("carry", []))


class Interrupted(Exception):
  """The learner was told to stop (SIGTERM) while it waited for trajectories: raised out
  of the pipeline at its next poll, within one poll interval. Each stage keeps what it
  had taken in its state (a batcher puts the rows it had gathered back into its carry),
  so the checkpoint the learner writes next holds every trajectory that reached it."""


class TransportDataset(grain.IterDataset):
  """Trajectories from `transport` as they arrive; ends when `should_stop()` (asked at
  every empty poll) or the transport is closed and empty, and raises `Interrupted` when
  `interrupted()` (asked before every poll). `on_poll()` runs before every poll, empty
  or not: while trajectories keep coming and are all dropped, no poll is empty, and the
  learner must still be able to say what it waits for."""

  def __init__(self, transport, *, should_stop: Callable[[], bool] = lambda: False,
               poll_s: float = 0.2, on_poll: Callable[[], None] = lambda: None,
               interrupted: Callable[[], bool] = lambda: False):
    super().__init__()
    self._transport, self._should_stop, self._poll_s = transport, should_stop, poll_s
    self._on_poll, self._interrupted = on_poll, interrupted

  def __iter__(self):
    return _TransportIterator(self._transport, self._should_stop, self._poll_s, self._on_poll,
                              self._interrupted)


class _TransportIterator(_Iterator):

  def __init__(self, transport, should_stop, poll_s, on_poll, interrupted):
    super().__init__()
    self._transport, self._should_stop, self._poll_s = transport, should_stop, poll_s
    self._on_poll, self._interrupted = on_poll, interrupted

  def __next__(self) -> Trajectory:
    while True:
      if self._interrupted():
        raise Interrupted("stopped while waiting for trajectories")
      self._on_poll()
      traj = self._transport.get(timeout=self._poll_s)
      if traj is not None:
        self._counts["received"] = self._counts.get("received", 0) + 1
        return traj
      if self._should_stop() or self._transport.closed:
        raise StopIteration


class GroupDataset(grain.IterDataset):
  """Lists of trajectories: singletons (`group_size == 1`) or whole prompt groups.

  A group waits here until its `group_size` members have arrived. One that can no
  longer be trained is let go when a new group opens, its members counted in
  `drops`: a group whose members are stale (they all start at one policy
  version, so admission would drop every one of them) or from a future version
  (`StaleFilter.is_future`). So what waits is bounded by what arrives within
  `max_lag` policy updates, whatever a peer sends: a group whose other members
  died with a sampler, or a resumed learner's restored groups, do not wait forever.

  A group's *release delay* is the time from its first member reaching this stage
  to its last (on `clock`, seconds): what GRPO waits for a group's slowest member.
  It is written into every member's `info[GROUP_RELEASE_KEY]` (the same key
  from a sampler or peer is removed on arrival, so only this stage sets it), read
  into `BatchInfo.group_release_s`. A group restored from a checkpoint counts from
  the restore.
  """

  def __init__(self, parent: grain.IterDataset, group_size: int, stale: StaleFilter, *,
               clock: Callable[[], float] = time.monotonic):
    super().__init__(parent)
    self._group_size, self._stale, self._clock = group_size, stale, clock

  def __iter__(self):
    return _GroupIterator(self._parent.__iter__(), self._group_size, self._stale, self._clock)


GROUP_RELEASE_KEY = "group_release_s"


class _GroupIterator(_Iterator):

  def __init__(self, parent, group_size, stale, clock):
    super().__init__(parent)
    self._group_size, self._stale, self._clock = group_size, stale, clock
    self._waiting: dict[int, list[Trajectory]] = collections.defaultdict(list)
    self._opened: dict[int, float] = {}  # prompt id -> when its first member arrived

  def _let_go(self) -> None:
    """Drops the waiting groups that can no longer be trained (class docstring)."""
    version = self._stale.current_version()
    for pid in list(self._waiting):
      first = self._waiting[pid][0]
      future = self._stale.is_future(first, version)
      if future or self._stale.is_stale(first, version):
        reason = "future_version" if future else "stale"
        members = self._waiting.pop(pid)
        self._opened.pop(pid, None)
        self._stale.drops.add(reason, len(members), f"an unfinished group ({len(members)} of "
                              f"{self._group_size} members), versions {first.policy_versions}, "
                              f"learner at {version}")

  def get_state(self) -> dict:
    # Members of unfinished groups were consumed upstream: they live only here.
    return {**super().get_state(),
            "waiting": {str(pid): _encode(members) for pid, members in self._waiting.items()}}

  def set_state(self, state: dict) -> None:
    super().set_state(state)
    self._waiting = collections.defaultdict(list, {
        int(pid): _decode(members) for pid, members in state.get("waiting", {}).items()})
    now = self._clock()
    self._opened = {pid: now for pid in self._waiting}

  def __next__(self) -> list[Trajectory]:
    while True:
      traj = next(self._parent)
      traj.info.pop(GROUP_RELEASE_KEY, None)  # only this stage says it
      if self._group_size == 1:
        return [traj]
      now = self._clock()
      if traj.prompt_id not in self._waiting:
        self._let_go()
      members = self._waiting[traj.prompt_id]
      opened = self._opened.setdefault(traj.prompt_id, now)
      members.append(traj)
      if len(members) == self._group_size:
        del self._waiting[traj.prompt_id]
        del self._opened[traj.prompt_id]
        for member in members:  # each: admission may drop some of them
          member.info[GROUP_RELEASE_KEY] = now - opened
        return members


class PositionsDataset(grain.IterDataset):
  """Units unchanged; each unit's task recorded in `positions` (`task_positions`), whose
  record is this stage's state."""

  def __init__(self, parent: grain.IterDataset, positions: TaskPositions):
    super().__init__(parent)
    self._positions = positions

  def __iter__(self):
    return _PositionsIterator(self._parent.__iter__(), self._positions)


class _PositionsIterator(_Iterator):

  def __init__(self, parent, positions: TaskPositions):
    super().__init__(parent)
    self._positions = positions

  def __next__(self) -> list[Trajectory]:
    unit = next(self._parent)
    self._positions.record(unit)
    return unit

  def get_state(self) -> dict:
    return {**super().get_state(), "task_positions": self._positions.get_state()}

  def set_state(self, state: dict) -> None:
    super().set_state(state)
    # A checkpoint from before positions were kept: every stream starts at task 0.
    self._positions.set_state(state.get("task_positions", {}))


class AdmitDataset(grain.IterDataset):
  """Filters each unit's members; counts every drop in `drops`, and tells `intake`
  (`failures.Intake`: the failure bound) of each member judged."""

  def __init__(self, parent: grain.IterDataset, *, stale: StaleFilter,
               max_length: int, vocab_size: int, drops: Drops, num_prompt_slots: int | None = None,
               intake: failures.Intake | None = None):
    super().__init__(parent)
    self._kwargs = dict(stale=stale, max_length=max_length, vocab_size=vocab_size, drops=drops,
                        num_prompt_slots=num_prompt_slots, intake=intake)

  def __iter__(self):
    return _AdmitIterator(self._parent.__iter__(), **self._kwargs)


class _AdmitIterator(_Iterator):

  def __init__(self, parent, *, stale, max_length, vocab_size, drops, num_prompt_slots, intake):
    super().__init__(parent)
    self._stale, self._max_length = stale, max_length
    self._vocab_size, self._drops, self._slots = vocab_size, drops, num_prompt_slots
    self._intake = intake

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
    if self._stale.is_stale(traj, version):
      return "stale"
    if self._stale.is_future(traj, version):
      return "future_version"
    return None

  def __next__(self) -> list[Trajectory]:
    while True:
      unit = next(self._parent)
      version = self._stale.current_version()
      kept = []
      for traj in unit:
        reason = self._reason(traj, version)
        if reason is None:
          kept.append(traj)
        else:
          kind = self._failure_kind(traj) if reason == "env_failure" else None
          if kind is not None:
            self._drops.add(kind, 1, traj.env_failure)
          self._drops.add(reason, 1, (
              traj.env_failure if reason == "env_failure" else
              f"lag {version - traj.policy_versions[0]}" if reason == "stale" else
              f"versions {traj.policy_versions}, learner at {version}"
              if reason == "future_version" else
              f"task {traj.info.get('task', '?')}, {traj.length} tokens"))
          self._counts[reason] = self._counts.get(reason, 0) + 1
        if self._intake is not None:  # last: it raises when the failure bound is reached
          self._intake.judged(None if reason is None else kind or reason)
      if kept:
        return kept

  def _failure_kind(self, traj: Trajectory) -> str | None:
    """`failures.failure_key`, the first MAX_FAILURE_KINDS kinds each on their own,
    later ones `env_failure/other`; None when the trajectory names no kind."""
    kind = failures.failure_key(traj)
    if kind == failures.ENV_FAILURE:
      return None
    if kind not in self._drops and sum(
        key.startswith("env_failure/") for key in self._drops) >= MAX_FAILURE_KINDS:
      kind = "env_failure/other"
    return kind


def admit_units(units: list[list[Trajectory]], **kwargs) -> list[list[Trajectory]]:
  """The members of `units` that admission keeps (`AdmitDataset`, whose keyword arguments
  `kwargs` are), units left empty omitted, judged in order now."""
  return list(_AdmitIterator(_Units(units), **kwargs))


class _Units(_Iterator):
  """A list of units as a pipeline stage's parent."""

  def __init__(self, units: list[list[Trajectory]]):
    super().__init__()
    self._units = iter(units)

  def __next__(self) -> list[Trajectory]:
    return next(self._units)


class BatchDataset(grain.IterDataset):
  """(Batch, BatchInfo) of `batch_size` rows padded to a length bucket."""

  def __init__(self, parent: grain.IterDataset, *, batch_size: int, buckets: tuple[int, ...],
               pad_id: int, stale: StaleFilter):
    super().__init__(parent)
    self._kwargs = dict(batch_size=batch_size, buckets=buckets, pad_id=pad_id, stale=stale)

  def __iter__(self):
    return _BatchIterator(self._parent.__iter__(), **self._kwargs)


def pack_rows(rows: list[list[Trajectory]], num_rows: int, length: int, pad_id: int) -> Batch:
  """`[num_rows, length]` batch: row r holds `rows[r]` back to back as segments 1, 2,
  ..., then right padding; missing rows are empty (all masks 0, ids -1). MoE routing
  records (`Trajectory.routed_experts`) are packed alike into `[num_rows, length, L, k]`,
  -1 on padding and for a trajectory without one; None when no trajectory has one."""
  shape = (num_rows, length)
  tokens = np.full(shape, pad_id, np.int32)
  segment = np.zeros(shape, np.int32)
  action = np.zeros(shape, np.int32)
  logp = np.zeros(shape, np.float32)
  rewards = np.zeros(shape, np.float32)
  # -1 on padding: it belongs to no segment, so no consumer ever groups it.
  prompt_ids = np.full(shape, -1, np.int32)
  behavior_version = np.full(shape, -1, np.int32)
  routed = next((t.routed_experts for trajs in rows for t in trajs
                 if t.routed_experts is not None), None)
  if routed is not None:
    routed = np.full(shape + routed.shape[1:], -1, routed.dtype)
  for r, trajs in enumerate(rows):
    start = 0
    for k, traj in enumerate(trajs, start=1):
      span = slice(start, start + traj.length)
      tokens[r, span] = traj.tokens
      segment[r, span] = k
      action[r, span] = traj.action_mask
      logp[r, span] = traj.behavior_logp
      rewards[r, span] = traj.rewards
      prompt_ids[r, span] = traj.prompt_id
      first, last = traj.policy_versions
      behavior_version[r, span] = first if first == last else -1
      if routed is not None and traj.routed_experts is not None:
        if traj.routed_experts.shape[1:] != routed.shape[2:]:
          raise ValueError(f"trajectory of prompt {traj.prompt_id} records routing of shape "
                           f"{traj.routed_experts.shape[1:]} (MoE layers, top-k), another of "
                           f"its batch {routed.shape[2:]}: every sampler of a run must serve "
                           "the learner's model")
        routed[r, span] = traj.routed_experts
      start = span.stop
  return Batch(tokens, segment, action, logp, rewards, prompt_ids, behavior_version, routed)


def pad_batch(trajs: list[Trajectory], batch_size: int, length: int, pad_id: int) -> Batch:
  """Right-pads `trajs` to `[batch_size, length]`, one per row; missing rows are empty."""
  return pack_rows([[traj] for traj in trajs], batch_size, length, pad_id)


def batch_info(trajs: list[Trajectory], version: int, padding_rows: int,
               capacity: int) -> BatchInfo:
  """The `BatchInfo` of a batch of `trajs` trained at policy `version`."""
  return BatchInfo(
      lags=np.array([version - t.policy_versions[0] for t in trajs]),
      version_spans=np.array([t.policy_versions[1] - t.policy_versions[0] for t in trajs]),
      lengths=np.array([t.length for t in trajs]),
      padding_rows=padding_rows, capacity=capacity,
      ends=tuple((str(t.info.get("end", "")), str(t.info.get("last_turn_end", ""))) for t in trajs),
      tool_calls=tuple(_count(t.info.get("tool_calls")) for t in trajs),
      sources=tuple(_label(t.info.get("source")) for t in trajs),
      outcomes=tuple(t.outcome for t in trajs),
      episode_metrics=tuple(_numbers(t.info.get("metrics")) for t in trajs),
      # Capped: a sum of them becomes a float metric (a 400-digit count would overflow).
      weight_waits=tuple(min(_count(t.info.get("weight_waits")), _MAX_COUNT) for t in trajs),
      weight_errors=tuple(min(_count(t.info.get("weight_errors")), _MAX_COUNT) for t in trajs),
      sampler_phases=tuple(read_sampler_phases(t.info.get("phases")) for t in trajs),
      # One per group (its members carry the same delay).
      group_release_s=tuple(delay for _, delay in dict.fromkeys(
          (t.prompt_id, float(t.info[GROUP_RELEASE_KEY])) for t in trajs
          if GROUP_RELEASE_KEY in t.info)))


MAX_LABEL_CHARS = 64  # of a source or a metric name read from a trajectory
MAX_EPISODE_METRICS = 16  # metrics read from one trajectory


def _label(value) -> str:
  """`value` if it is a printable string of at most MAX_LABEL_CHARS, else ""."""
  ok = isinstance(value, str) and 0 < len(value) <= MAX_LABEL_CHARS and value.isprintable()
  return value if ok else ""


def _numbers(value) -> dict[str, float]:
  """The first MAX_EPISODE_METRICS (label, finite number) pairs of a mapping, else {}."""
  if not isinstance(value, dict):
    return {}
  out = {}
  for key, number in value.items():
    if len(out) == MAX_EPISODE_METRICS:
      break
    if (_label(key) and isinstance(number, (int, float)) and not isinstance(number, bool)
        and np.isfinite(number)):
      out[key] = float(number)
  return out


_MAX_COUNT = 1 << 30  # the most one trajectory's weight-channel counts add to a metric


def _count(value) -> int:
  """`value` if it is a non-negative int (bool excluded), else 0."""
  return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class _BatchIterator(_CarryingIterator):

  def __init__(self, parent, *, batch_size, buckets, pad_id, stale):
    super().__init__(parent, stale)
    self._batch_size, self._buckets, self._pad_id = batch_size, buckets, pad_id

  def __next__(self) -> tuple[Batch, BatchInfo]:
    rows = self._take_carry()
    while len(rows) < self._batch_size:
      try:
        unit = next(self._parent)
      except StopIteration:
        if not rows:
          raise
        break
      except Interrupted:
        self._carry = rows  # in the state: they open the next batch after a resume
        raise
      if len(rows) + len(unit) > self._batch_size:
        self._carry = unit
        break
      rows = rows + unit
    longest = max(traj.length for traj in rows)
    length = next(b for b in self._buckets if b >= longest)
    info = batch_info(rows, self._stale.current_version(), self._batch_size - len(rows),
                 self._batch_size * length)
    self._counts["batches"] = self._counts.get("batches", 0) + 1
    return pad_batch(rows, self._batch_size, length, self._pad_id), info


class PackDataset(grain.IterDataset):
  """(Batch, BatchInfo) of `rows` rows of `row_length` tokens, trajectories packed first-fit."""

  def __init__(self, parent: grain.IterDataset, *, rows: int, row_length: int,
               max_trajectories: int, pad_id: int, stale: StaleFilter):
    super().__init__(parent)
    self._kwargs = dict(rows=rows, row_length=row_length, max_trajectories=max_trajectories,
                        pad_id=pad_id, stale=stale)

  def __iter__(self):
    return _PackIterator(self._parent.__iter__(), **self._kwargs)


def first_fit(unit: list[Trajectory], free: list[int]) -> list[int] | None:
  """Row of each member of `unit` (first row with room, members in order) given the
  free tokens per row, or None if some member fits nowhere. `free` is not changed."""
  free = list(free)
  placed = []
  for traj in unit:
    row = next((r for r, room in enumerate(free) if room >= traj.length), None)
    if row is None:
      return None
    free[row] -= traj.length
    placed.append(row)
  return placed


class _PackIterator(_CarryingIterator):

  def __init__(self, parent, *, rows, row_length, max_trajectories, pad_id, stale):
    super().__init__(parent, stale)
    self._rows, self._row_length, self._max = rows, row_length, max_trajectories
    self._pad_id = pad_id

  def __next__(self) -> tuple[Batch, BatchInfo]:
    rows: list[list[Trajectory]] = [[] for _ in range(self._rows)]
    free = [self._row_length] * self._rows
    count = 0
    taken: list[Trajectory] = []  # placed so far, in order: first_fit places them again alike
    # Full: the cap is reached or no row has room for even a 1-token trajectory.
    while count < self._max and max(free) > 0:
      unit = self._take_carry()
      if not unit:
        try:
          unit = next(self._parent)
        except StopIteration:
          if not count:
            raise
          break
        except Interrupted:
          self._carry = taken  # in the state: they open the next batch after a resume
          raise
      placed = first_fit(unit, free) if count + len(unit) <= self._max else None
      if placed is None:
        self._carry = unit
        break
      for traj, row in zip(unit, placed):
        rows[row].append(traj)
        free[row] -= traj.length
      count += len(unit)
      taken += unit
    trajs = [traj for row in rows for traj in row]
    info = batch_info(trajs, self._stale.current_version(), sum(1 for row in rows if not row),
                 self._rows * self._row_length)
    self._counts["batches"] = self._counts.get("batches", 0) + 1
    return pack_rows(rows, self._rows, self._row_length, self._pad_id), info


def learner_pipeline(transport, *, batch_size: int, group_size: int, max_lag: int,
                     buckets: tuple[int, ...], pad_id: int, vocab_size: int,
                     current_version: Callable[[], int], drops: Drops,
                     num_prompt_slots: int | None = None,
                     should_stop: Callable[[], bool] = lambda: False,
                     on_poll: Callable[[], None] = lambda: None,
                     interrupted: Callable[[], bool] = lambda: False,
                     intake: failures.Intake | None = None,
                     batch_tokens: int | None = None, row_length: int | None = None,
                     positions: TaskPositions | None = None,
                     clock: Callable[[], float] = time.monotonic) -> Iterator:
  """The whole pipeline as one grain iterator of (Batch, BatchInfo).

  `should_stop`, `on_poll` and `interrupted`: `TransportDataset`'s; `intake` hears of every
  trajectory admission judges (`failures.Intake`, whose bound can end the run);
  `positions` records the tasks that reached the learner (`PositionsDataset`; a
  fresh record when None); `clock` times groups' release delays (`GroupDataset`).

  `batch_tokens` (with `row_length`) packs: `batch_tokens // row_length` rows of
  `row_length` tokens holding at most `batch_size` trajectories; trajectories
  longer than a row are dropped as too long. None: `batch_size` padded rows.
  """
  if group_size > batch_size:
    raise ValueError(f"group_size={group_size} does not fit batch_size={batch_size}")
  packed = batch_tokens is not None
  if packed:
    rows = packed_rows(batch_tokens, row_length)
    if group_size > rows:
      raise ValueError(
          f"learner.batch_tokens={batch_tokens} gives {rows} rows of row_length={row_length}, "
          f"fewer than algorithm.group_size={group_size}, so a group of long trajectories "
          f"might never fit one batch; raise batch_tokens to at least {group_size * row_length}")
  dataset = TransportDataset(transport, should_stop=should_stop, on_poll=on_poll,
                             interrupted=interrupted)
  stale = StaleFilter(current_version, max_lag, drops)
  dataset = GroupDataset(dataset, group_size, stale, clock=clock)
  dataset = PositionsDataset(dataset, TaskPositions() if positions is None else positions)
  dataset = AdmitDataset(dataset, stale=stale, max_length=row_length if packed else buckets[-1],
                         vocab_size=vocab_size, drops=drops, num_prompt_slots=num_prompt_slots,
                         intake=intake)
  if packed:
    dataset = PackDataset(dataset, rows=rows, row_length=row_length, max_trajectories=batch_size,
                          pad_id=pad_id, stale=stale)
  else:
    dataset = BatchDataset(dataset, batch_size=batch_size, buckets=buckets, pad_id=pad_id,
                           stale=stale)
  return iter(dataset)
