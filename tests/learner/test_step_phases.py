"""Every learner step's row says where its wall time went (`sao_jax.run.phases`), and the
phases add up to it within the tolerance the metrics reference states."""

import dataclasses
import time

from learner_fixtures import make_batch, make_config
from sao_jax import config as C
from sao_jax.learner.loop import run_learner
from sao_jax.run import phases as phases_lib
from sao_jax.run.phases import LEARNER_PHASES, STEP_KEY, StepPhases, learner_key

WAIT_S, PUBLISH_S = 0.05, 0.03


class SlowBatches:
  """Batches that take WAIT_S to arrive (trajectories not there yet)."""

  def __init__(self):
    self.position = 0

  def __next__(self):
    time.sleep(WAIT_S)
    self.position += 1
    return make_batch(100 + self.position)


def test_the_phases_of_each_step_sum_to_its_wall_time(tmp_path):
  cfg = dataclasses.replace(make_config(steps=4), checkpoint=C.CheckpointConfig(
      directory=str(tmp_path / "checkpoints"), save_every_steps=2, keep=2))
  phases = StepPhases()
  rows = {}

  def after_step(steps_done, state):  # what jobs.train times there: the publish
    with phases.timed("publish"):
      time.sleep(PUBLISH_S)

  run_learner(cfg, SlowBatches(), phases=phases, after_step=after_step,
              on_metrics=lambda step, metrics: rows.setdefault(step, metrics))
  assert sorted(rows) == [0, 1, 2, 3]
  for step, row in rows.items():
    total, wall = phases_lib.accounted(row)
    slack = phases_lib.TOLERANCE_S + phases_lib.TOLERANCE_FRAC * wall
    # Disjoint spans of one interval: never more than it, and short of it only by the
    # loop's untimed bookkeeping.
    assert wall - slack <= total <= wall + 1e-9, (step, total, wall, row)
    # The wait is the one learner/wait_s reports; each phase is where it happened.
    assert abs(row[learner_key("wait")] - row["learner/wait_s"]) < 0.005
    assert row[learner_key("wait")] >= WAIT_S
    assert row[learner_key("publish")] >= PUBLISH_S
    assert row[learner_key("compute")] > 0
    assert row[learner_key("eval")] == row[learner_key("profile")] == 0.0
    # Logging the previous row happens inside this step's interval (none before step 0).
    assert (row[learner_key("log")] > 0) == (step > 0)
  # The checkpoint of 2 steps done (due: checkpoint.save_every_steps=2) is saved in step
  # 2's interval; after 3 steps none is due, and the check is all step 3 spends on it.
  assert (tmp_path / "checkpoints" / "2").is_dir() and not (tmp_path / "checkpoints" / "3").exists()
  assert rows[2][learner_key("checkpoint")] > 10 * rows[3][learner_key("checkpoint")]
  # Step 0 compiles the train step: its compute dwarfs the later steps'.
  assert rows[0][learner_key("compute")] > 3 * rows[3][learner_key("compute")]


def test_phases_are_kept_per_step_and_named_from_one_list():
  now = [0.0]
  phases = StepPhases(clock=lambda: now[0])
  with phases.timed("wait"):
    now[0] += 2.0
  now[0] += 0.5  # bookkeeping: in the step, in no phase
  with phases.timed("compute"):
    now[0] += 1.0
  phases.cut(7)
  assert phases.record(7) == {**{learner_key(p): 0.0 for p in LEARNER_PHASES},
                              learner_key("wait"): 2.0, learner_key("compute"): 1.0,
                              STEP_KEY: 3.5}
  assert phases.record(7) == {}  # given once
  try:
    with phases.timed("publishing"):
      pass
  except ValueError as error:
    assert "phase='publishing'" in str(error) and "'publish'" in str(error)
  else:
    raise AssertionError("an unknown phase was accepted")
