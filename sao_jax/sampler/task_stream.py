"""A sampler worker's task stream from where the learner's record says it stands
(`sao_jax.data.task_positions`: a restarted worker goes on after the tasks whose
episodes reached the learner)."""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

from sao_jax.data.task_positions import TaskStart
from sao_jax.envs.base import Task
from sao_jax.envs.dataset_tasks import BadRow


def served(make_tasks: Callable[[int], Iterator[Task]], start: TaskStart
           ) -> Iterator[tuple[int, Task | BadRow]]:
  """(position, task) of a worker's stream from `start`: `make_tasks(k)` is the stream
  from task k on; positions in `start.done` are passed over; a row that does not make a
  task (`BadRow`, the stream stays usable) comes as the error, for the worker to count
  as a dropped episode."""
  stream = make_tasks(start.position)
  done = set(start.done)
  for position in itertools.count(start.position):
    try:
      task: Task | BadRow = next(stream)
    except BadRow as error:
      task = error
    if position not in done:
      yield position, task
