"""The learner's wall clock: elapsed time, trajectories consumed, idle fractions."""

import pytest

from sao_jax.run.timing import RunClock, carried_over


class FakeClock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_idle_fraction_per_step_and_over_the_run():
  """Step 1: asked at 0, batch at 3 after waiting 3 s -> idle 3/3 = 1. Step 2: the
  learner worked 1 s, then waited 1 s (batch at 5) -> 1/2. Over the run: (3 + 1) / 5."""
  clock = FakeClock()
  run = RunClock(clock=clock)
  clock.now += 3.0
  first = run.step(wait_s=3.0, trajectories=8)
  assert first["learner/idle_frac"] == pytest.approx(1.0)
  assert first["learner/idle_frac_total"] == pytest.approx(1.0)
  assert first["time/elapsed_s"] == pytest.approx(3.0)
  assert first["data/trajectories_total"] == 8.0
  clock.now += 2.0
  second = run.step(wait_s=1.0, trajectories=6)
  assert second["learner/idle_frac"] == pytest.approx(0.5)
  assert second["learner/idle_frac_total"] == pytest.approx(4.0 / 5.0)
  assert second["time/elapsed_s"] == pytest.approx(5.0)
  assert second["data/trajectories_total"] == 14.0
  assert second["learner/wait_s"] == 1.0


def test_a_resumed_clock_goes_on_from_the_last_logged_row():
  rows = [{"step": 0, "time/elapsed_s": 4.0, "data/trajectories_total": 8.0},
          {"step": 1, "eval/accuracy": 0.5},  # an evaluation row: no clock
          {"step": 1, "time/elapsed_s": 9.5, "data/trajectories_total": 16.0}]
  assert carried_over(rows) == {"elapsed_s": 9.5, "trajectories": 16}
  assert carried_over([]) == {"elapsed_s": 0.0, "trajectories": 0}
  clock = FakeClock()
  run = RunClock(**carried_over(rows), clock=clock)
  clock.now += 2.0
  assert run.elapsed_s == pytest.approx(11.5)
  metrics = run.step(wait_s=0.0, trajectories=8)
  assert metrics["time/elapsed_s"] == pytest.approx(11.5)
  assert metrics["data/trajectories_total"] == 24.0
  assert metrics["learner/idle_frac"] == 0.0


def test_reward_is_plotted_against_elapsed_seconds_as_well_as_steps(tmp_path):
  """curves.png gains a third panel, reward against time/elapsed_s, whose points are
  (elapsed, reward) per step, the last row of a replayed step winning; a resumed
  logger's clock starts at the last kept row."""
  from PIL import Image  # pylint: disable=import-outside-toplevel

  from sao_jax.run import metrics as metrics_lib  # pylint: disable=import-outside-toplevel

  logger = metrics_lib.MetricsLogger(tmp_path, total_steps=3, loggers=())
  for step, (elapsed, reward) in enumerate([(2.0, 0.1), (5.0, 0.3), (9.0, 0.2)]):
    logger.write(step, {"reward/mean": reward, "time/elapsed_s": elapsed,
                        "data/trajectories_total": 8.0 * (step + 1)})
  logger.write(2, {"reward/mean": 0.5, "time/elapsed_s": 8.0})  # step 2 trained again
  logger.rewind(2)  # resuming from the checkpoint at step 2
  assert logger.carried == {"elapsed_s": 5.0, "trajectories": 16}
  logger.write(2, {"reward/mean": 0.4, "time/elapsed_s": 7.0})
  logger.close()
  rows = metrics_lib.read_metrics(tmp_path)
  points = metrics_lib.curve_points(rows, "reward/mean", "time/elapsed_s")
  assert points.tolist() == [[2.0, 5.0, 7.0], [0.1, 0.3, 0.4]]
  assert metrics_lib.curve_points(rows, "reward/mean").tolist() == [[0, 1, 2], [0.1, 0.3, 0.4]]
  with Image.open(metrics_lib.plot_curves(tmp_path)) as png:
    assert png.size[0] == 15 * 110  # three panels of 5 inches at 110 dpi
  (tmp_path / "metrics.jsonl").write_text('{"step": 0, "time": 1, "reward/mean": 0.1}\n')
  with Image.open(metrics_lib.plot_curves(tmp_path)) as png:
    assert png.size[0] == 10 * 110  # rows from before the clock: the two panels only
