"""While no learner step completes, the learner says what it waits for and what it
dropped so far, each kind with its first message (before: nothing until a step, so a
reward function failing on every episode left `sao-train` silent for minutes)."""

from sao_jax.data import failures, pipeline
from sao_jax.run.waiting import WaitingReporter


class Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def reporter_with(every_s=30.0):
  drops, clock, lines = pipeline.Drops(), Clock(), []
  intake = failures.Intake(drops, max_fraction=1.0, window=64)
  reporter = WaitingReporter(intake, batch_size=16, samplers=lambda: "1 of 1 sampler processes "
                             "alive, 0 restarts", log=lines.append, every_s=every_s, clock=clock)
  return reporter, intake, drops, clock, lines


def test_a_report_every_interval_while_no_step_completes():
  reporter, intake, drops, clock, lines = reporter_with()
  reporter.stepped(0)  # the samplers started
  clock.now += 29.9
  reporter.poll()
  assert lines == []
  for _ in range(3):
    intake.judged(None)
  for text in ("step raised AssertionError: method 'exact'", "a later text"):
    drops.add("env_failure/AssertionError", 1, text)
    drops.add("env_failure", 1, text)
    intake.judged("env_failure/AssertionError")
  clock.now += 0.1
  reporter.poll()
  assert lines == [
      "waiting for trajectories for step 1 (0 steps done, nothing for 30 s): since the last "
      "step 5 trajectories judged, 3 admitted (a batch takes 16), 2 dropped; 1 of 1 sampler "
      "processes alive, 0 restarts; dropped so far: env_failure/AssertionError 2 (first: step "
      "raised AssertionError: method 'exact')"]
  reporter.poll()  # not again until another interval has passed
  clock.now += 30
  reporter.poll()
  assert len(lines) == 2 and "nothing for 60 s" in lines[1]


def test_a_step_restarts_the_clock_and_the_counts():
  reporter, intake, _, clock, lines = reporter_with()
  intake.judged(None)
  clock.now += 25
  reporter.stepped(3)
  clock.now += 25
  reporter.poll()
  assert lines == []  # 50 s since the start, 25 since the step
  clock.now += 5
  reporter.poll()
  assert lines[0].startswith("waiting for trajectories for step 4 (3 steps done, nothing for "
                             "30 s): since the last step 0 trajectories judged, 0 admitted")
  assert lines[0].endswith("nothing dropped so far")


def test_zero_seconds_reports_nothing():
  reporter, _, _, clock, lines = reporter_with(every_s=0)
  clock.now += 1e6
  reporter.poll()
  assert lines == []
