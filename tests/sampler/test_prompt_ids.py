"""Prompt ids: running-mean slots in single mode, group names that never meet in group mode."""

import itertools
import zlib

import pytest

from sao_jax.envs.base import Task
from sao_jax.sampler import prompt_ids
from sao_jax.sampler.prompt_ids import COUNTER_BITS, MAX_WORKERS, PromptIds, prompt_slot

SLOTS = 4096


def colliding_tasks() -> tuple[Task, Task]:
  """Two tasks whose ids hash to the same one of SLOTS slots."""
  seen = {}
  for i in itertools.count():
    task = Task(id=f"task-{i}", prompt="p", answer="a")
    slot = zlib.crc32(task.id.encode()) % SLOTS
    if slot in seen:
      return seen[slot], task
    seen[slot] = task


def test_single_mode_gives_every_episode_of_a_task_its_stable_slot():
  first, second = colliding_tasks()
  ids = PromptIds(1, SLOTS, worker_id=3)
  assert ids(first) == ids(first) == prompt_slot(first, SLOTS) == ids(second)


def test_groups_of_two_tasks_that_hash_alike_get_different_ids():
  """The task hash put two GRPO groups in flight under one id, so the learner
  gathered and normalised one group over two prompts."""
  first, second = colliding_tasks()
  ids = PromptIds(8, SLOTS, worker_id=0)
  assert ids(first) != ids(second)


def test_group_ids_of_workers_and_of_a_restarted_worker_never_meet_in_flight():
  workers = [PromptIds(8, SLOTS, worker_id=w, start=0) for w in (0, 1, MAX_WORKERS - 1)]
  task = Task(id="same task", prompt="p", answer="a")
  issued = [[ids(task) for _ in range(1000)] for ids in workers]
  flat = [i for batch in issued for i in batch]
  assert len(set(flat)) == len(flat) and all(0 <= i < 2 ** 31 for i in flat)
  # Counting from the top of the range wraps within the worker's own ids.
  wrapping = PromptIds(8, SLOTS, worker_id=1, start=2 ** COUNTER_BITS - 2)
  assert [wrapping(task) >> COUNTER_BITS for _ in range(4)] == [1] * 4
  # A relaunched worker starts at a random point of its 2**21 ids.
  starts = {PromptIds(8, SLOTS, worker_id=0)(task) for _ in range(8)}
  assert len(starts) == 8


def test_a_worker_s_groups_are_dealt_round_robin_to_the_readers():
  ids = PromptIds(8, SLOTS, worker_id=5, start=0)
  task = Task(id="t", prompt="p", answer="a")
  assert [ids(task) % 4 for _ in range(8)] == [1, 2, 3, 0, 1, 2, 3, 0]


def test_a_worker_id_past_the_id_space_is_refused():
  with pytest.raises(ValueError, match=f"at most {MAX_WORKERS} sampler workers"):
    PromptIds(8, SLOTS, worker_id=MAX_WORKERS)
  assert prompt_ids.MAX_WORKERS == 1024
