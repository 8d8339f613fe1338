"""The sampler's fixed-lag loop (`sampler.scheduled`) against a scripted learner: every
batch is sampled by the one version the schedule names, though the weight channel holds
only the newest version and the learner publishes the next the moment it has a batch."""

import itertools
import math
import time

import numpy as np
import pytest

from sao_jax import config as C
from profile_traces import spans, trace_events
from sao_jax.data.fixed_lag import MEMBER_KEY, Schedule
from sao_jax.data.sampler_phases import SAMPLER_PHASES
from sao_jax.data.task_positions import TaskStart
from sao_jax.run.phases import SamplerPhases
from sao_jax.run.profile import ProfileSignal, ProfileSteps, SamplerTrace
from sao_jax.sampler import scheduled
from sao_jax.sampler.scheduled import sample_scheduled
from sao_jax.sampler.worker import WorkerSpec
from sao_jax.types import Trajectory

BATCHES = 7
# What each engine step of the scripted runner spends, and each hand-over (seconds added
# to a clock that otherwise runs at the machine's pace): dyadic, so sums are exact.
PREFILL_S, DECODE_S, ENV_WAIT_S, HANDOVER_S = 0.25, 0.5, 0.125, 0.0625


class Clock:
  """time.perf_counter plus the seconds the scripted runner and learner spend."""

  def __init__(self):
    self.offset = 0.0

  def advance(self, seconds):
    self.offset += seconds

  def __call__(self):
    return time.perf_counter() + self.offset


class Engine:
  def __init__(self, runner, version):
    self.runner, self.version, self.switches = runner, version, []
    self.seconds = {"prefill": 0.0, "decode": 0.0}  # the engine's clocks (`run.phases`)

  def set_params(self, params, version):
    assert self.runner.in_flight == 0, "weights changed under episodes in flight"
    assert params == f"weights {version}"
    self.version = version
    self.switches.append(version)


class Runner:
  """Episodes that each finish two `step`s after they start: with 8 slots, two batches of
  4 finish in one step, and a learner given both at once would publish two versions
  before the sampler polls again."""

  def __init__(self, slots=8, clock=None):
    self.slots, self.live, self.ids = slots, [], itertools.count()
    self.engine, self.clock, self.steps = None, clock, 0
    self.env_wait_s = 0.0

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
    self.steps += 1
    if self.clock is not None:  # a step of PREFILL_S + DECODE_S + ENV_WAIT_S
      self.clock.advance(PREFILL_S + DECODE_S + ENV_WAIT_S)
      self.engine.seconds["prefill"] += PREFILL_S
      self.engine.seconds["decode"] += DECODE_S
      self.env_wait_s += ENV_WAIT_S
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

  def __init__(self, schedule, clock=None):
    self.schedule, self.steps, self.newest, self.taken = schedule, 0, None, True
    self.received, self.batches, self.clock = {}, [], clock
    # Every trajectory handed over, in order (later batches' included), with the engine
    # steps run by then (`steps_run`: set by the test).
    self.handed, self.steps_run = [], lambda: 0
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
    if self.clock is not None:
      self.clock.advance(HANDOVER_S)
    self.handed.append((traj, self.steps_run()))
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


def sample(lag, warmup, group, *, clock=None, trace=None):
  """(schedule, scripted learner, engine, runner) after the loop ran BATCHES batches;
  `clock` times its phases (default: time.perf_counter), `trace` marks its engine steps
  (default: never traced)."""
  algorithm = (C.AlgorithmConfig.for_variant("grpo", group_size=group) if group > 1 else
               C.AlgorithmConfig.for_variant("sao"))
  cfg = C.Config(data=C.DataConfig(fixed_lag=lag, max_lag=4), algorithm=algorithm,
                 learner=C.LearnerConfig(batch_trajectories=4, critic_warmup_steps=warmup),
                 env=C.EnvConfig(name="sanity", max_turns=1)).validate()
  schedule = Schedule.of(cfg)
  learner, runner = Learner(schedule, clock), Runner(clock=clock)
  learner.steps_run = lambda: runner.steps
  engine = Engine(runner, 0)
  runner.engine = engine
  rounds = itertools.count()
  sample_scheduled(WorkerSpec(cfg=cfg, tokenizer_path="", weights=None, transport=None,
                              task_start=TaskStart(0)),
                   lambda: len(learner.batches) < BATCHES and next(rounds) < 2000,
                   engine=engine, runner=runner, to_policy=lambda params: params,
                   first=learner.take(), poller=learner, counts=Counts(),
                   hand_over=learner.hand_over, log=print,
                   phases=SamplerPhases(engine, runner, **({} if clock is None else
                                                           {"clock": clock})),
                   trace=trace or SamplerTrace(None, worker_id=0))
  assert len(learner.batches) == BATCHES, "the sampler stalled: a version it needed was lost"
  return schedule, learner, engine, runner


@pytest.mark.parametrize("lag, warmup, group", [(0, 0, 1), (1, 1, 1), (2, 2, 2), (3, 0, 2)])
def test_every_batch_is_sampled_by_the_version_the_schedule_names(lag, warmup, group):
  schedule, learner, engine, _ = sample(lag, warmup, group)
  for t, batch in enumerate(learner.batches):
    assert {traj.policy_versions for traj in batch} == {(schedule.sampling_version(t),) * 2}
    keys = sorted((traj.info["task_position"], traj.info[MEMBER_KEY]) for traj in batch)
    assert keys == [(p, m) for p in schedule.positions(t, 0) for m in range(group)]
    for traj in batch:  # the seed is the position's, whatever the timing
      p, m = traj.info["task_position"], traj.info[MEMBER_KEY]
      assert traj.info["seed"] == p * group + m
  # One switch per new version, never back.
  assert engine.switches == sorted(set(engine.switches))


@pytest.mark.parametrize("lag", [0, 2])
def test_each_trajectory_handed_over_carries_the_loops_phases_since_the_one_before(lag):
  clock = Clock()
  _, learner, _, _ = sample(lag, 0, 1, clock=clock)
  reports = [traj.info["phases"] for traj, _ in learner.handed]
  for report in reports:  # laps: a partition of the loop's time
    assert math.isclose(sum(report[p] for p in SAMPLER_PHASES), report["wall"],
                        rel_tol=1e-12, abs_tol=1e-12), report
    assert min(report.values()) >= 0, report
  total = {p: sum(r[p] for r in reports) for p in SAMPLER_PHASES}
  # The engine's clocks of every step run before the last hand-over, exactly.
  steps = learner.handed[-1][1]
  assert total["prefill"] == PREFILL_S * steps
  assert total["decode"] == DECODE_S * steps
  assert total["env_wait"] == ENV_WAIT_S * steps
  # A hand-over's time is in the next trajectory's report (the last one's in none).
  assert total["handover"] >= HANDOVER_S * (len(reports) - 1)
  # With lag 0 batch t needs the version trained on t - 1, published only once t - 1 is
  # handed over: the loop idles for it (a sleep each time). With lag 2 the version is
  # two batches old, and the scripted learner publishes at once: it never idles.
  if lag == 0:
    assert total["version_wait"] >= scheduled._IDLE_S
  else:
    assert total["version_wait"] == 0.0


def test_a_profile_window_traces_the_scheduled_loops_engine_steps(tmp_path):
  window = ProfileSignal.of_engine_steps(str(tmp_path), ProfileSteps.parse("2", "engine steps"))
  trace = SamplerTrace(window, worker_id=0)
  sample(1, 1, 1, trace=trace)
  assert not trace.tracing
  # Steps 1 and 2: the two after the first, which compiles.
  assert spans(trace_events(tmp_path / "profile" / "sampler" / "worker_0"),
               "engine_step") == [1, 2]
