"""Building environments and task sources from EnvConfig by name."""

import dataclasses
import json

import pytest

from sao_jax.config import EnvConfig
from sao_jax.config import env as env_config
from sao_jax.config.env import SandboxLimits
from sao_jax.envs import registry
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.math import tasks as math_tasks
from sao_jax.envs.math import tool as math_tool
from sao_jax.envs.style import env as style


@pytest.mark.parametrize("name, sources", [
    ("math_tool", ["generator", "jsonl", "parquet", "hf_disk"]),
    ("style", ["builtin", "jsonl", "parquet", "hf_disk"]),
    ("coding", ["generator", "dir", "jsonl", "parquet", "hf_disk"]),
    ("sanity", ["generator", "jsonl", "parquet", "hf_disk"]),
    ("single_turn", ["jsonl", "parquet", "hf_disk"])])
def test_every_builtin_resolves_through_its_import_path(name, sources):
  """A built-in's name is an import path like a plugin's; its own task sources come
  first (the first is the default), then the shared ones."""
  spec = registry.load_spec(name)
  assert spec is registry.load_spec(registry.BUILTIN_ENVIRONMENTS[name])
  assert spec.name == name and list(registry.task_sources(spec)) == sources


def test_make_math_env_and_tasks():
  config = EnvConfig(max_turns=3, tool=SandboxLimits(cpu_time_s=2), options={"difficulty": 1})
  env = registry.make_env(config)
  assert isinstance(env, math_tool.MathToolEnv)
  assert env.max_turns == 3 and env.sandbox_limits.cpu_time_s == 2
  task = next(registry.make_tasks(config))
  assert task == math_tasks.generate_task(0, seed=0, difficulty=1, kind="mixed")


def test_make_style_env_and_tasks():
  config = EnvConfig(name="style", options={"schedule": ((0, "cute"),)})
  assert registry.resolve(config).task_source == "builtin"
  env = registry.make_env(config)
  assert isinstance(env, style.StyleEnv) and env.style == "cute"
  assert next(registry.make_tasks(config)) == style.builtin_task(0)
  http = registry.make_env(dataclasses.replace(config, options={
      "judge": "http", "judge_base_url": "http://127.0.0.1:1/v1", "judge_model": "m"}))
  assert http.judge.url == "http://127.0.0.1:1/v1/chat/completions"


def test_jsonl_source(tmp_path):
  path = tmp_path / "t.jsonl"
  path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                          for i in range(3)))
  stream = registry.make_tasks(EnvConfig(task_source="jsonl", jsonl_path=str(path)))
  assert sorted(next(stream).answer for _ in range(3)) == ["0", "1", "2"]


def test_make_coding_env_and_tasks(tmp_path):
  options = {"difficulty": 3, "bug_kind": "off_by_one", "partial_reward": True}
  config = EnvConfig(name="coding", max_turns=40, tool=SandboxLimits(cpu_time_s=2),
                     options=options)
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
      config, task_source="dir", options={**options, "task_dir": str(tmp_path / "tasks")}))
  assert sorted(next(stream).id for _ in range(2)) == ["a", "b"]
  (tmp_path / "tasks.jsonl").write_text(json.dumps({"path": "tasks/b"}) + "\n")
  stream = registry.make_tasks(dataclasses.replace(
      config, task_source="jsonl", jsonl_path=str(tmp_path / "tasks.jsonl")))
  assert next(stream).prompt == "b"


def test_unknown_names_list_the_known_ones():
  with pytest.raises(ValueError, match="env.name='chess' is invalid: known environments are "
                     "'math_tool', 'style', 'coding', 'sanity', 'single_turn'"):
    registry.make_env(EnvConfig(name="chess"))
  with pytest.raises(ValueError, match="accepts 'generator', 'jsonl'"):
    registry.make_tasks(EnvConfig(task_source="builtin"))


@pytest.mark.parametrize("changes, field", [
    ({"name": "chess"}, "env.name='chess'"),
    ({"task_source": "web"}, "env.task_source='web'"),
    ({"task_source": "jsonl", "jsonl_path": "/nonexistent.jsonl"}, "env.jsonl_path"),
    ({"max_turns": 0}, "env.max_turns=0"),
    ({"max_observation_chars": -1}, "env.max_observation_chars=-1"),
    ({"options": {"difficulty": 9}}, "environment 'math_tool': env.options.difficulty=9"),
    ({"options": {"difficulty": "9"}}, "env.options.difficulty='9' is invalid for environment "
                                       "'math_tool': expected int"),
    ({"options": {"problem_kind": "essay"}}, "env.options.problem_kind='essay'"),
    ({"options": {"demo_tool_rate": 1.5}}, "env.options.demo_tool_rate=1.5"),
    ({"options": {"demo_guess_rate": -0.1}}, "env.options.demo_guess_rate=-0.1"),
    ({"options": {"demo_guess_rate": float("nan")}}, "env.options.demo_guess_rate=nan"),
    ({"options": {"bug_kind": "typo"}}, "env.options.bug_kind is not an option of environment "
                                        "'math_tool'; its options are 'difficulty', "
                                        "'problem_kind', 'demo_tool_rate', 'demo_guess_rate'"),
    ({"tool": SandboxLimits(wall_time_s=0)}, "env.tool.wall_time_s=0"),
    ({"tool": SandboxLimits(memory_mb=1.5)}, "env.tool.memory_mb=1.5"),
    ({"seed": "0"}, "env.seed='0'"),
    ({"reward_timeout_s": 0}, "env.reward_timeout_s=0"),
    ({"name": "style", "options": {"schedule": ((10, "cute"),)}}, "env.options.schedule"),
    ({"name": "style", "options": {"schedule": ((0, "cute"), (5, "pirate"))}},
     "unknown style"),
    ({"name": "style", "options": {"judge": "oracle"}}, "env.options.judge='oracle'"),
    ({"name": "style", "options": {"judge": "http"}}, "env.options.judge_base_url"),
    ({"name": "style", "options": {"judge": "http", "judge_base_url": "http://h/v1"}},
     "env.options.judge_model"),
    ({"name": "style", "options": {"judge_retries": -1}}, "env.options.judge_retries=-1"),
    ({"name": "style", "options": {"judge_max_tokens": 0}}, "env.options.judge_max_tokens=0"),
    ({"name": "coding", "task_source": "builtin"}, "env.task_source='builtin'"),
    ({"name": "coding", "task_source": "dir"}, "env.options.task_dir=''"),
    ({"name": "coding", "options": {"partial_reward": 1}},
     "env.options.partial_reward=1 is invalid for environment 'coding': expected bool"),
    ({"name": "single_turn"}, "env.task_source='' is invalid: environment 'single_turn' has no "
                              "task generator"),
    # Deprecated spellings are checked as the option they became.
    ({"difficulty": 9}, "env.options.difficulty=9"),
    ({"name": "coding", "coding_bug_kind": "typo"}, "env.options.bug_kind='typo'"),
])
def test_validate_names_field_and_value(changes, field):
  with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
    registry.check(EnvConfig(**changes))


def test_the_config_checks_its_own_fields_and_the_registry_the_environment():
  """`EnvConfig.validate` imports no environment (config sits below envs); the
  environment's own checks run in `registry.check`, which every job runs at start-up."""
  config = EnvConfig(name="chess", options={"depth": 3})
  config.validate()
  with pytest.raises(ValueError, match="env.name='chess' is invalid: known environments are"):
    registry.check(config)
  with pytest.raises(ValueError, match="env.options.wrod is not an option of environment "
                                       "'math_tool'"):
    registry.check(EnvConfig(options={"wrod": 1}))


def test_options_left_from_another_environment_say_how_to_clear_them():
  """configs/from_hf.py sets math_tool's problem_kind; `--set env.name=single_turn` keeps
  it, and the error says how to drop it."""
  config = EnvConfig(name="single_turn", task_source="parquet",
                     options={"problem_kind": "arithmetic"})
  with pytest.raises(ValueError, match=r"env.options.problem_kind is not an option of environment "
                                       r"'single_turn'.*--set 'env.options=\{\}'"):
    registry.check(config)


def test_default_configs_are_valid():
  registry.check(EnvConfig())
  registry.check(EnvConfig(name="style"))
  registry.check(EnvConfig(name="coding"))
  registry.check(EnvConfig(name="sanity"))


def test_deprecated_fields_become_options_with_a_warning(caplog):
  registry._legacy_warning.cache_clear()
  config = EnvConfig(name="coding", difficulty=3, coding_bug_kind="off_by_one",
                     coding_partial_reward=True, style_schedule=((0, "cute"),))
  with caplog.at_level("WARNING"):
    resolved = registry.resolve(config)
  assert (resolved.options.difficulty, resolved.options.bug_kind,
          resolved.options.partial_reward) == (3, "off_by_one", True)
  assert "env.coding_bug_kind is deprecated: write env.options.bug_kind" in caplog.text
  # style_schedule belongs to another environment: ignored, as it always was.
  assert "style_schedule" not in caplog.text
  style_cfg = EnvConfig(name="style", style_schedule=((0, "cute"),), judge="rule")
  assert registry.make_env(style_cfg).style == "cute"
  with pytest.raises(ValueError, match=r"env.difficulty=3 \(deprecated\) and "
                                       r"env.options.difficulty=2 disagree"):
    registry.check(EnvConfig(difficulty=3, options={"difficulty": 2}))


def test_set_overrides_reach_env_options():
  from sao_jax.config import Config, apply_overrides
  cfg = apply_overrides(Config(), ["env.options.difficulty=3", "env.options.problem_kind=word"])
  assert cfg.env.options == {"difficulty": 3, "problem_kind": "word"}
  assert registry.resolve(cfg.env).options.problem_kind == "word"
  cfg = apply_overrides(cfg, ["env.options={'difficulty': 1}"])
  assert cfg.env.options == {"difficulty": 1}
  with pytest.raises(ValueError, match="expected a Python dict literal"):
    apply_overrides(cfg, ["env.options=3"])
  cfg = apply_overrides(Config(), ["env.difficulty=4"])  # the deprecated spelling still parses
  assert registry.resolve(cfg.env).options.difficulty == 4


def test_deprecated_fields_default_to_their_options_defaults():
  """A deprecated field counts as set when it differs from its default, so each
  default must be the option's (else an untouched field would override the option)."""
  defaults = {f.name: f.default for f in dataclasses.fields(EnvConfig)}
  seen = set()
  for name in registry.BUILTIN_ENVIRONMENTS:
    options = registry.load_spec(name).options
    option_defaults = {f.name: f.default for f in dataclasses.fields(options)}
    for old, new in env_config.LEGACY_OPTIONS.items():
      if new in option_defaults:
        assert defaults[old] == option_defaults[new], (name, old)
        seen.add(old)
  assert seen == set(env_config.LEGACY_OPTIONS)
