"""Task stream positions: a restarted or resumed sampler goes on with its stream after
the tasks whose episodes reached the learner, never from the start (`data.task_positions`)."""

import itertools
import json
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sao_jax import config as C
from sao_jax.channel.transport import QueueTransport
from sao_jax.config import EnvConfig
from sao_jax.config.dataset import DatasetConfig
from sao_jax.data import pipeline
from sao_jax.data.task_positions import MAX_DONE, TaskPositions, TaskStart
from sao_jax.sampler.task_stream import served
from sao_jax.envs import registry
from sao_jax.sampler.worker import SamplerSupervisor, WorkerSpec, hand_over
from sao_jax.types import Trajectory


def traj(worker, position, prompt_id=0, version=0):
  return Trajectory(tokens=np.arange(4, dtype=np.int32), action_mask=np.ones(4, np.int8),
                    behavior_logp=np.zeros(4, np.float32), rewards=np.zeros(4, np.float32),
                    prompt_id=prompt_id, policy_versions=(version, version),
                    info={"worker": worker, "task_position": position})


def _jsonl(tmp_path, n=5):
  path = tmp_path / "tasks.jsonl"
  path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                          for i in range(n)))
  return EnvConfig(name="single_turn", task_source="jsonl", jsonl_path=str(path), seed=4)


def _parquet(tmp_path, n=7):
  path = tmp_path / "t.parquet"
  pq.write_table(pa.table({"question": [f"q{i}" for i in range(n)],
                           "answer": [str(i) for i in range(n)]}), path, row_group_size=3)
  return EnvConfig(name="single_turn", task_source="parquet", seed=4,
                   dataset=DatasetConfig(path=str(path), prompt_column="question"))


@pytest.mark.parametrize("source", ["jsonl", "parquet", "generated"])
def test_a_stream_resumed_from_a_position_serves_the_next_tasks(tmp_path, source):
  config = {"jsonl": _jsonl, "parquet": _parquet,
            "generated": lambda _: EnvConfig(name="math_tool", seed=4)}[source](tmp_path)
  whole = [t.id for t in itertools.islice(registry.make_tasks(config), 20)]
  resumed = [t.id for t in itertools.islice(registry.make_tasks(config, start=12), 8)]
  assert resumed == whole[12:]
  assert resumed != whole[:8]


def test_served_passes_over_the_positions_done_past_its_start(tmp_path):
  config = _jsonl(tmp_path)
  whole = [t.id for t in itertools.islice(registry.make_tasks(config), 12)]
  got = list(itertools.islice(served(lambda k: registry.make_tasks(config, start=k),
                                     TaskStart(position=4, done=(5, 7))), 5))
  assert [p for p, _ in got] == [4, 6, 8, 9, 10]
  assert [t.id for _, t in got] == [whole[p] for p in (4, 6, 8, 9, 10)]


def test_positions_record_out_of_order_arrivals_per_worker():
  positions = TaskPositions()
  for worker, position in [(0, 1), (0, 0), (0, 3), (1, 0), (0, 3)]:
    positions.record([traj(worker, position)])
  assert positions.start(0) == TaskStart(2, (3,))  # 2 is in flight: served again
  assert positions.start(1) == TaskStart(1, ())
  assert positions.start(5) == TaskStart(0, ())
  positions.record([traj(0, 2)])
  assert positions.start(0) == TaskStart(4, ())
  positions.record([traj(0, 1)])  # a re-served task arriving again changes nothing
  assert positions.start(0) == TaskStart(4, ())


def test_positions_bound_what_a_trajectory_says():
  positions = TaskPositions()
  for worker, position in [(-1, 0), (10**6, 0), (True, 0), (0, -2), (0, "3"), (0, 2**60),
                           ("0", 0), (0, 1.0)]:
    positions.record([traj(worker, position)])
  assert positions.get_state() == {}
  for position in range(1, MAX_DONE + 2):  # position 0 never arrives
    positions.record([traj(0, position)])
  start = positions.start(0)
  assert start.position > 0 and len(start.done) <= MAX_DONE


def test_group_mode_records_a_task_once_its_whole_group_arrived():
  """A group a dying sampler left incomplete is not recorded: its task is served again."""
  positions = TaskPositions()
  arrivals = [traj(0, 0, prompt_id=10), traj(0, 1, prompt_id=11), traj(0, 0, prompt_id=10)]

  class Transport:
    closed = True

    def get(self, timeout):
      return arrivals.pop(0) if arrivals else None

  batches = pipeline.learner_pipeline(
      Transport(), batch_size=2, group_size=2, max_lag=4, buckets=(8,), pad_id=0,
      vocab_size=16, current_version=lambda: 0, drops=pipeline.Drops(), positions=positions)
  batch, _ = next(batches)
  np.testing.assert_array_equal(batch.prompt_ids[:, 0], [10, 10])
  assert positions.start(0) == TaskStart(1, ())  # task 1 has 1 of 2 members: not done
  state = json.loads(json.dumps(batches.get_state()))  # what a checkpoint stores
  resumed = TaskPositions()
  again = pipeline.learner_pipeline(
      Transport(), batch_size=2, group_size=2, max_lag=4, buckets=(8,), pad_id=0,
      vocab_size=16, current_version=lambda: 0, drops=pipeline.Drops(), positions=resumed)
  again.set_state(state)
  assert resumed.start(0) == TaskStart(1, ())
  legacy = {k: v for k, v in state["parent"]["parent"].items() if k != "task_positions"}
  again.set_state({**state, "parent": {**state["parent"], "parent": legacy}})
  assert resumed.start(0) == TaskStart(0, ())  # an old checkpoint: the start of the stream


def serve_and_die(spec, alive):
  """A scripted sampler: hands over one trajectory per task of its stream (from
  `spec.task_start`), tagged as the real one tags them; its first incarnation dies
  after 4 tasks, as a sampler that crashed."""
  config = EnvConfig(name="single_turn", task_source="jsonl", jsonl_path=os.environ[
      "SAO_TEST_TASKS"], seed=4)
  first = not os.path.exists(os.environ["SAO_TEST_DIED"])
  for position, task in served(lambda k: registry.make_tasks(config, start=k), spec.task_start):
    if first and position == 4:
      open(os.environ["SAO_TEST_DIED"], "w").close()
      os._exit(3)
    out = traj(spec.worker_id, position)
    out.info["task"] = task.id
    if not hand_over(spec.transport, out, alive, poll_s=0.1):
      return
    time.sleep(0.02)


def _timeout(*_):
  raise TimeoutError("the restarted sampler sent nothing")


def test_a_restarted_sampler_continues_its_task_stream(tmp_path, monkeypatch):
  config = _jsonl(tmp_path, n=50)
  monkeypatch.setenv("SAO_TEST_TASKS", config.jsonl_path)
  monkeypatch.setenv("SAO_TEST_DIED", str(tmp_path / "died"))
  transport = QueueTransport(capacity=64)
  positions = TaskPositions()
  supervisor = SamplerSupervisor(
      [WorkerSpec(cfg=C.Config(), tokenizer_path="", weights=None, transport=transport)],
      run=serve_and_die, log=lambda line: None, task_start=positions.start)
  previous = signal.signal(signal.SIGALRM, _timeout)
  signal.alarm(90)
  received = []
  try:
    supervisor.start()
    while len(received) < 10:
      got = transport.get(timeout=0.2)
      if got is not None:
        positions.record([got])  # as the learner's pipeline does
        received.append((got.info["task_position"], got.info["task"]))
      else:  # as the learner does while it waits (what the dead one sent is in by then)
        supervisor.check()
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
    transport.close()
    supervisor.stop()
  assert supervisor.restarts == 1
  whole = [t.id for t in itertools.islice(registry.make_tasks(config), 10)]
  # Positions 0..3 before the crash, then 4, 5, ... from the restarted worker: no task
  # served twice, none from the start again.
  assert received == [(p, whole[p]) for p in range(10)]
