"""Simulated tool latency (env.latency): seeded per-episode delays that sleep on the
step thread while other episodes decode."""

import dataclasses
import itertools
import time
import types

import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.chat import chat_format
from sao_jax.config.env import StepLatency
from sao_jax.envs.base import Environment, StepResult, Task
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.sampler import scripted
from sao_jax.sampler.episodes import EpisodeRunner
from sao_jax.sampler.latency import episode_delays

TOKENIZER = train_tokenizer(["seen task turn answer 0 1 2 3 4 5 6 7 8 9"] * 4, vocab_size=300)
CHAT = chat_format(None, TOKENIZER)


def draws(latency, seed, n):
  return np.array(list(itertools.islice(episode_delays(latency, seed=seed), n)))


def test_lognormal_delays_have_the_configured_median_and_spread_and_repeat_by_seed():
  latency = StepLatency(kind="lognormal", median_s=0.5, sigma=0.8, max_s=1000.0)
  delays = draws(latency, seed=7, n=20000)
  assert np.median(delays) == pytest.approx(0.5, rel=0.03)
  assert np.std(np.log(delays)) == pytest.approx(0.8, rel=0.03)
  np.testing.assert_array_equal(delays[:50], draws(latency, seed=7, n=50))  # reproducible
  assert not np.array_equal(delays[:50], draws(latency, seed=8, n=50))  # per episode
  cut = draws(dataclasses.replace(latency, max_s=1.0), seed=7, n=20000)
  assert cut.max() == 1.0
  np.testing.assert_array_equal(cut, np.minimum(delays, 1.0))  # the same stream, cut
  assert np.mean(cut == 1.0) == pytest.approx(np.mean(delays >= 1.0))


def test_fixed_and_no_latency():
  assert draws(StepLatency(kind="fixed", seconds=0.25), seed=1, n=3).tolist() == [0.25] * 3
  assert draws(StepLatency(), seed=1, n=3).tolist() == [0.0] * 3


@pytest.mark.parametrize("changes,message", [
    ({"kind": "exponential"}, "env.latency.kind='exponential' is invalid: allowed values"),
    ({"kind": "lognormal", "median_s": 0.0}, "env.latency.median_s=0.0 is invalid"),
    ({"kind": "fixed", "seconds": 5.0, "max_s": 2.0}, "raise max_s or lower seconds"),
    ({"sigma": -1.0}, "env.latency.sigma=-1.0 is invalid: expected a finite number >= 0"),
    ({"kind": "fixed", "max_s": 400.0}, "env.step_timeout_s=300.0"),
])
def test_bad_latency_settings_are_refused_by_name(changes, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
    C.EnvConfig(latency=StepLatency(**changes)).validate()


class QuickEnv(Environment):
  """Two turns, answered at once: all the time an episode waits is the latency's."""

  def __init__(self):
    super().__init__(max_turns=2, max_observation_chars=100)

  def _reset(self, task):
    return [{"role": "user", "content": task.prompt}]

  def _step(self, action):
    if self.turn == 2:
      return StepResult.finish(1.0, "answer")
    return StepResult.next("seen")


def task(i):
  return Task(id=f"t{i}", prompt=f"task {i}", answer="", metadata=types.MappingProxyType({}))


def test_a_delayed_step_sleeps_without_holding_up_other_episodes():
  """One step thread configured, a 0.4 s delay per step: the second episode decodes
  while the first sleeps, and both delays run at once (the pool grows to a thread per
  episode), so two episodes of two steps take about two delays, not four."""
  engine = scripted.ScriptedEngine(CHAT, lambda episode, turn: "answer")
  runner = EpisodeRunner(engine, CHAT, QuickEnv, max_episodes=2, env_threads=1,
                         latency=StepLatency(kind="fixed", seconds=0.4), log=lambda text: None)
  begin = time.monotonic()
  runner.start(task(0), prompt_id=0, seed=0)
  assert runner.step() == []  # its first turn handed to a step thread, asleep
  runner.start(task(1), prompt_id=1, seed=1)
  runner.step()
  assert engine.episodes[1]["turns"] == 1  # decoded while episode 0 sleeps
  assert runner.env_steps.pending == 2 and runner.env_steps.backlog == 0
  assert time.monotonic() - begin < 0.2
  done = []
  while runner.in_flight:
    done += runner.step()
  elapsed = time.monotonic() - begin
  runner.close()
  assert sorted(traj.info["episode"] for traj in done) == [0, 1]
  assert all(traj.outcome == 1.0 and traj.info["turns"] == 2 for traj in done)
  # 2 steps x 0.4 s each, the episodes side by side (one after the other: >= 1.6 s).
  assert 0.8 <= elapsed < 1.5, elapsed
