"""The learner's wall clock: elapsed run time, trajectories consumed, idle share.

    clock = RunClock(elapsed_s=resumed_at_s, trajectories=resumed_trajectories)
    metrics = clock.step(wait_s=1.5, trajectories=64)   # after each batch arrives
    clock.elapsed_s >= cfg.run.max_wall_s                 # the wall-clock budget

Time counts from when the clock is made (`run_learner` makes it once the
samplers are started and the first weights published, before the first batch is
asked for), plus `elapsed_s` carried over from before a resume (the last logged
`time/elapsed_s`: what the run had trained for up to the checkpoint it resumed
from; the minutes between that checkpoint and the crash are not counted twice).

The learner is *idle* while it waits for its next batch (`wait_s`: the time
`next(batches)` blocked, trajectories not there yet). Per step,
`learner/idle_frac = wait_s / (time since the previous batch arrived)`; over the
run, `learner/idle_frac_total = sum(wait_s) / (time since the clock started)`,
both in [0, 1]. A rollout-bound run (slow, long episodes) has them near 1; a
learner-bound one near 0.
"""

from __future__ import annotations

import time
from typing import Callable

ELAPSED_KEY = "time/elapsed_s"
TRAJECTORIES_KEY = "data/trajectories_total"
# The host metric saying how many trajectories a batch holds (`run.metrics.batch_metrics`),
# which the learner loop adds up.
BATCH_TRAJECTORIES_KEY = "batch/trajectories"


def carried_over(rows: list[dict]) -> dict[str, float]:
  """`RunClock`'s starting point for a run resumed with the metrics rows `rows` kept
  (`MetricsLogger.rewind`): the elapsed time and trajectories of the last of them."""
  last = [row for row in rows if ELAPSED_KEY in row]
  if not last:
    return {"elapsed_s": 0.0, "trajectories": 0}
  return {"elapsed_s": float(last[-1][ELAPSED_KEY]),
          "trajectories": int(last[-1].get(TRAJECTORIES_KEY, 0))}


class RunClock:
  """Elapsed wall time, trajectories consumed and the learner's idle share (module
  docstring). `clock`: seconds of a monotonic clock (a fake one in tests)."""

  def __init__(self, *, elapsed_s: float = 0.0, trajectories: int = 0,
               clock: Callable[[], float] = time.monotonic):
    self._clock = clock
    self._start = self._last = clock()
    self._before_s, self.trajectories = float(elapsed_s), int(trajectories)
    self._waited_s = 0.0

  def now(self) -> float:
    """The clock's reading (time the wait for a batch with it)."""
    return self._clock()

  @property
  def elapsed_s(self) -> float:
    """Seconds the run has trained for, resumes included."""
    return self._before_s + self._clock() - self._start

  def step(self, *, wait_s: float, trajectories: int) -> dict[str, float]:
    """The metrics of a batch that arrived now, after waiting `wait_s` seconds for it,
    holding `trajectories` trajectories."""
    now = self._clock()
    since_last, since_start = now - self._last, now - self._start
    self._last = now
    self._waited_s += wait_s
    self.trajectories += trajectories
    return {ELAPSED_KEY: self._before_s + since_start,
            TRAJECTORIES_KEY: float(self.trajectories),
            "learner/wait_s": wait_s,
            "learner/idle_frac": min(wait_s / since_last, 1.0) if since_last > 0 else 0.0,
            "learner/idle_frac_total": (min(self._waited_s / since_start, 1.0)
                                        if since_start > 0 else 0.0)}
