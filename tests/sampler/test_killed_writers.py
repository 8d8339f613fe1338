"""A sampler SIGKILLed in the middle of handing over a trajectory does not wedge
the learner, the other samplers or its own restart (queue transport).

A killed writer can leave its queue's pipe lock held (its feeder thread was
sending) and half a message in the pipe. On one shared queue the first stops
every other writer for good and the second blocks the learner's read forever;
with a queue per writer incarnation only the dead writer's queue is lost.
"""

import os
import signal
import struct
import time

import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.channel.transport import QueueTransport
from sao_jax.sampler.worker import SamplerSupervisor, WorkerSpec, hand_over
from sao_jax.types import Trajectory


def trajectory(prompt_id: int) -> Trajectory:
  return Trajectory(tokens=np.arange(8, dtype=np.int32), action_mask=np.ones(8, np.int8),
                    behavior_logp=np.zeros(8, np.float32), rewards=np.zeros(8, np.float32),
                    prompt_id=prompt_id, policy_versions=(0, 0))


def _queue_of(transport):
  """The multiprocessing queue this writer's puts go through."""
  return transport._queues[transport._writer]


def die_holding_the_pipe_lock(spec, alive):
  """Worker 0's first incarnation dies as if killed while its feeder thread was
  sending (the lock held); every other run hands over trajectories tagged with
  its worker id."""
  if spec.worker_id == 0 and not os.path.exists(os.environ["SAO_TEST_KILLED"]):
    open(os.environ["SAO_TEST_KILLED"], "w").close()
    _queue_of(spec.transport)._wlock.acquire()
    os.kill(os.getpid(), signal.SIGKILL)
  while hand_over(spec.transport, trajectory(spec.worker_id), alive, poll_s=0.1):
    time.sleep(0.05)


def die_mid_message(spec, alive):
  """As above, but dying with half a message in the pipe (the length header of a
  large record and a few of its bytes)."""
  if spec.worker_id == 0 and not os.path.exists(os.environ["SAO_TEST_KILLED"]):
    open(os.environ["SAO_TEST_KILLED"], "w").close()
    os.write(_queue_of(spec.transport)._writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 64)
    os.kill(os.getpid(), signal.SIGKILL)
  while hand_over(spec.transport, trajectory(spec.worker_id), alive, poll_s=0.1):
    time.sleep(0.05)


def _timeout(*_):
  raise TimeoutError("the learner's read blocked on a dead writer's queue")


@pytest.mark.parametrize("run", [die_holding_the_pipe_lock, die_mid_message],
                         ids=["pipe_lock_held", "half_a_message"])
def test_a_killed_writer_wedges_nobody(run, tmp_path, monkeypatch):
  monkeypatch.setenv("SAO_TEST_KILLED", str(tmp_path / "killed"))
  transport = QueueTransport(capacity=4)
  specs = [WorkerSpec(cfg=C.Config(), tokenizer_path="", weights=None, transport=transport,
                      worker_id=i) for i in range(2)]
  supervisor = SamplerSupervisor(specs, run=run, log=lambda line: None)
  previous = signal.signal(signal.SIGALRM, _timeout)
  signal.alarm(60)
  seen = set()
  try:
    supervisor.start()
    deadline = time.monotonic() + 45
    while seen != {0, 1} and time.monotonic() < deadline:
      traj = transport.get(timeout=0.2)
      if traj is not None:
        seen.add(traj.prompt_id)
      supervisor.check()  # as the learner does after a step and while it waits
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
    transport.close()
    supervisor.stop()
  assert (tmp_path / "killed").exists() and supervisor.restarts == 1
  # The other sampler kept going, and the restarted one reached the learner too.
  assert seen == {0, 1}
