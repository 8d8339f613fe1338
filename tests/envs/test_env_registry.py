"""Building environments and task sources from EnvConfig by name."""

import dataclasses
import json

import pytest

from sao_jax import config as env_config
from sao_jax.envs import registry
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.math import tasks as math_tasks
from sao_jax.envs.math import tool as math_tool
from sao_jax.envs.style import env as style
from sao_jax.config import EnvConfig
from sao_jax.config.env import SandboxLimits


def test_every_configurable_environment_and_task_source_has_a_builder():
  assert set(env_config.ENV_TASK_SOURCES) == set(registry.ENVIRONMENTS) == set(registry.TASK_SOURCES)
  for name, sources in env_config.ENV_TASK_SOURCES.items():
    assert set(sources) == set(registry.TASK_SOURCES[name])


def test_make_math_env_and_tasks():
  config = EnvConfig(max_turns=3, tool=SandboxLimits(cpu_time_s=2), difficulty=1)
  env = registry.make_env(config)
  assert isinstance(env, math_tool.MathToolEnv)
  assert env.max_turns == 3 and env.sandbox_limits.cpu_time_s == 2
  task = next(registry.make_tasks(config))
  assert task == math_tasks.generate_task(0, seed=0, difficulty=1, kind="mixed")


def test_make_style_env_and_tasks():
  config = EnvConfig(name="style", style_schedule=((0, "cute"),))
  assert config.resolved_task_source == "builtin"
  env = registry.make_env(config)
  assert isinstance(env, style.StyleEnv) and env.style == "cute"
  assert next(registry.make_tasks(config)) == style.builtin_task(0)
  http = registry.make_env(dataclasses.replace(
      config, judge="http", judge_base_url="http://127.0.0.1:1/v1", judge_model="m"))
  assert http.judge.url == "http://127.0.0.1:1/v1/chat/completions"


def test_jsonl_source(tmp_path):
  path = tmp_path / "t.jsonl"
  path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                          for i in range(3)))
  stream = registry.make_tasks(EnvConfig(task_source="jsonl", jsonl_path=str(path)))
  assert sorted(next(stream).answer for _ in range(3)) == ["0", "1", "2"]


def test_make_coding_env_and_tasks(tmp_path):
  config = EnvConfig(name="coding", max_turns=40, tool=SandboxLimits(cpu_time_s=2), difficulty=3,
                     coding_bug_kind="off_by_one", coding_partial_reward=True)
  env = registry.make_env(config)
  assert isinstance(env, coding.CodingEnv)
  assert (env.max_turns, env.sandbox_limits.cpu_time_s, env.partial_reward) == (40, 2, True)
  assert next(registry.make_tasks(config)) == coding_generator.generate_task(
      0, seed=0, difficulty=3, kind="off_by_one")
  for name in ("a", "b"):
    for rel, text in {"task.json": json.dumps({"problem": name}), "repo/m.py": "",
                      "tests_visible/test_m.py": "",
                      "tests_hidden/test_m.py": "import m\nassert m.f(1) == 1\n"}.items():
      (tmp_path / "tasks" / name / rel).parent.mkdir(parents=True, exist_ok=True)
      (tmp_path / "tasks" / name / rel).write_text(text)
  stream = registry.make_tasks(dataclasses.replace(
      config, task_source="dir", coding_task_dir=str(tmp_path / "tasks")))
  assert sorted(next(stream).id for _ in range(2)) == ["a", "b"]
  (tmp_path / "tasks.jsonl").write_text(json.dumps({"path": "tasks/b"}) + "\n")
  stream = registry.make_tasks(dataclasses.replace(
      config, task_source="jsonl", jsonl_path=str(tmp_path / "tasks.jsonl")))
  assert next(stream).prompt == "b"


def test_unknown_names_list_the_known_ones():
  with pytest.raises(ValueError, match="env.name='chess' is invalid: known environments are 'math_tool', 'style'"):
    registry.make_env(EnvConfig(name="chess"))
  with pytest.raises(ValueError, match="accepts 'generator', 'jsonl'"):
    registry.make_tasks(EnvConfig(task_source="builtin"))


@pytest.mark.parametrize("changes, field", [
    ({"name": "chess"}, "env.name='chess'"),
    ({"task_source": "web"}, "env.task_source='web'"),
    ({"task_source": "jsonl", "jsonl_path": "/nonexistent.jsonl"}, "env.jsonl_path"),
    ({"max_turns": 0}, "env.max_turns=0"),
    ({"max_observation_chars": -1}, "env.max_observation_chars=-1"),
    ({"difficulty": 9}, "env.difficulty=9"),
    ({"problem_kind": "essay"}, "env.problem_kind='essay'"),
    ({"demo_tool_rate": 1.5}, "env.demo_tool_rate=1.5"),
    ({"demo_guess_rate": -0.1}, "env.demo_guess_rate=-0.1"),
    ({"tool": SandboxLimits(wall_time_s=0)}, "env.tool.wall_time_s=0"),
    ({"tool": SandboxLimits(memory_mb=1.5)}, "env.tool.memory_mb=1.5"),
    ({"seed": "0"}, "env.seed='0'"),
    ({"style_schedule": ((10, "cute"),)}, "env.style_schedule"),
    ({"style_schedule": ((0, "cute"), (5, "pirate"))}, "unknown style 'pirate'"),
    ({"judge": "oracle"}, "env.judge='oracle'"),
    ({"judge": "http"}, "env.judge_base_url"),
    ({"judge": "http", "judge_base_url": "http://h/v1"}, "env.judge_model"),
    ({"judge_retries": -1}, "env.judge_retries=-1"),
    ({"judge_max_tokens": 0}, "env.judge_max_tokens=0"),
    ({"name": "coding", "task_source": "builtin"}, "env.task_source='builtin'"),
    ({"name": "coding", "task_source": "dir"}, "env.coding_task_dir=''"),
    ({"coding_bug_kind": "typo"}, "env.coding_bug_kind='typo'"),
    ({"coding_partial_reward": 1}, "env.coding_partial_reward=1"),
])
def test_validate_names_field_and_value(changes, field):
  with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
    EnvConfig(**changes).validate()


def test_default_configs_are_valid():
  EnvConfig().validate()
  EnvConfig(name="style").validate()
  EnvConfig(name="coding").validate()
