"""What an environment returns is checked where it enters a trajectory (`envs.contract`):
a plugin's reward of the wrong type, an observation that is not text, a result that is
not a `StepResult` fail that episode as `bad_<field>`, naming the environment and the
value, through the real `EpisodeRunner`; the runner goes on and later episodes are
trained as before. Nothing is converted."""

import re
import sys

import pytest

from sao_jax.channel.transport import QueueTransport
from sao_jax.chat import chat_format
from sao_jax.config import EnvConfig
from sao_jax.config.checks import MAX_TIMEOUT_S
from sao_jax.data import pipeline
from sao_jax.envs import registry
from sao_jax.envs.base import StepResult, Task
from sao_jax.envs.contract import SHOWN_CHARS, check_result
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.sampler.episodes import EpisodeRunner, run_to_completion
from sao_jax.sampler.scripted import ScriptedEngine

TOKENIZER = train_tokenizer(["hello go"] * 4, vocab_size=300)
CHAT = chat_format(None, TOKENIZER)

PLUGIN = '''
import sys

import numpy as np

from sao_jax.envs.base import Environment, EnvironmentSpec, StepResult



class RefusingFloat(float):  # a Real whose float() raises what float() does not
  def __float__(self):
    raise RuntimeError("no float")


# What a task's step returns: its answer names one of these.
RESULTS = {
    "good": lambda: StepResult.finish(1.0, "answer"),
    "numpy": lambda: StepResult.finish(np.float32(0.5), "answer", hits=np.int64(2)),
    "int": lambda: StepResult.finish(1, "answer"),
    "text": lambda: StepResult(done=True, reward="abc"),
    "list": lambda: StepResult(done=True, reward=[1.0]),
    "none": lambda: StepResult(done=True, reward=None),
    "numeric_text": lambda: StepResult(done=True, reward="0.9"),
    "finish_text": lambda: StepResult.finish("1.0", "answer"),
    "huge": lambda: StepResult(done=True, reward=10**400),
    "float32_huge": lambda: StepResult.finish(1e39, "answer"),
    "refusing_float": lambda: StepResult.finish(RefusingFloat(0.5), "answer"),
    "bool": lambda: StepResult.finish(True, "answer"),
    "nan": lambda: StepResult.finish(float("nan"), "answer"),
    "array": lambda: StepResult.finish(np.ones(3), "answer"),
    "observation": lambda: StepResult(observation=b"bytes"),
    "done": lambda: StepResult(done="yes"),
    "info": lambda: StepResult(done=True, reward=1.0, info=["x"]),
    "huge_metric": lambda: StepResult.finish(1.0, "answer", big=10**400),
    "refusing_metric": lambda: StepResult.finish(1.0, "answer", m=RefusingFloat(0.5)),
    "dict": lambda: {"reward": 1.0},
    "exit": lambda: sys.exit(3),
}


class ValueEnv(Environment):
  def _reset(self, task):
    if task.answer == "exit_in_reset":
      sys.exit(4)
    return [{"role": "user", "content": task.prompt}]

  def close(self):
    if self.task is not None and self.task.answer == "exit_in_close":
      sys.exit(5)

  def _step(self, action):
    return RESULTS.get(self.task.answer, RESULTS["good"])()


SPEC = EnvironmentSpec(
    name="values", task_sources={"good": lambda options, config: iter(())},
    make=lambda options, config: ValueEnv(max_turns=config.max_turns,
                                          max_observation_chars=config.max_observation_chars))


def score_of(response, task, messages):
  return {"score_text": "0.9", "score_bool": True, "score_nan": float("nan"),
          "score_ok": 0.25}[task.answer]
'''
NAME = "values_plugin:SPEC"


@pytest.fixture
def plugin(tmp_path, monkeypatch):
  """The plugin module `values_plugin` on sys.path, as a user's package would be."""
  (tmp_path / "values_plugin.py").write_text(PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  registry.load_spec.cache_clear()
  yield
  registry.load_spec.cache_clear()
  sys.modules.pop("values_plugin", None)


def run(config: EnvConfig, answers: list[str]):
  """Episodes of `config`'s environment through the real runner (a scripted engine),
  in task order, as a sampler process builds it; (trajectories, runner, log lines)."""
  logs = []
  runner = EpisodeRunner(ScriptedEngine(CHAT, lambda episode, turn: "hello"), CHAT,
                         lambda: registry.make_env(config), max_episodes=2,
                         step_timeout_s=config.step_timeout_s, log=logs.append,
                         env_name=registry.describe(config))
  tasks = iter([Task(id=f"t{i}", prompt="go", answer=answer) for i, answer in enumerate(answers)])
  done = run_to_completion(runner, tasks, len(answers), num_slots=8, seed=0)
  return sorted(done, key=lambda traj: traj.info["task"]), runner, logs


@pytest.mark.parametrize("answer, kind, shown", [
    ("text", "bad_reward", "reward='abc' (str)"),  # raised ValueError out of the runner
    ("list", "bad_reward", "reward=[1.0] (list)"),  # the same
    ("none", "bad_reward", "reward=None (NoneType)"),  # trained as 0.0
    ("numeric_text", "bad_reward", "reward='0.9' (str)"),  # trained as 0.9
    ("finish_text", "bad_reward", "reward='1.0' (str)"),  # finish() made it 1.0
    ("huge", "bad_reward", "reward=1000000000"),  # OverflowError
    ("float32_huge", "bad_reward", "reward=1e+39 (float)"),  # trained as inf: batch skipped
    ("refusing_float", "bad_reward", "reward=0.5 (RefusingFloat)"),  # RuntimeError: sampler died
    ("bool", "bad_reward", "reward=True (bool)"),  # trained as 1.0
    ("nan", "bad_reward", "reward=nan (float)"),
    ("array", "bad_reward", "reward=array([1., 1., 1.]) (ndarray)"),
    ("observation", "bad_observation", "observation=b'bytes' (bytes)"),
    ("done", "bad_done", "done='yes' (str)"),
    ("info", "bad_info", "info=['x'] (list)"),
    ("dict", "bad_result", "{'reward': 1.0} (dict): expected a sao_jax.envs.base.StepResult"),
])
def test_a_bad_value_fails_its_episode_naming_the_environment_and_the_value(
    plugin, answer, kind, shown):
  done, runner, logs = run(EnvConfig(name=NAME), ["good", answer, "good", "numpy", "int"])
  bad = done[1]
  assert bad.info["failure_kind"] == kind and bad.info["end"] == "env_failure"
  assert bad.env_failure.startswith(f"environment '{NAME}' returned {shown}"), bad.env_failure
  assert float(bad.rewards.sum()) == 0.0
  # The runner goes on: the episodes before and after are trained as before.
  assert [traj.env_failure for traj in done[:1] + done[2:]] == [None] * 4
  assert [traj.outcome for traj in done[:1] + done[2:]] == [1.0, 1.0, 0.5, 1.0]
  assert done[3].info["metrics"] == {"hits": 2.0}  # numpy numbers are numbers
  assert runner.failures == {kind: 1}
  [line] = logs  # said once, with the value, escaped
  assert f"dropped/env_failure/{kind}" in line and NAME in line and "\n" not in line
  # The learner drops and counts it under its kind.
  transport = QueueTransport(capacity=len(done))
  for traj in done:
    transport.put(traj)
  transport.close()
  drops = pipeline.Drops()
  batches = list(pipeline.learner_pipeline(
      transport, batch_size=4, group_size=1, max_lag=4, buckets=(64,), pad_id=0,
      vocab_size=TOKENIZER.get_vocab_size(), current_version=lambda: 0, drops=drops))
  assert [info.lengths.size for _, info in batches] == [4]
  assert drops == {"env_failure": 1, f"env_failure/{kind}": 1}


def test_a_result_that_is_not_a_step_result_is_refused_under_a_reward_function(plugin):
  # The grading wrapper read result.done of whatever the environment returned.
  config = EnvConfig(name=NAME, reward_fn="values_plugin:score_of")
  done, runner, _ = run(config, ["dict"])
  assert done[0].info["failure_kind"] == "bad_result" and runner.failures == {"bad_result": 1}
  assert done[0].env_failure.startswith(f"environment '{NAME}' graded by env.reward_fn=")


def test_a_huge_value_is_shown_bounded():
  bad = check_result(StepResult(done=True, reward=10**400))
  assert bad.kind == "bad_reward" and len(bad.problem) < SHOWN_CHARS + 300
  assert check_result(StepResult(done=True, reward="x" * 10**6)).problem.count("x") <= SHOWN_CHARS


@pytest.mark.parametrize("answer", ["huge_metric", "refusing_metric"])
def test_a_metric_that_is_no_float_is_not_a_metric(plugin, answer):
  # math.isfinite(10**400) raised OverflowError in the runner, outside the episode's catch;
  # so did a Real whose float() raises RuntimeError.
  done, runner, _ = run(EnvConfig(name=NAME), [answer, "good"])
  assert [traj.outcome for traj in done] == [1.0, 1.0] and not runner.failures
  assert "metrics" not in done[0].info


def test_sys_exit_in_a_plugins_step_fails_its_episode(plugin):
  done, runner, logs = run(EnvConfig(name=NAME), ["good", "exit", "good"])
  assert done[1].info["failure_kind"] == "SystemExit"
  assert done[1].env_failure == "step raised SystemExit: 3"
  assert [traj.outcome for traj in (done[0], done[2])] == [1.0, 1.0]
  assert runner.failures == {"SystemExit": 1} and "sys.exit(3)" in logs[0]


def test_sys_exit_in_a_plugins_reset_or_close_is_that_episodes(plugin):
  # On the runner's thread: reset's SystemExit ended the sampler; close's fails nothing
  # (the episode's outcome stands; it is logged).
  done, runner, logs = run(EnvConfig(name=NAME), ["exit_in_reset", "exit_in_close", "good"])
  assert done[0].info["failure_kind"] == "SystemExit" and done[0].length == 0
  assert done[0].env_failure == "reset raised SystemExit: 4"
  assert [traj.outcome for traj in done[1:]] == [1.0, 1.0]
  assert runner.failures == {"SystemExit": 1}
  assert any("closing the environment of task 't1' failed with SystemExit" in line
             for line in logs)


@pytest.mark.parametrize("answer, shown", [
    ("score_text", "reward='0.9' (str)"),
    ("score_bool", "reward=True (bool)"),
    ("score_nan", "reward=nan (float)"),
])
def test_a_reward_functions_bad_score_is_refused_at_the_same_check(plugin, answer, shown):
  """A reward function's score reaches the same check (`grade` passes it on as
  returned): its failure names the environment, the function and the value. Both
  timeouts at their largest allowed value, which the runtime's waits take."""
  config = EnvConfig(name=NAME, reward_fn="values_plugin:score_of",
                     step_timeout_s=MAX_TIMEOUT_S, reward_timeout_s=MAX_TIMEOUT_S)
  done, runner, _ = run(config, ["score_ok", answer, "score_ok"])
  assert re.fullmatch(rf"environment '{NAME}' graded by "
                      rf"env.reward_fn='values_plugin:score_of' returned {re.escape(shown)}: .*",
                      done[1].env_failure), done[1].env_failure
  assert done[1].info["failure_kind"] == "bad_reward"
  assert [traj.outcome for traj in (done[0], done[2])] == [0.25, 0.25]
  assert runner.failures == {"bad_reward": 1}
