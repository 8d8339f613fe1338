"""Reproducible rollouts (`data.fixed_lag`): batches made by a schedule, not by arrival.

    schedule = Schedule.of(cfg, first_batch=0)
    schedule.sampling_version(t)     # the policy version that samples batch t
    batches = ScheduledBatches(transport, schedule, ...)   # the learner's (Batch, BatchInfo)

By default (`data.fixed_lag=None`) samplers adopt the newest weights between engine
steps and the learner batches trajectories in arrival order, so which policy version
sampled which token, and which trajectories share a batch, depend on timing (the
machine's load). With a fixed lag L every decision is a function of the seed and a
position instead:

- Batch t is made of the tasks at stream positions [t * n, (t + 1) * n) (n =
  `tasks_per_batch`: learner.batch_trajectories / algorithm.group_size), each task's
  `group_size` episodes, in (position, member) order. Sampler worker w of W samples
  the tasks of in-batch index i with i % W == w (`positions`); an episode's seed is
  `sampler.seed * 1_000_003 + position * group_size + member` (`episode_seed`).
- Batch t is sampled entirely by `sampling_version(t)` = the policy version the learner
  holds after max(first_batch, t - L) steps (`policy_version_after`: value-only steps
  leave it at 0). L = 0: on-policy and synchronous; L = 1: the sampler generates batch
  t + 1 while the learner trains on batch t. `first_batch` is where the samplers
  started (0, or the step a run resumed at: the versions before it are gone, so a
  resumed run samples its first L batches with the version it resumed with).
- A sampler hands batch t over only once it has received `policy_version_after(t)`:
  the learner cannot publish a later version before it trained on batch t, so every
  version a sampler needs reaches it while it is the newest the channel holds (a
  channel keeps only the newest), and it keeps the at most L + 1 it may still need.
- The learner (`ScheduledBatches`) waits for exactly batch t, then admits its members
  (`pipeline.admit_units`: environment failures, malformed records, staleness against
  the version it holds, which is `policy_version_after(t)`) and pads them in order.
  A trajectory that belongs to no batch the schedule can still deliver (a batch already
  trained, one further ahead than samplers can be, a duplicate, one without its
  position) is dropped as `unscheduled`.

The learner checks after every step that its policy version is the schedule's
(`check_version`: a step whose update was not finite leaves it behind, and the
samplers would wait for a version that never comes). Nothing here waits without
saying so: the learner's waiting reports name the batch and how many of its
trajectories arrived (`status`), a sampler waiting for a version logs it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Callable

from sao_jax.config.learner import value_only_steps
from sao_jax.data import failures, pipeline
from sao_jax.data.task_positions import TaskStart
from sao_jax.types import Trajectory

MEMBER_KEY = "member"  # info key: an episode's index in its task's group (0 in single mode)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which tasks make batch t, who samples them and with which policy version (module
  docstring)."""

  lag: int
  tasks_per_batch: int
  group_size: int
  value_only_steps: int  # learner steps before the first policy update
  workers: int  # sampler processes sharing each batch
  first_batch: int = 0

  @classmethod
  def of(cls, cfg, first_batch: int = 0) -> "Schedule":
    """The schedule of `cfg` (a `Config` with `data.fixed_lag` set)."""
    group = cfg.algorithm.group_size
    return cls(lag=cfg.data.fixed_lag, tasks_per_batch=cfg.learner.batch_trajectories // group,
               group_size=group, value_only_steps=value_only_steps(cfg.learner, cfg.algorithm),
               workers=cfg.run.num_samplers, first_batch=first_batch)

  @property
  def batch_trajectories(self) -> int:
    return self.tasks_per_batch * self.group_size

  def policy_version_after(self, steps: int) -> int:
    """The learner's policy version after `steps` steps: one update per step after the
    value-only steps."""
    return max(0, steps - self.value_only_steps)

  def sampling_version(self, batch: int) -> int:
    """The policy version that samples every episode of `batch`."""
    return self.policy_version_after(max(self.first_batch, batch - self.lag))

  def batch_of(self, position: int) -> int:
    return position // self.tasks_per_batch

  def positions(self, batch: int, worker: int) -> range:
    """The task positions of `batch` that sampler `worker` samples, in order."""
    start = batch * self.tasks_per_batch
    return range(start + worker, start + self.tasks_per_batch, self.workers)

  def task_start(self, batch: int) -> TaskStart:
    """Where a sampler's task stream starts for batch `batch` onwards."""
    return TaskStart(batch * self.tasks_per_batch)

  def first_batch_of(self, start: TaskStart) -> int:
    """The batch a sampler started at `start` (`task_start`) begins with."""
    return start.position // self.tasks_per_batch

  def ahead(self) -> int:
    """How many batches past the one the learner waits for samplers can deliver: those
    sampled by versions it already holds (value-only steps do not change it), plus L."""
    return self.value_only_steps + self.lag + 1


# Why a fixed-lag run ends when a sampler dies (`SamplerSupervisor(no_restart=...)`).
NO_RESTART = ("under data.fixed_lag a restarted sampler could not sample its share of the "
              "batches in flight again (the policy versions they need are gone); resume the "
              "run from its newest checkpoint (sao-train --resume auto)")


def episode_seed(base_seed: int, position: int, group_size: int, member: int) -> int:
  """The seed of member `member` of the task at stream position `position`."""
  return base_seed * 1_000_003 + position * group_size + member


def check_version(schedule: Schedule, steps_done: int, version: int) -> None:
  """RuntimeError unless the learner's policy version after `steps_done` steps is the
  schedule's (module docstring)."""
  expected = schedule.policy_version_after(steps_done)
  if version != expected:
    raise RuntimeError(
        f"data.fixed_lag={schedule.lag}: after {steps_done} learner steps the policy version "
        f"is {version}, not the {expected} the schedule samples by (a step whose update was "
        "not finite was skipped); the samplers would wait for that version forever. Lower "
        "the learning rate or raise learner.grad_clip, or run without data.fixed_lag")


class ScheduledBatches:
  """The learner's (Batch, BatchInfo) stream under `data.fixed_lag` (module docstring):
  batch `next_batch` once all its trajectories arrived, members in (position, member)
  order. `get_state` / `set_state` keep the next batch's index: the trajectories held
  for later batches are not kept, the samplers of a resumed run sample them again."""

  def __init__(self, transport, schedule: Schedule, *, batch_size: int, buckets: tuple[int, ...],
               pad_id: int, vocab_size: int, max_lag: int, current_version: Callable[[], int],
               drops: pipeline.Drops, intake: failures.Intake | None = None,
               num_prompt_slots: int | None = None,
               should_stop: Callable[[], bool] = lambda: False,
               on_poll: Callable[[], None] = lambda: None, poll_s: float = 0.2,
               interrupted: Callable[[], bool] = lambda: False):
    self._transport, self.schedule = transport, schedule
    self._batch_size, self._buckets, self._pad_id = batch_size, buckets, pad_id
    self._stale = pipeline.StaleFilter(current_version, max_lag, drops)
    self._admit = dict(stale=self._stale, max_length=buckets[-1], vocab_size=vocab_size,
                       drops=drops, num_prompt_slots=num_prompt_slots, intake=intake)
    self._drops, self._should_stop, self._on_poll = drops, should_stop, on_poll
    self._interrupted = interrupted
    self._poll_s = poll_s
    self.next_batch = schedule.first_batch
    # batch -> {(position, member): trajectory}, for the batches not yet trained.
    self._held: dict[int, dict[tuple[int, int], Trajectory]] = collections.defaultdict(dict)

  def __iter__(self):
    return self

  def status(self) -> str:
    """What the learner waits for, for its waiting reports."""
    have = len(self._held.get(self.next_batch, {}))
    return (f"data.fixed_lag={self.schedule.lag}: batch {self.next_batch} has {have} of its "
            f"{self.schedule.batch_trajectories} trajectories (sampled by policy version "
            f"{self.schedule.sampling_version(self.next_batch)})")

  def _file(self, traj: Trajectory) -> None:
    """Holds `traj` under its batch, or drops it as `unscheduled`."""
    position, member = traj.info.get("task_position"), traj.info.get(MEMBER_KEY)
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
             for v in (position, member)) and member < self.schedule.group_size
    batch = self.schedule.batch_of(position) if ok else -1
    if not ok or not self.next_batch <= batch <= self.next_batch + self.schedule.ahead() \
        or (position, member) in self._held[batch]:
      self._drops.add("unscheduled", 1, f"task position {position!r}, member {member!r}, the "
                      f"learner waiting for batch {self.next_batch}")
      return
    self._held[batch][(position, member)] = traj

  def __next__(self):
    want = self.schedule.batch_trajectories
    while len(self._held.get(self.next_batch, {})) < want:
      if self._interrupted():  # held trajectories are sampled again after a resume (above)
        raise pipeline.Interrupted("stopped while waiting for trajectories")
      self._on_poll()
      traj = self._transport.get(timeout=self._poll_s)
      if traj is not None:
        self._file(traj)
      elif self._should_stop() or self._transport.closed:
        raise StopIteration
    held = self._held.pop(self.next_batch)
    units = [[traj for _, traj in members]  # one per task: its group's members in order
             for _, members in itertools.groupby(sorted(held.items()), key=lambda kv: kv[0][0])]
    rows = [traj for unit in pipeline.admit_units(units, **self._admit) for traj in unit]
    if not rows:
      raise RuntimeError(
          f"data.fixed_lag={self.schedule.lag}: every trajectory of batch {self.next_batch} was "
          f"dropped ({failures.describe(self._drops)}); the schedule trains one step per batch. "
          "Fix what drops them, or run without data.fixed_lag")
    self.next_batch += 1
    longest = max(traj.length for traj in rows)
    length = next(b for b in self._buckets if b >= longest)
    info = pipeline.batch_info(rows, self._stale.current_version(), self._batch_size - len(rows),
                               self._batch_size * length)
    return pipeline.pad_batch(rows, self._batch_size, length, self._pad_id), info

  def get_state(self) -> dict:
    return {"next_batch": self.next_batch}

  def set_state(self, state: dict) -> None:
    if "next_batch" not in state:
      raise ValueError("data.fixed_lag is set, but the checkpoint was written by a run without "
                       "it (its data state holds no batch schedule); resume it without "
                       "data.fixed_lag, or start a new run (run.run_dir=ANOTHER_DIR)")
    self.next_batch = int(state["next_batch"])
    self.schedule = dataclasses.replace(self.schedule, first_batch=self.next_batch)
    self._held.clear()

