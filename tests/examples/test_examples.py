"""The examples/ run end to end without touching sao_jax: a custom environment installed
as its own package (entry point), a reward function over a verl-style Parquet file,
and a native tool-calling run, each a few `sao-train` steps on the tiny CPU model."""

import importlib
import itertools
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from sao_jax.envs import plugins, registry
from sao_jax.envs.base import play
from sao_jax.jobs import startup

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TINY = [
    "model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
    "model.num_attention_heads=4", "model.num_key_value_heads=2",
    "learner.batch_trajectories=8", "learner.critic_warmup_steps=1", "learner.steps=2",
    "run.eval_every=0", "sampler.slots=4", "sampler.max_new_tokens=16",
]


def _train(config, overrides):
  from sao_jax.jobs import train
  cfg = startup.load(config, TINY + overrides)
  summary = train.run(cfg, log=print)
  assert summary["steps_done"] == 2
  rows = [json.loads(line) for line in
          (pathlib.Path(cfg.run.run_dir) / "metrics.jsonl").read_text().splitlines()]
  return cfg, [row for row in rows if "reward/mean" in row]


@pytest.fixture
def installed_unit_conversion(tmp_path, monkeypatch):
  """examples/unit_conversion pip-installed (offline) into a directory on sys.path, as
  `pip install` puts it in site-packages: its entry point is then what names it."""
  target, source = tmp_path / "site", tmp_path / "unit_conversion"
  # A copy: pip builds in the source tree (build/, *.egg-info), which stays untouched.
  shutil.copytree(EXAMPLES / "unit_conversion", source,
                  ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
  subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                  "--no-build-isolation", "--no-index", "--target", str(target), str(source)],
                 check=True, cwd=tmp_path)
  monkeypatch.syspath_prepend(str(target))
  importlib.invalidate_caches()
  plugins.entry_points.cache_clear()
  registry.load_spec.cache_clear()
  yield target
  plugins.entry_points.cache_clear()
  registry.load_spec.cache_clear()
  for name in [m for m in sys.modules if m.startswith("unit_conversion")]:
    del sys.modules[name]


def test_the_unit_conversion_package_is_an_environment_by_its_entry_point(
    installed_unit_conversion):
  cfg = startup.load(EXAMPLES / "unit_conversion" / "config.py")
  assert cfg.env.name == "unit_conversion" and "unit_conversion" in registry.known_names()
  demo = registry.demonstration(cfg.env)
  tasks = registry.make_tasks(cfg.env)
  for _ in range(5):
    task = next(tasks)
    transcript = play(registry.make_env(cfg.env), task, demo(task))
    assert transcript.result.reward == 1.0 and transcript.messages[3]["role"] == "tool"
  with pytest.raises(ValueError, match="env.options.max_value=0 is invalid"):
    startup.load(EXAMPLES / "unit_conversion" / "config.py", ["env.options.max_value=0"])


@pytest.mark.slow
def test_the_unit_conversion_example_trains(installed_unit_conversion, tmp_path):
  _, rows = _train(EXAMPLES / "unit_conversion" / "config.py",
                   [f"run.run_dir={tmp_path / 'run'}", "run.sft_steps=4", "run.sft_batch=4"])
  assert [row["step"] for row in rows] == [0, 1]


@pytest.fixture
def verl_example(tmp_path, monkeypatch):
  sys.path.insert(0, str(EXAMPLES / "verl_reward"))
  try:
    make_data = importlib.import_module("make_data")
    path = make_data.write(tmp_path / "train.parquet", count=32)
    monkeypatch.syspath_prepend(str(EXAMPLES / "verl_reward"))
    yield path
  finally:
    sys.path.remove(str(EXAMPLES / "verl_reward"))
    for name in ("make_data", "arith_reward", "arith_verl"):
      sys.modules.pop(name, None)


def test_the_verl_reward_example_grades_rows_with_the_reward_function(verl_example):
  cfg = startup.load(EXAMPLES / "verl_reward" / "config.py",
                    [f"env.dataset.path={verl_example}"])
  env = registry.make_env(cfg.env)
  task = next(registry.make_tasks(cfg.env))
  assert task.metadata["source"] in ("arith/add", "arith/mul")
  result = play(env, task, [f"\\boxed{{{task.answer}}}"]).result
  assert (result.reward, result.info["boxed"], result.reason) == (1.0, 1.0, "reward_fn")
  result = play(registry.make_env(cfg.env), task, ["no idea"]).result
  assert (result.reward, result.info["boxed"]) == (0.0, 0.0)


def test_the_verl_reward_example_grades_with_a_function_in_verls_convention(verl_example):
  """`arith_verl.compute_score(data_source, solution_str, ground_truth, extra_info)`, as
  verl's scorers are written, grades the example's episodes through the real runner."""
  from sao_jax.chat import chat_format
  from sao_jax.models.tokenizer import train_tokenizer
  from sao_jax.sampler.episodes import EpisodeRunner, run_to_completion
  from sao_jax.sampler.scripted import ScriptedEngine
  cfg = startup.load(EXAMPLES / "verl_reward" / "config.py",
                    [f"env.dataset.path={verl_example}", "env.reward_fn=arith_verl:compute_score"])
  tasks = list(itertools.islice(registry.make_tasks(cfg.env), 16))
  reply = f"\\boxed{{{tasks[0].answer}}}"  # right for the first task (and its equals)
  chat = chat_format(None, train_tokenizer([reply] * 4, vocab_size=300))
  runner = EpisodeRunner(ScriptedEngine(chat, lambda episode, turn: reply), chat,
                         lambda: registry.make_env(cfg.env), max_episodes=4,
                         step_timeout_s=cfg.env.step_timeout_s, log=print,
                         env_name=registry.describe(cfg.env))
  done = run_to_completion(runner, iter(tasks), len(tasks), num_slots=4, seed=0)
  assert not runner.failures and {traj.info["end"] for traj in done} == {"reward_fn"}
  answers = {task.id: task.answer for task in tasks}
  assert [traj.outcome for traj in done] == [
      float(answers[traj.info["task"]] == tasks[0].answer) for traj in done]
  assert any(traj.outcome == 1.0 for traj in done) and any(traj.outcome == 0 for traj in done)
  metrics = done[0].info["metrics"]
  assert metrics["boxed"] == 1.0 and metrics["row"] >= 0 and "source" not in metrics


def _native_tools_tokenizer(tmp_path):
  """The tiny Qwen3 tokenizer examples/native_tools/make_tokenizer.py writes, under tmp_path."""
  sys.path.insert(0, str(EXAMPLES / "native_tools"))
  try:
    return importlib.import_module("make_tokenizer").write(tmp_path / "tokenizer")
  finally:
    sys.path.remove(str(EXAMPLES / "native_tools"))
    sys.modules.pop("make_tokenizer", None)


@pytest.mark.slow
def test_the_verl_reward_example_trains_with_per_source_metrics(verl_example, tmp_path):
  tokenizer = _native_tools_tokenizer(tmp_path)
  _, rows = _train(EXAMPLES / "verl_reward" / "config.py",
                   [f"env.dataset.path={verl_example}", f"run.run_dir={tmp_path / 'run'}",
                    f"run.tokenizer={tokenizer}"])
  assert any("reward/source/arith/add" in row for row in rows)
  assert any("episodes/metric/reply_words" in row for row in rows)


@pytest.mark.slow
def test_the_native_tools_example_trains(tmp_path):
  tokenizer = _native_tools_tokenizer(tmp_path)
  cfg, rows = _train(EXAMPLES / "native_tools" / "config.py",
                     [f"run.run_dir={tmp_path / 'run'}", f"run.tokenizer={tokenizer}"])
  from sao_jax.chat import load_chat
  assert load_chat(cfg.run.tokenizer).tool_format == "hermes"
  assert [row["step"] for row in rows] == [0, 1]


@pytest.fixture
def openai_agent_example(tmp_path, monkeypatch):
  """examples/openai_agent with its grader importable and the tiny Qwen3 tokenizer."""
  tokenizer = _native_tools_tokenizer(tmp_path)
  monkeypatch.syspath_prepend(str(EXAMPLES / "openai_agent"))
  monkeypatch.setenv("PYTHONPATH", str(EXAMPLES / "openai_agent"))
  yield tokenizer
  sys.modules.pop("reward", None)


@pytest.mark.slow
def test_the_openai_agent_example_trains(openai_agent_example, tmp_path):
  """sao-train with an unmodified openai-client program (a command) as its environment."""
  _, rows = _train(EXAMPLES / "openai_agent" / "config.py",
                   [f"run.run_dir={tmp_path / 'run'}", f"run.tokenizer={openai_agent_example}"])
  assert [row["step"] for row in rows] == [0, 1]
  assert all(row.get("dropped/env_failure", 0) == 0 for row in rows), rows
