"""The sampler's fixed-lag loop (`sampler.scheduled`) against a scripted learner: every
batch is sampled by the one version the schedule names, though the weight channel holds
only the newest version and the learner publishes the next the moment it has a batch."""

import itertools

import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.data.fixed_lag import MEMBER_KEY, Schedule
from sao_jax.data.task_positions import TaskStart
from sao_jax.sampler.scheduled import sample_scheduled
from sao_jax.sampler.worker import WorkerSpec
from sao_jax.types import Trajectory

BATCHES = 7


class Engine:
  def __init__(self, runner, version):
    self.runner, self.version, self.switches = runner, version, []

  def set_params(self, params, version):
    assert self.runner.in_flight == 0, "weights changed under episodes in flight"
    assert params == f"weights {version}"
    self.version = version
    self.switches.append(version)


class Runner:
  """Episodes that each finish two `step`s after they start: with 8 slots, two batches of
  4 finish in one step, and a learner given both at once would publish two versions
  before the sampler polls again."""

  def __init__(self, slots=8):
    self.slots, self.live, self.ids = slots, [], itertools.count()
    self.engine = None

  @property
  def in_flight(self):
    return len(self.live)

  def can_start(self, n):
    return len(self.live) + n <= self.slots

  def start(self, task, *, prompt_id, seed):
    episode = next(self.ids)
    self.live.append([episode, 2, task, seed, self.engine.version])
    return episode

  def step(self):
    for live in self.live:
      live[1] -= 1
    done = [live for live in self.live if live[1] == 0]
    self.live = [live for live in self.live if live[1] > 0]
    return [Trajectory(tokens=np.zeros(2, np.int32), action_mask=np.array([0, 1], np.int8),
                       behavior_logp=np.zeros(2, np.float32), rewards=np.zeros(2, np.float32),
                       prompt_id=0, policy_versions=(version, version),
                       info={"episode": episode, "task": task.id, "seed": seed})
            for episode, _, task, seed, version in done]

  def close(self):
    pass


class Learner:
  """Takes batch t once all of it was handed over, trains at once and publishes the
  version after t + 1 steps; the channel keeps only the newest (`take`)."""

  def __init__(self, schedule):
    self.schedule, self.steps, self.newest, self.taken = schedule, 0, None, True
    self.received, self.batches = {}, []
    self.publish()

  def publish(self):
    version = self.schedule.policy_version_after(self.steps)
    if self.newest != version:
      self.newest, self.taken = version, False

  def take(self):
    if self.taken:
      return None
    self.taken = True
    return f"weights {self.newest}", self.newest

  def hand_over(self, traj):
    batch = self.schedule.batch_of(traj.info["task_position"])
    assert batch >= self.steps, "a batch arrived after the learner trained it"
    self.received.setdefault(batch, []).append(traj)
    while len(self.received.get(self.steps, ())) == self.schedule.batch_trajectories:
      self.batches.append(self.received.pop(self.steps))
      self.steps += 1
      self.publish()
    return True


class Counts:
  def take(self):
    return 0, 0


@pytest.mark.parametrize("lag, warmup, group", [(0, 0, 1), (1, 1, 1), (2, 2, 2), (3, 0, 2)])
def test_every_batch_is_sampled_by_the_version_the_schedule_names(lag, warmup, group):
  algorithm = (C.AlgorithmConfig.for_variant("grpo", group_size=group) if group > 1 else
               C.AlgorithmConfig.for_variant("sao"))
  cfg = C.Config(data=C.DataConfig(fixed_lag=lag, max_lag=4), algorithm=algorithm,
                 learner=C.LearnerConfig(batch_trajectories=4, critic_warmup_steps=warmup),
                 env=C.EnvConfig(name="sanity", max_turns=1)).validate()
  schedule = Schedule.of(cfg)
  learner, runner = Learner(schedule), Runner()
  engine = Engine(runner, 0)
  runner.engine = engine
  rounds = itertools.count()
  sample_scheduled(WorkerSpec(cfg=cfg, tokenizer_path="", weights=None, transport=None,
                              task_start=TaskStart(0)),
                   lambda: len(learner.batches) < BATCHES and next(rounds) < 2000,
                   engine=engine, runner=runner, to_policy=lambda params: params,
                   first=learner.take(), poller=learner, counts=Counts(),
                   hand_over=learner.hand_over, log=print)
  assert len(learner.batches) == BATCHES, "the sampler stalled: a version it needed was lost"
  for t, batch in enumerate(learner.batches):
    assert {traj.policy_versions for traj in batch} == {(schedule.sampling_version(t),) * 2}
    keys = sorted((traj.info["task_position"], traj.info[MEMBER_KEY]) for traj in batch)
    assert keys == [(p, m) for p in schedule.positions(t, 0) for m in range(group)]
    for traj in batch:  # the seed is the position's, whatever the timing
      p, m = traj.info["task_position"], traj.info[MEMBER_KEY]
      assert traj.info["seed"] == p * group + m
  # One switch per new version, never back.
  assert engine.switches == sorted(set(engine.switches))
