"""Where each sampler worker's task stream stands, so that a restarted sampler (or a
resumed run's) continues its stream instead of serving its tasks again.

    positions = TaskPositions()
    positions.record(unit)               # learner: a task's episodes reached it
    start = positions.start(worker_id)   # supervisor: where a (re)started worker begins
    for position, task in served(lambda k: make_tasks(env, start=k), start): ...  # worker
                                         # (`sao_jax.sampler.task_stream`)

A worker numbers the tasks of its stream 0, 1, 2, ... (`registry.make_tasks(start=k)`
is the stream from task k on, so a restarted worker's numbers go on where the last
one's stopped) and tags each episode's trajectory with `info["task_position"]`
beside `info["worker"]`. The learner records a task once its episodes reach it,
trained or dropped alike: in single mode its trajectory, in group mode (GRPO) its
whole group (`data.pipeline.GroupDataset` gives a group out once complete; a task
whose group a dying sampler left incomplete is not recorded, and is served again).
Per worker it keeps a `TaskStart`: `position`, below which every task reached it,
and `done`, the positions past it that did too (episodes finish out of order). A
worker started from it serves its stream from `position`, passing over `done`. So
no task whose episodes reached the learner is served again; the tasks in flight
when a sampler died (started and not yet received: at most `sampler.slots * 2`
episodes' worth) are served again.

The record is the state of a pipeline stage (`data.pipeline.PositionsDataset`),
checkpointed with the learner, so it survives `--resume`; a checkpoint written
before it was kept has none, and every stream then starts at task 0. What a
trajectory says of itself is bounded: a worker id outside `[0, MAX_WORKERS)` or a
position that is not an integer in `[0, MAX_POSITION]` is not recorded, and a
worker keeps at most `MAX_DONE` positions past its `position` (past that, the
oldest gap is given up: its tasks are not served again).
"""

from __future__ import annotations

import dataclasses

from sao_jax.types import MAX_WORKERS, Trajectory

MAX_DONE = 4096  # positions past a worker's `position` kept; a few hundred in flight at most
MAX_POSITION = 2**53  # of a task in a stream: exact as a JSON number


@dataclasses.dataclass(frozen=True)
class TaskStart:
  """Where a worker's stream starts: task `position`, passing over `done` (module
  docstring)."""

  position: int = 0
  done: tuple[int, ...] = ()


class TaskPositions:
  """The `TaskStart` of each sampler worker, from the tasks whose episodes reached the
  learner (module docstring); JSON state for the checkpoint."""

  def __init__(self):
    self._next: dict[int, int] = {}
    self._done: dict[int, set[int]] = {}

  def record(self, unit: list[Trajectory]) -> None:
    """Records the task of `unit` (one task's episodes: a trajectory, or a group)."""
    info = unit[0].info
    worker, position = info.get("worker"), info.get("task_position")
    if not (_integer(worker, MAX_WORKERS - 1) and _integer(position, MAX_POSITION)):
      return
    start = self._next.get(worker, 0)
    done = self._done.setdefault(worker, set())
    if position < start:
      return  # served again after a restart, and recorded the first time
    done.add(position)
    if len(done) > MAX_DONE:
      start = min(done)  # the oldest gap is given up
    while start in done:
      done.remove(start)
      start += 1
    self._next[worker] = start

  def start(self, worker: int) -> TaskStart:
    """Where worker `worker`'s stream goes on."""
    return TaskStart(self._next.get(worker, 0), tuple(sorted(self._done.get(worker, ()))))

  def get_state(self) -> dict:
    return {str(worker): [self._next.get(worker, 0), sorted(self._done.get(worker, ()))]
            for worker in sorted(set(self._next) | set(self._done))}

  def set_state(self, state: dict) -> None:
    self._next, self._done = {}, {}
    for worker, (start, done) in state.items():
      self._next[int(worker)] = int(start)
      self._done[int(worker)] = {int(position) for position in done}


def _integer(value, largest: int) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= largest
