"""A sampler process that ends while stop was not requested is a crash: one that calls
`sys.exit` in code it runs reports it (where, and with what), and one that exits
without a report, even with exit code 0, counts against the restart budget and is
logged with its exit code."""

import os
import sys
import time

from sao_jax import config as C
from sao_jax.channel.transport import QueueTransport
from sao_jax.sampler.worker import SamplerSupervisor, WorkerSpec


def calls_sys_exit(spec, alive):
  """A sampler run whose code (a plugin's, say) calls sys.exit() outside any episode."""
  sys.exit()


def exits_silently(spec, alive):
  """A sampler run that ends the process with exit code 0 and nothing said."""
  os._exit(0)


def _supervise(run, max_restarts):
  """Supervises one worker running `run` until the restart budget is spent; the
  supervisor, its log and the error that ended it."""
  logs = []
  transport = QueueTransport(capacity=2)
  supervisor = SamplerSupervisor(
      [WorkerSpec(cfg=C.Config(), tokenizer_path="", weights=None, transport=transport)],
      run=run, log=logs.append, max_restarts=max_restarts)
  supervisor.start()
  try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
      try:
        supervisor.check()  # as the learner does between steps and while it waits
      except RuntimeError as error:
        return supervisor, logs, str(error)
      time.sleep(0.2)
    raise AssertionError(f"the supervisor never gave up; log: {logs}")
  finally:
    supervisor.stop()
    transport.close()


def test_sys_exit_in_a_sampler_is_reported_and_counted_as_a_crash():
  # It ended the process with exit code 0 and no report: the learner's log said only
  # "exit code 0", nothing of where or why.
  supervisor, logs, error = _supervise(calls_sys_exit, max_restarts=1)
  assert supervisor.restarts == 2
  assert logs[0].startswith("sampler 0 died (SystemExit); restarting with the newest weights")
  assert "in calls_sys_exit" in logs[1] and "sys.exit()" in logs[1]  # the traceback
  assert error.startswith("sampler 0 died 2 times; last: Traceback")


def test_a_sampler_that_exits_0_without_a_report_is_a_crash():
  supervisor, logs, error = _supervise(exits_silently, max_restarts=1)
  assert supervisor.restarts == 2
  assert error == ("sampler 0 died 2 times; last: exit code 0 with no report: a sampler "
                   "exits only when stopped, so this is a crash")
  assert logs == ["sampler 0 died (exit code 0 with no report: a sampler exits only when "
                  "stopped, so this is a crash); restarting with the newest weights [1/1]"]


def test_a_report_that_lands_after_the_drain_is_still_read():
  """The race a loaded machine hit: the supervisor read the error queue (empty), the
  worker then reported and exited, and the supervisor, finding it dead, called it a
  death without a report. Here the queue reads empty exactly once, as in that window."""
  logs = []
  transport = QueueTransport(capacity=2)
  supervisor = SamplerSupervisor(
      [WorkerSpec(cfg=C.Config(), tokenizer_path="", weights=None, transport=transport)],
      run=calls_sys_exit, log=logs.append, max_restarts=1)
  supervisor.start()
  try:
    process = supervisor._processes[0]
    process.join(timeout=60)
    assert not process.is_alive()
    empty, calls = supervisor._errors.empty, []

    def empty_once_then_real():
      calls.append(1)
      return len(calls) == 1 or empty()

    supervisor._errors.empty = empty_once_then_real
    supervisor.check()
    assert logs[0].startswith("sampler 0 died (SystemExit); restarting"), logs
  finally:
    supervisor.stop()
    transport.close()
