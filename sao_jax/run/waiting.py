"""What the learner is waiting for, said every `run.waiting_report_s` seconds while no
learner step completes.

    reporter = WaitingReporter(intake, batch_size=16, samplers=describe_samplers,
                               log=log, every_s=cfg.run.waiting_report_s)
    reporter.stepped(steps_done)   # when samplers start and after every step: clock restarts
    reporter.poll()                # at every poll of the transport: logs when a report is due

A report reads

    waiting for trajectories for step 1 (0 steps done, nothing for 30 s): since the
    last step 40 trajectories judged, 3 admitted (a batch takes 16), 37 dropped;
    1 of 1 sampler processes alive, 0 restarts; dropped so far: env_failure/ValueError
    37 (first: step raised ValueError: ...)

Without it, the drop reasons reached the log only after a step completed: a run whose
reward function failed on every episode printed nothing at all (the failure bound,
`data.failures`, then ends such a run; this says what happens until it does, and
while samplers compile or a slow environment works). `clock` is injectable so a
test need not sleep.
"""

from __future__ import annotations

import time
from typing import Callable

from sao_jax.data import failures


class WaitingReporter:
  """Logs a report (module docstring) once `every_s` seconds (0: never) passed since
  the last step, or the last report, without a step."""

  def __init__(self, intake: failures.Intake, *, batch_size: int,
               samplers: Callable[[], str], log: Callable[[str], None], every_s: float,
               clock: Callable[[], float] = time.monotonic):
    self._intake, self._batch_size, self._samplers = intake, batch_size, samplers
    self._log, self._every_s, self._clock = log, every_s, clock
    self._steps = 0
    self._since = self._last = clock()  # the last step; the last step or report
    self._judged = self._admitted = 0  # the intake's counts at the last step

  def stepped(self, steps_done: int) -> None:
    """A step completed (or the samplers started): nothing is overdue."""
    self._steps = steps_done
    self._since = self._last = self._clock()
    self._judged, self._admitted = self._intake.judged_total, self._intake.admitted

  def poll(self) -> None:
    """Logs a report when one is due."""
    now = self._clock()
    if self._every_s and now - self._last >= self._every_s:
      self._last = now
      self._log(self.report(now))

  def report(self, now: float) -> str:
    """The report line at time `now`."""
    judged = self._intake.judged_total - self._judged
    admitted = self._intake.admitted - self._admitted
    dropped = failures.describe(self._intake.drops)
    return (f"waiting for trajectories for step {self._steps + 1} ({self._steps} steps done, "
            f"nothing for {now - self._since:.0f} s): since the last step {judged} "
            f"trajectories judged, {admitted} admitted (a batch takes {self._batch_size}), "
            f"{judged - admitted} dropped; {self._samplers()}; "
            + (f"dropped so far: {dropped}" if dropped else "nothing dropped so far"))
