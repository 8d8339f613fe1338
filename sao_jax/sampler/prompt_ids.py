"""The prompt id each new episode carries (`Trajectory.prompt_id`).

    ids = PromptIds(group_size, num_slots, worker_id)
    prompt_id = ids(task)            # once per task: an episode, or a GRPO group of them

The id means one of two things, by mode:

- Single mode (`group_size == 1`): the task's running-mean slot, a stable hash of
  its id in `[0, num_slots)` (`prompt_slot`), so every episode of a task meets the
  same window (`losses.running_mean_advantages`, scope "prompt"). Two tasks may
  share a slot; that only mixes their baselines.
- Group mode (GRPO): the group's name. The learner's pipeline gathers a group by
  it (`data.pipeline.GroupDataset`), the transport routes it to one reader by it,
  and `losses.grpo_advantages` normalises over it, so two groups in flight must
  never share an id, or one group's advantages are computed over two prompts. A
  task hash cannot promise that (two of 4096 slots collide among a few hundred
  groups in flight), and neither can a counter that restarts with a resumed run
  (its first ids meet the unfinished groups the learner restored). So the id is
  `worker_id << COUNTER_BITS | k`: the high bits name the sampler worker (ids of
  two workers never meet), the low bits count its groups from a random start
  drawn when the worker starts, modulo 2**COUNTER_BITS (one worker's ids repeat
  only after 2**21 groups; a restarted worker meets a restored group only if its
  new counter reaches that group's id). Low bits that count make the transport's
  `prompt_id % readers` deal a worker's groups round-robin to the learner's hosts.
"""

from __future__ import annotations

import secrets
import zlib

from sao_jax.envs.base import Task
from sao_jax.types import COUNTER_BITS, MAX_WORKERS


def prompt_slot(task: Task, num_slots: int) -> int:
  """A task's running-mean slot in [0, num_slots): a stable hash of its id."""
  return zlib.crc32(task.id.encode()) % num_slots


class PromptIds:
  """`ids(task)`: the prompt id of the next episode or group (module docstring)."""

  def __init__(self, group_size: int, num_slots: int, worker_id: int, *,
               start: int | None = None):
    if not 0 <= worker_id < MAX_WORKERS:
      raise ValueError(f"sampler worker id {worker_id} is out of range: group ids name at "
                       f"most {MAX_WORKERS} sampler workers (ids 0..{MAX_WORKERS - 1}); run "
                       "fewer sampler processes per learner")
    self._group_size, self._num_slots = group_size, num_slots
    self._high = worker_id << COUNTER_BITS
    self._count = secrets.randbelow(2 ** COUNTER_BITS) if start is None else start

  def __call__(self, task: Task) -> int:
    if self._group_size == 1:
      return prompt_slot(task, self._num_slots)
    self._count = (self._count + 1) % 2 ** COUNTER_BITS
    return self._high | self._count
