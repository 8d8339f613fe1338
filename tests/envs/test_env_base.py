"""The environment protocol: results, turn budget, observation cap, failures."""

import pytest

from sao_jax.envs.base import Environment, StepResult, Task, play

TASK = Task(id="t0", prompt="say stop", answer="stop")


class EchoEnv(Environment):
  """Echoes actions; "stop" ends with reward 1, "crash" is an environment failure."""

  def _reset(self, task):
    return [{"role": "user", "content": task.prompt}]

  def _step(self, action):
    if action == "stop":
      return StepResult.finish(1.0, "answer")
    if action == "crash":
      return StepResult.fail("harness crashed")
    return StepResult.next(action)


def test_episode_runs_until_done():
  env = EchoEnv(max_turns=5, max_observation_chars=100)
  assert env.reset(TASK) == [{"role": "user", "content": "say stop"}]
  first = env.step("hello")
  assert (first.done, first.observation) == (False, "hello")
  last = env.step("stop")
  assert (last.done, last.reward, last.failure, last.reason) == (True, 1.0, None, "answer")


def test_turn_budget_ends_with_reward_zero():
  env = EchoEnv(max_turns=3, max_observation_chars=100)
  env.reset(TASK)
  assert not env.step("a").done
  assert not env.step("b").done
  result = env.step("c")
  assert (result.done, result.reward, result.reason, result.failure) == (True, 0.0, "max_turns", None)
  assert result.info["turns"] == 3


def test_final_answer_on_last_turn_still_counts():
  env = EchoEnv(max_turns=2, max_observation_chars=100)
  env.reset(TASK)
  env.step("a")
  assert env.step("stop").reward == 1.0


def test_observation_is_capped_with_a_note():
  env = EchoEnv(max_turns=5, max_observation_chars=10)
  env.reset(TASK)
  result = env.step("x" * 25)
  assert result.observation.startswith("x" * 10 + "\n")
  assert "x" * 11 not in result.observation
  assert "showing 10 of 25 characters" in result.observation
  assert env.step("short").observation == "short"


def test_failure_is_not_reward_zero():
  env = EchoEnv(max_turns=5, max_observation_chars=100)
  env.reset(TASK)
  result = env.step("crash")
  assert result.done and result.failure == "harness crashed"
  assert result.reason == "env_failure"
  zero = StepResult.finish(0.0, "answer")
  assert zero.failure is None and result.failure is not None


@pytest.mark.parametrize("kwargs", [
    {},  # neither observation nor done
    {"observation": "x", "done": True},  # both
    {"done": False, "failure": "boom", "observation": "x"},  # failure must end the episode
    {"done": True, "failure": "boom", "reward": 1.0},  # failure carries no reward
])
def test_inconsistent_step_results_are_rejected(kwargs):
  with pytest.raises(ValueError):
    StepResult(**kwargs)


def test_step_needs_an_active_episode():
  env = EchoEnv(max_turns=2, max_observation_chars=100)
  with pytest.raises(RuntimeError, match="reset"):
    env.step("a")
  env.reset(TASK)
  env.step("stop")
  with pytest.raises(RuntimeError, match="reset"):
    env.step("a")


@pytest.mark.parametrize("max_turns, max_chars", [(0, 10), (2, 0), (True, 10), (2.0, 10)])
def test_limits_are_validated(max_turns, max_chars):
  with pytest.raises(ValueError, match="max_"):
    EchoEnv(max_turns=max_turns, max_observation_chars=max_chars)


def test_play_records_the_transcript():
  env = EchoEnv(max_turns=5, max_observation_chars=100)
  transcript = play(env, TASK, ["hi", "stop"])
  assert [m["role"] for m in transcript.messages] == ["user", "assistant", "user", "assistant"]
  assert transcript.result.reward == 1.0
  with pytest.raises(ValueError, match="did not finish"):
    play(env, TASK, ["hi"])
  with pytest.raises(ValueError, match="ended at action 1 of 2"):
    play(env, TASK, ["stop", "more"])
