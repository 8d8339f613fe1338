"""Environments whose reset waits on the outside (`Environment.slow_reset`, an agent
program's first call) reset on the step threads: decoding goes on meanwhile, with
overlap on or off, and a reset that raises fails only its episode, token-less."""

import threading
import time

import pytest

from sao_jax.chat import chat_format
from sao_jax.envs.base import Environment, StepResult, Task
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.sampler import scripted
from sao_jax.sampler.episodes import EpisodeRunner

CHAT = chat_format(None, train_tokenizer(["seen it", "task 0 1"] * 5, vocab_size=300))


class WaitingEnv(Environment):
  """Resets only once `gate` is set (slow ones); task "bad" raises in reset."""

  slow_reset = True
  gate = threading.Event()

  def __init__(self):
    super().__init__(max_turns=2, max_observation_chars=100)

  def _reset(self, task):
    if task.id == "bad":
      raise ConnectionError("the program never called")
    if task.id.startswith("slow"):
      assert WaitingEnv.gate.wait(10)
    return [{"role": "user", "content": task.prompt}]

  def _step(self, action):
    return StepResult.finish(1.0, "answer")


def runner_of(overlap):
  engine = scripted.ScriptedEngine(CHAT, lambda episode, turn: "seen")
  return EpisodeRunner(engine, CHAT, WaitingEnv, max_episodes=3, env_threads=3,
                       overlap=overlap, log=lambda text: None)


def test_a_slow_reset_never_stalls_the_runner():
  WaitingEnv.gate.clear()
  runner = runner_of(overlap=True)
  begin = time.monotonic()
  for name in ("slow", "fast", "bad"):
    runner.start(Task(id=name, prompt="task 0", answer=""), prompt_id=0, seed=0)
  assert time.monotonic() - begin < 1.0  # start returned while "slow" still waits
  done = {}
  while len(done) < 2:  # "fast" finishes, "bad" fails, while "slow" is still resetting
    done.update((t.info["task"], t) for t in runner.step())
  assert done["fast"].outcome == 1.0 and done["fast"].info["turns"] == 1
  assert done["bad"].info["failure_kind"] == "ConnectionError" and done["bad"].length == 0
  assert runner.failures["ConnectionError"] == 1 and runner.in_flight == 1
  WaitingEnv.gate.set()
  while "slow" not in done:
    done.update((t.info["task"], t) for t in runner.step())
  assert done["slow"].outcome == 1.0
  runner.close()


def test_without_overlap_slow_resets_are_applied_too():
  """overlap=False waits for every environment step, slow resets included, and submits
  their prompts (their outcomes belong to no turn of the engine's step)."""
  WaitingEnv.gate.set()
  runner = runner_of(overlap=False)
  for name in ("slow", "fast", "bad"):
    runner.start(Task(id=name, prompt="task 0", answer=""), prompt_id=0, seed=0)
  done = {}
  for _ in range(4):
    done.update((t.info["task"], t) for t in runner.step())
  assert {name: t.outcome for name, t in done.items()} == {"slow": 1.0, "fast": 1.0, "bad": 0.0}
  assert done["bad"].info["failure_kind"] == "ConnectionError" and runner.in_flight == 0
  runner.close()


class MeetingEnv(Environment):
  """Agent-like: each reset waits until `meeting.parties` resets wait at once (programs
  that are all working), failing after 10 s."""

  slow_reset = True
  meeting = threading.Barrier(3)

  def __init__(self):
    super().__init__(max_turns=2, max_observation_chars=100)

  def _reset(self, task):
    MeetingEnv.meeting.wait(10)
    return [{"role": "user", "content": task.prompt}]

  def _step(self, action):
    return StepResult.finish(1.0, "answer")


def test_episodes_that_wait_on_the_outside_each_get_a_step_thread():
  """sampler.env_threads=1 (or one per core) would hold two of three waiting programs
  behind the first: the runner sizes the pool to the episodes in flight by itself."""
  MeetingEnv.meeting.reset()
  engine = scripted.ScriptedEngine(CHAT, lambda episode, turn: "seen")
  runner = EpisodeRunner(engine, CHAT, MeetingEnv, max_episodes=3, env_threads=1,
                         log=lambda text: None)
  assert runner.env_steps.workers == 1  # nothing started yet: the configured pool
  for k in range(3):
    assert runner.can_start(1)  # no reset waits for a thread
    runner.start(Task(id=f"program {k}", prompt="task 0", answer=""), prompt_id=0, seed=k)
  assert runner.env_steps.workers == 3 and runner.env_steps.backlog == 0
  done = []
  while len(done) < 3:
    done += runner.step()
  assert sorted(t.outcome for t in done) == [1.0] * 3 and not runner.failures
  runner.close()
