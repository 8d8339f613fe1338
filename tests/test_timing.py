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
