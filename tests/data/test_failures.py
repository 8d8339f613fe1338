"""Drops by kind with their first messages, and the bound that stops a run of failures:
a reward function that fails on every episode ended nothing (the learner waited for a
batch forever); mixed failures collapsed into one label with one example."""

import dataclasses

import pytest

from sao_jax import config as C
from sao_jax.data import failures, pipeline
from sao_jax.run.metrics import MetricsLogger
from traj_factory import ListTransport, make_traj


def failed(kind, text, seed=0, **changes):
  return make_traj(env_failure=text, info={"failure_kind": kind}, seed=seed, **changes)


def build(trajs, *, max_fraction=1.0, window=4, batch_size=4):
  drops = pipeline.Drops()
  intake = failures.Intake(drops, max_fraction=max_fraction, window=window)
  it = pipeline.learner_pipeline(ListTransport(trajs), batch_size=batch_size, group_size=1,
                                 max_lag=2, buckets=(16,), pad_id=0, vocab_size=50,
                                 current_version=lambda: 5, drops=drops, intake=intake)
  return it, drops, intake


# A reward function that raises, one that returns NaN and one that returns a string:
# whatever kind the sampler names for each (`info["failure_kind"]`) is its own counter.
MIXED = [failed("ValueError", "reward function raised ValueError: no answer", seed=1),
         failed("reward.nan", "reward function returned nan", seed=2),
         failed("ValueError", "reward function raised ValueError: second text", seed=3),
         failed("reward.str", "reward function returned 'abc'", seed=4),
         failed("reward.nan", "reward function returned nan (again)", seed=5)]


def test_mixed_failures_are_counted_by_kind_each_with_its_first_message():
  it, drops, intake = build(MIXED + [make_traj(seed=s) for s in range(10, 14)], window=16)
  next(it)
  assert failures.kinds(drops) == {"env_failure/ValueError": 2, "env_failure/reward.nan": 2,
                                   "env_failure/reward.str": 1}
  assert drops["env_failure"] == 5
  # The first message of each kind, not the latest (the old code kept the latest).
  assert drops.examples["env_failure/ValueError"] == "reward function raised ValueError: no answer"
  assert drops.examples["env_failure/reward.nan"] == "reward function returned nan"
  assert failures.describe(drops) == (
      "env_failure/ValueError 2 (first: reward function raised ValueError: no answer); "
      "env_failure/reward.nan 2 (first: reward function returned nan); "
      "env_failure/reward.str 1 (first: reward function returned 'abc')")
  assert (intake.judged_total, intake.admitted) == (9, 4)
  assert intake.closing_line().startswith("trajectories: 9 judged, 4 admitted, 5 dropped: "
                                          "env_failure/ValueError 2 (first: ")
  summary = intake.summary()
  assert summary["dropped_by_kind"]["env_failure/reward.str"] == 1
  assert summary["dropped_first_message"]["env_failure/reward.str"] == (
      "reward function returned 'abc'")


def test_a_failure_naming_no_kind_is_listed_as_env_failure_beside_the_named_ones():
  it, drops, _ = build([failed(None, "a peer's failure", seed=1), MIXED[0]]
                       + [make_traj(seed=s) for s in range(10, 14)], window=16)
  next(it)
  assert failures.kinds(drops) == {"env_failure": 1, "env_failure/ValueError": 1}


def test_a_window_of_failures_stops_the_pipeline_naming_each_kind_count_and_first_message():
  it, drops, _ = build(MIXED + [make_traj(seed=s) for s in range(10, 14)], window=4)
  with pytest.raises(failures.TooManyFailures) as error:
    next(it)
  text = str(error.value)
  assert text.startswith("4 of the last 4 episodes the learner received failed "
                         "(run.max_failure_fraction=1 of run.failure_window=4)")
  assert "env_failure/ValueError 2 (first: reward function raised ValueError: no answer)" in text
  assert "env_failure/reward.str 1 (first: reward function returned 'abc')" in text
  assert "raise run.max_failure_fraction" in text


def test_a_healthy_run_with_occasional_failures_never_trips_the_default_bound():
  defaults = C.RunConfig()
  drops = pipeline.Drops()
  intake = failures.Intake(drops, max_fraction=defaults.max_failure_fraction,
                           window=defaults.failure_window)
  for episode in range(2000):  # every other episode fails: far below 95% of 64
    intake.judged("env_failure/ValueError" if episode % 2 else None)
  assert intake.failed_fraction == 0.5
  with pytest.raises(failures.TooManyFailures, match="61 of the last 64"):
    for _ in range(61):  # and then nearly all of them do
      intake.judged("env_failure/ValueError")


def test_late_trajectories_are_not_failures():
  intake = failures.Intake(pipeline.Drops(), max_fraction=0.5, window=2)
  for _ in range(10):
    intake.judged("stale")
    intake.judged("future_version")
  intake.judged("too_long")
  assert intake.failed_fraction == 1.0 and intake.judged_total == 21  # one in a 2-window
  with pytest.raises(failures.TooManyFailures, match="too_long 1"):
    intake.judged(None)  # 1 of 2 failed: the 0.5 bound is reached


@pytest.mark.parametrize("field,value,message", [
    ("max_failure_fraction", 0.0, "expected a fraction in (0, 1]"),
    ("max_failure_fraction", 1.5, "expected a fraction in (0, 1]"),
    ("max_failure_fraction", True, "expected a fraction in (0, 1]"),
    ("failure_window", 0, "expected a positive integer"),
    ("waiting_report_s", -1.0, "expected a finite number of seconds >= 0"),
    ("waiting_report_s", float("inf"), "expected a finite number"),
])
def test_the_bound_and_the_report_interval_are_validated(field, value, message):
  with pytest.raises(ValueError, match=rf"run\.{field}=.*{message[:20]}"):
    dataclasses.replace(C.RunConfig(), **{field: value}).validate()


def test_the_progress_line_names_the_drops_by_kind(tmp_path):
  logger = MetricsLogger(tmp_path, total_steps=10, loggers=())
  line = logger.progress(0, {"reward/mean": 0.5, "dropped/env_failure": 5.0,
                             "dropped/env_failure/ValueError": 3.0,
                             "dropped/env_failure/reward.nan": 2.0, "dropped/too_long": 1.0})
  assert "| dropped 6 (env_failure/ValueError 3, env_failure/reward.nan 2, too_long 1) |" in line
  assert "dropped" not in logger.progress(1, {"reward/mean": 0.5})
  logger.close()
