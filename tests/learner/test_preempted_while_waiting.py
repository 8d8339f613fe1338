"""A SIGTERM that lands while the learner waits for trajectories (agent episodes can take
minutes) stops the run at once, checkpointed, with what had arrived kept for the resume."""

import os
import signal
import time

import numpy as np

from sao_jax.data import pipeline
from sao_jax.data.learner_data import Checkpointed
from sao_jax.learner.loop import run_learner
from sao_jax.run.checkpoint import Checkpointer, PreemptionWatcher
from sao_jax.types import Trajectory
from test_checkpoint_resume import config

GIVE_UP_POLLS = 200  # the old loop never looked at SIGTERM here: it ran until the data ended


class SignallingTransport:
  """Hands out `trajs`, then polls empty; at the second empty poll the process gets
  SIGTERM (as a TPU VM's preemption sends it). Closes after GIVE_UP_POLLS empty polls."""

  def __init__(self, trajs, signal_at: int | None = 2):
    self.trajs, self.signal_at, self.empty_polls = list(trajs), signal_at, 0

  @property
  def closed(self):
    return self.empty_polls >= GIVE_UP_POLLS

  def get(self, timeout=0.0):
    if self.trajs:
      return self.trajs.pop(0)
    self.empty_polls += 1
    if self.empty_polls == self.signal_at:
      os.kill(os.getpid(), signal.SIGTERM)
    return None


def trajectories(first_seed, count, length=12):
  """`count` distinct episodes of `length` tokens: a prompt of 4, then actions, outcome 0/1."""
  out = []
  for seed in range(first_seed, first_seed + count):
    rng = np.random.default_rng(seed)
    action = (np.arange(length) >= 4).astype(np.int8)
    rewards = np.zeros(length, np.float32)
    rewards[-1] = seed % 2
    out.append(Trajectory(tokens=rng.integers(0, 64, length).astype(np.int32),
                          action_mask=action, behavior_logp=np.where(action, -4.0, 0.0).astype(
                              np.float32), rewards=rewards, prompt_id=seed,
                          policy_versions=(0, 0)))
  return out


def batches_from(transport, seen, interrupted=lambda: False):
  """The learner's pipeline over `transport` (8 padded rows of 16, vocab 64: the learner
  fixtures' model); each batch's trajectories' first tokens are appended to `seen`."""
  it = pipeline.learner_pipeline(
      transport, batch_size=8, group_size=1, max_lag=4, buckets=(16,), pad_id=0,
      vocab_size=64, current_version=lambda: 0, drops=pipeline.Drops(),
      interrupted=interrupted)

  def record(item):
    batch, _ = item
    seen.append(sorted(tuple(row[:12]) for row, seg in zip(batch.tokens, batch.segment_ids)
                       if seg.any()))
    return batch, {}
  return Checkpointed(it, record)


def test_sigterm_while_waiting_stops_at_once_checkpointed_and_keeps_what_arrived(tmp_path):
  # Two whole batches (step 1's checkpoint is orbax's initial save, step 2 is off the
  # schedule), then 3 of the third batch's 8 before SIGTERM.
  trained, gathered, later = trajectories(0, 16), trajectories(30, 3), trajectories(40, 5)
  transport = SignallingTransport(trained + gathered)
  watcher = PreemptionWatcher()
  try:
    began = time.monotonic()
    result = run_learner(config(tmp_path, steps=5, save_every_steps=100),
                         batches_from(transport, [], lambda: watcher.requested), watcher=watcher)
    waited_s = time.monotonic() - began
  finally:
    watcher.close()
  assert (result.stopped_by, result.steps_done) == ("preemption", 2)
  assert transport.empty_polls == 2, "the wait went on after SIGTERM"
  assert Checkpointer(config(tmp_path, steps=5)).all_steps() == [1, 2]
  assert waited_s < 120

  seen = []
  resumed = run_learner(config(tmp_path, steps=3), batches_from(
      SignallingTransport(later, signal_at=None), seen))
  assert (resumed.stopped_by, resumed.steps_done) == ("steps", 3)
  assert seen == [sorted(tuple(t.tokens) for t in gathered + later)]
