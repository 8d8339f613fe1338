"""Environments and reward functions from outside sao_jax: import paths, entry points,
options, and the errors for each way they can be wrong."""

import importlib.metadata
import sys
import textwrap
import time

import pytest

from sao_jax.config import EnvConfig
from sao_jax.envs import contract, plugins, registry
from sao_jax.envs.base import play

PLUGIN = '''
import dataclasses
import itertools
from sao_jax.envs.base import Environment, EnvironmentSpec, StepResult, Task


@dataclasses.dataclass(frozen=True, kw_only=True)
class EchoOptions:
  word: str = "hi"
  times: int = 1
  weight: float = 1.0

  def validate(self):
    if self.times < 1:
      raise ValueError(f"env.options.times={self.times!r} is invalid: expected >= 1")


class EchoEnv(Environment):
  def __init__(self, options, **limits):
    super().__init__(**limits)
    self.options = options

  def _reset(self, task):
    return [{"role": "user", "content": task.prompt}]

  def _step(self, action):
    return StepResult.finish(self.options.weight * (action == self.task.answer), "answer")


def _tasks(options, config):
  for i in itertools.count():
    yield Task(id=f"echo-{i}", prompt=f"say {options.word}", answer=options.word * options.times)


SPEC = EnvironmentSpec(
    name="echo", options=EchoOptions, task_sources={"words": _tasks},
    make=lambda options, config: EchoEnv(options, max_turns=config.max_turns,
                                         max_observation_chars=config.max_observation_chars),
    demonstration=lambda task, options: [task.answer])


def factory():
  return SPEC


NOT_AN_ENV = 3


class Bare:
  make = None


def broken_factory():
  raise RuntimeError("no model file")


def reward(response, task, messages):
  assert messages[-1] == {"role": "assistant", "content": response}
  return {"score": float(response == task.answer) / 2, "length": len(response)}


def raises(response, task, messages):
  raise KeyError("ground_truth")


def hangs(response, task, messages):
  import time
  time.sleep(5)
  return 1.0


def nan(response, task, messages):
  return float("nan")


def text(response, task, messages):
  return "1"


def no_score(response, task, messages):
  return {"accuracy": 1.0}


def bad_metric(response, task, messages):
  return {"score": 1.0, "note": "fine"}


def plain(response, task, messages):
  return 0.25


NOT_CALLABLE = "reward"
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
  """A module `echo_plugin` on sys.path, as a user's installed package would be."""
  (tmp_path / "echo_plugin.py").write_text(PLUGIN)
  (tmp_path / "broken_plugin.py").write_text("import a_package_that_is_not_installed\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  registry.load_spec.cache_clear()
  yield "echo_plugin"
  registry.load_spec.cache_clear()
  for name in ("echo_plugin", "broken_plugin"):
    sys.modules.pop(name, None)


def test_an_environment_by_import_path_runs_with_its_options(plugin):
  config = EnvConfig(name=f"{plugin}:SPEC", options={"word": "ok", "times": 2, "weight": 2})
  registry.check(config)
  task = next(registry.make_tasks(config))
  assert (task.prompt, task.answer) == ("say ok", "okok")
  env = registry.make_env(config)
  assert env.options.weight == 2.0  # an int is taken for a float option
  assert play(env, task, registry.demonstration(config)(task)).result.reward == 2.0
  assert registry.resolve(config).task_source == "words"
  # A factory of no arguments works the same.
  assert registry.load_spec(f"{plugin}:factory").name == "echo"


def test_an_installed_entry_point_names_an_environment(plugin, monkeypatch):
  point = importlib.metadata.EntryPoint("echo", f"{plugin}:SPEC", registry.ENTRY_POINT_GROUP)
  monkeypatch.setattr(importlib.metadata, "entry_points",
                      lambda group: [point] if group == registry.ENTRY_POINT_GROUP else [])
  plugins.entry_points.cache_clear()
  try:
    assert "echo" in registry.known_names()
    assert next(registry.make_tasks(EnvConfig(name="echo"))).answer == "hi"
    clash = importlib.metadata.EntryPoint("sanity", f"{plugin}:SPEC", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [point, clash])
    plugins.entry_points.cache_clear()
    registry.load_spec.cache_clear()
    with pytest.raises(ValueError, match="'sanity' is a built-in environment, and an installed "
                                         "package registers 'echo_plugin:SPEC'"):
      registry.check(EnvConfig(name="sanity"))
  finally:
    plugins.entry_points.cache_clear()


@pytest.mark.parametrize("name, error", [
    ("broken_plugin:SPEC", r"env.name='broken_plugin:SPEC': importing module 'broken_plugin' "
                           r"failed with ModuleNotFoundError: No module named "
                           r"'a_package_that_is_not_installed'"),
    ("echo_plugin:MISSING", r"module 'echo_plugin' has no attribute 'MISSING'"),
    ("echo_plugin:NOT_AN_ENV", r"echo_plugin:NOT_AN_ENV is a int, not an environment"),
    ("echo_plugin:Bare", r"it has no name, options, task_sources"),
    ("echo_plugin:EchoEnv", r"is an Environment class, not an environment spec"),
    ("echo_plugin:broken_factory", r"the factory echo_plugin:broken_factory raised "
                                   r"RuntimeError: no model file"),
    ("echo_plugin", r"env.name='echo_plugin' is invalid: known environments are"),
    ("echo_plugin:SPEC:x", r"or name one by import path, 'package.module:attribute'"),
])
def test_a_bad_environment_is_refused_at_startup(plugin, name, error):
  with pytest.raises(ValueError, match=error):
    registry.check(EnvConfig(name=name))


@pytest.mark.parametrize("options, error", [
    ({"wrod": "x"}, r"env.options.wrod is not an option of environment 'echo'; its options "
                    r"are 'word', 'times', 'weight'"),
    ({"times": "2"}, r"env.options.times='2' is invalid for environment 'echo': expected int"),
    ({"times": 2.0}, r"env.options.times=2.0 is invalid for environment 'echo': expected int"),
    ({"weight": True}, r"env.options.weight=True is invalid .* expected float"),
    ({"weight": float("inf")}, r"expected float \(a finite number\)"),
    ({"times": 0}, r"environment 'echo': env.options.times=0 is invalid: expected >= 1"),
])
def test_bad_options_name_the_environment_and_the_field(plugin, options, error):
  with pytest.raises(ValueError, match=error):
    registry.check(EnvConfig(name="echo_plugin:SPEC", options=options))


def _graded(plugin, fn, action, **changes):
  config = EnvConfig(name=f"{plugin}:SPEC", reward_fn=f"{plugin}:{fn}", **changes)
  env = registry.make_env(config)
  task = next(registry.make_tasks(config))
  return play(env, task, [action]).result


def test_a_reward_function_replaces_the_reward_and_logs_its_metrics(plugin):
  result = _graded(plugin, "reward", "hi")
  assert (result.reward, result.failure, result.reason) == (0.5, None, "reward_fn")
  assert result.info["length"] == 2 and result.info["env_reward"] == 1.0
  assert _graded(plugin, "plain", "no").reward == 0.25


@pytest.mark.parametrize("fn, error", [
    ("raises", r"reward function echo_plugin:raises raised KeyError: 'ground_truth'"),
    ("hangs", r"reward function echo_plugin:hangs did not return within "
              r"env.reward_timeout_s=0.2s"),
    ("no_score", r"returned a mapping without 'score'"),
    ("bad_metric", r"returned \{'note': 'fine'\}: every value of its mapping must be a finite"),
])
def test_a_failing_reward_function_fails_the_episode_not_the_caller(plugin, fn, error):
  start = time.monotonic()
  result = _graded(plugin, fn, "hi", reward_timeout_s=0.2)
  assert time.monotonic() - start < 3
  assert result.done and result.reason == "env_failure" and result.reward == 0.0
  assert result.failure is not None
  assert __import__("re").search(error, result.failure), result.failure


@pytest.mark.parametrize("fn, shown", [("nan", "reward=nan (float)"),
                                       ("text", "reward='1' (str)")])
def test_a_reward_functions_score_reaches_the_one_check_unconverted(plugin, fn, shown):
  """`grade` converts nothing: a score that is not a finite real number reaches the check
  every step result passes (envs.contract), which fails the episode as bad_reward (through
  the sampler's runner: tests/sampler/test_env_values.py)."""
  bad = contract.check_result(_graded(plugin, fn, "hi"))
  assert bad.kind == "bad_reward" and bad.problem.startswith(shown), bad


@pytest.mark.parametrize("fn, error", [
    ("NOT_CALLABLE", r"env.reward_fn='echo_plugin:NOT_CALLABLE' names a str, which is not "
                     r"callable"),
    ("missing", r"module 'echo_plugin' has no attribute 'missing'"),
])
def test_a_reward_function_that_cannot_be_called_is_refused_at_startup(plugin, fn, error):
  with pytest.raises(ValueError, match=error):
    registry.check(EnvConfig(name=f"{plugin}:SPEC", reward_fn=f"{plugin}:{fn}"))


def test_the_reward_function_sees_the_whole_conversation(plugin, tmp_path):
  (tmp_path / "seen_plugin.py").write_text(textwrap.dedent('''
      SEEN = []
      def reward(response, task, messages):
        SEEN.append((response, task.id, list(messages)))
        messages.clear()  # a copy: the environment's conversation is unaffected
        return 1
      '''))
  try:
    result = _graded(plugin, "reward", "x")  # warm the module cache of echo_plugin
    assert result.reward == 0.0
    config = EnvConfig(name=f"{plugin}:SPEC", reward_fn="seen_plugin:reward")
    env = registry.make_env(config)
    task = next(registry.make_tasks(config))
    assert play(env, task, ["hey"]).result.reward == 1.0
    seen = sys.modules["seen_plugin"].SEEN
    assert seen == [("hey", "echo-0", [{"role": "user", "content": "say hi"},
                                        {"role": "assistant", "content": "hey"}])]
  finally:
    sys.modules.pop("seen_plugin", None)
