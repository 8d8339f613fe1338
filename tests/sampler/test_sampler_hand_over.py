"""The sampler's hand-over to the transport: backpressure, but no orphan when the learner dies."""

import multiprocessing
import os
import signal
import time

import numpy as np
import psutil

from sao_jax.channel.transport import QueueTransport
from sao_jax.sampler.worker import exit_without_flushing, hand_over
from sao_jax.types import Trajectory


def make_traj(seed=0, length=6):
  tokens = np.arange(length, dtype=np.int32) + seed
  action = (np.arange(length) >= length // 3).astype(np.int8)
  rewards = np.zeros(length, np.float32)
  rewards[-1] = 1.0
  return Trajectory(tokens=tokens, action_mask=action,
                    behavior_logp=-0.5 * action.astype(np.float32), rewards=rewards,
                    prompt_id=seed, policy_versions=(0, 0))


def test_waits_while_full_then_puts():
  transport = QueueTransport(capacity=1)
  transport.put(make_traj(seed=0))
  checks = []

  def alive():  # the learner takes a trajectory after the second check
    checks.append(time.monotonic())
    if len(checks) == 2:
      transport.get(timeout=1.0)
    return True

  assert hand_over(transport, make_traj(seed=1), alive, poll_s=0.05)
  assert len(checks) >= 2 and transport.get(timeout=1.0).tokens.tolist() == make_traj(
      seed=1).tokens.tolist()


def test_stops_waiting_once_not_alive_or_closed():
  transport = QueueTransport(capacity=1)
  transport.put(make_traj())
  flags = iter([True, True, False])
  start = time.monotonic()
  assert not hand_over(transport, make_traj(), lambda: next(flags), poll_s=0.05)
  assert time.monotonic() - start < 5.0
  transport.close()
  assert not hand_over(transport, make_traj(), lambda: True, poll_s=0.05)


def _sampler(transport, parent_pid, handed):
  """The fallback without a parent-death signal: the liveness check, then an exit
  that does not flush (trajectories of 4000 tokens: the queue's pipe is full)."""
  alive = lambda: os.getppid() == parent_pid
  while hand_over(transport, make_traj(handed.value, length=4000), alive, poll_s=0.1):
    handed.value += 1
  exit_without_flushing(0)


def _learner(report):
  """Starts a sampler, reports it once it filled the queue, then waits to be killed."""
  context = multiprocessing.get_context("spawn")
  transport = QueueTransport(capacity=8, context=context)
  handed = context.Value("i", 0)
  sampler = context.Process(target=_sampler, args=(transport, os.getpid(), handed))
  sampler.start()
  while handed.value < 8:
    time.sleep(0.1)
  report.put(sampler.pid)
  time.sleep(600)


def test_a_sigkilled_learner_with_a_full_queue_leaves_no_sampler():
  context = multiprocessing.get_context("spawn")
  report = context.Queue()
  learner = context.Process(target=_learner, args=(report,))
  learner.start()
  sampler = psutil.Process(report.get(timeout=120))
  time.sleep(1.0)  # the queue is full: the sampler is waiting on it
  assert sampler.is_running()
  os.kill(learner.pid, signal.SIGKILL)
  learner.join(timeout=10)
  try:
    sampler.wait(timeout=10)  # raises psutil.TimeoutExpired if it outlives the learner
  finally:
    if sampler.is_running():
      sampler.kill()
