"""Held-out evaluation writes what the policy wrote (the first episodes as text) and
breaks accuracy down per data source."""

import dataclasses
import json
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sao_jax.chat import chat_format
from sao_jax.config import load_config
from sao_jax.envs.registry import make_tasks
from sao_jax.jobs import evaluate as evaluation
from sao_jax.run import bootstrap, metric_docs
from sao_jax.types import Trajectory

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The sanity environment (no sandbox) and a tiny random policy: fast, and its
# episodes end with rewards no test chooses.
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.head_dim=8",
        "model.num_attention_heads=4", "model.num_key_value_heads=2", "sampler.slots=4",
        "run.eval_episodes=6"]


def sanity(transcripts: int):
  return load_config(ROOT / "configs" / "sanity_cpu.py",
                     TINY + [f"run.eval_transcripts={transcripts}"])


@pytest.fixture(scope="module")
def chat_and_params():
  cfg = sanity(0)
  return chat_format(None, bootstrap.train_run_tokenizer(cfg, transcripts=50)), \
      bootstrap.initial_policy(cfg)


def evaluate(transcripts: int, path, chat_and_params) -> dict:
  chat, params = chat_and_params
  evaluator = evaluation.Evaluator(sanity(transcripts), chat, params)
  return evaluator.evaluate(params, 0, transcripts=path)


def test_the_first_episodes_in_task_order_are_written_whole(chat_and_params, tmp_path):
  cfg = sanity(4)
  path = tmp_path / evaluation.transcripts_path(cfg, 20).relative_to(cfg.run.run_dir)
  result = evaluate(4, path, chat_and_params)
  assert [p.name for p in path.parent.iterdir()] == ["episodes_step_20.jsonl"]  # no .partial
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  env_cfg = dataclasses.replace(cfg.env, seed=cfg.run.eval_seed)
  tasks = [task for task, _ in zip(make_tasks(env_cfg), range(4))]
  assert [row["task"] for row in rows] == [task.id for task in tasks]
  for row, task in zip(rows, tasks):
    assert task.prompt in row["text"] and row["text"].startswith("<|im_start|>")
    assert row["reward"] in (0.0, 1.0) and row["turns"] == 1 and row["env_failure"] is None
  # They are the episodes the metrics count: written whole, they give the accuracy.
  every = tmp_path / "every.jsonl"
  again = evaluate(cfg.run.eval_episodes, every, chat_and_params)
  rewards = [json.loads(line)["reward"] for line in every.read_text().splitlines()]
  assert again == result and len(rewards) == cfg.run.eval_episodes
  assert sum(rewards) / len(rewards) == result["eval/accuracy"]


def test_tool_call_rate_counts_episodes_that_ran_a_tool_not_extra_turns(chat_and_params,
                                                                        monkeypatch):
  chat, params = chat_and_params
  evaluator = evaluation.Evaluator(sanity(0), chat, params)
  empty = np.zeros(0, np.float32)
  trajs = [Trajectory(tokens=np.zeros(0, np.int32), action_mask=np.zeros(0, np.int8),
                      behavior_logp=empty, rewards=empty, prompt_id=i, policy_versions=(0, 0),
                      info={"task": f"t{i}", "turns": turns, "tool_calls": tools})
           for i, (turns, tools) in enumerate([(3, 0), (2, 0), (2, 1), (1, 0)])]
  monkeypatch.setattr(evaluator._episodes, "run", lambda *args, **kwargs: trajs)
  result = evaluator.evaluate(params, 0)
  assert result["eval/tool_call_rate"] == 0.25 and result["eval/mean_turns"] == 2.0


def test_no_path_or_zero_transcripts_writes_nothing(chat_and_params, tmp_path):
  evaluate(4, None, chat_and_params)
  evaluate(0, tmp_path / "none.jsonl", chat_and_params)
  assert list(tmp_path.iterdir()) == []


def test_sampled_evaluation_plays_each_task_n_times_at_the_eval_temperature(chat_and_params,
                                                                            monkeypatch):
  """run.eval_samples = n > 0: a second engine samples every held-out task n times at
  run.eval_temperature (no truncation) and eval/sampled_accuracy is their mean reward."""
  chat, params = chat_and_params
  cfg = load_config(ROOT / "configs" / "sanity_cpu.py",
                    TINY + ["run.eval_transcripts=0", "run.eval_samples=2",
                            "run.eval_temperature=0.7"])
  assert evaluation.Evaluator(sanity(0), chat, params)._sampled is None  # greedy only
  evaluator = evaluation.Evaluator(cfg, chat, params)
  settings = evaluation.sampled_settings(cfg)
  assert (settings.temperature, settings.top_k, settings.top_p) == (0.7, 0, 1.0)
  played = {}

  def fake_run(tasks, count, **kwargs):
    played["tasks"], played["count"] = [t.id for t in tasks], count
    return [Trajectory(tokens=np.zeros(1, np.int32), action_mask=np.ones(1, np.int8),
                       behavior_logp=np.zeros(1, np.float32),
                       rewards=np.array([float(i % 4 == 0)], np.float32), prompt_id=i,
                       policy_versions=(0, 0), info={"task": f"t{i}", "turns": 1,
                                                     "tool_calls": 0})
            for i in range(count)]

  monkeypatch.setattr(evaluator._sampled, "run", fake_run)
  result = evaluator.evaluate(params, 0)
  ids = played["tasks"]
  assert played["count"] == 2 * cfg.run.eval_episodes and ids[0::2] == ids[1::2]
  assert result["eval/sampled_accuracy"] == 0.25  # 3 of 12 sampled episodes earned 1
  assert 0.0 <= result["eval/accuracy"] <= 1.0


# Rows of three data sources (one with a slash, as verl's "arith/add"); the reward
# function pays each row's `answer`, whatever the policy writes, so each source's
# accuracy is known by hand: a = 2/3, arith/add = 1/4, c = 0.
SOURCE_ROWS = [("a", 1), ("arith/add", 0), ("a", 0), ("c", 0), ("arith/add", 1), ("a", 1),
               ("arith/add", 0), ("arith/add", 0)]


def test_each_data_source_gets_its_own_accuracy(chat_and_params, tmp_path, monkeypatch):
  pq.write_table(pa.table({
      "id": [f"row{i}" for i in range(len(SOURCE_ROWS))],
      "problem": [f"Question {i}?" for i in range(len(SOURCE_ROWS))],
      "answer": [str(answer) for _, answer in SOURCE_ROWS],
      "data_source": [source for source, _ in SOURCE_ROWS]}), tmp_path / "rows.parquet")
  (tmp_path / "pay_the_answer.py").write_text(
      "def score(response, task, messages):\n  return float(task.answer)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  cfg = load_config(ROOT / "configs" / "sanity_cpu.py", TINY + [
      f"run.eval_episodes={len(SOURCE_ROWS)}", f"run.eval_transcripts={len(SOURCE_ROWS)}",
      "env.name=single_turn", "env.task_source=parquet",
      f"env.dataset.path={tmp_path / 'rows.parquet'}", "env.dataset.id_column=id",
      "env.dataset.source_column=data_source", "env.reward_fn=pay_the_answer:score"])
  chat, params = chat_and_params
  result = evaluation.Evaluator(cfg, chat, params).evaluate(params, 0,
                                                            transcripts=tmp_path / "t.jsonl")
  played = sorted(json.loads(line)["task"] for line in (tmp_path / "t.jsonl").open())
  assert played == sorted(f"row{i}" for i in range(len(SOURCE_ROWS)))  # every row, once
  assert {key: value for key, value in result.items() if key.startswith("eval/source/")} == {
      "eval/source/a": pytest.approx(2 / 3), "eval/source/arith/add": 0.25, "eval/source/c": 0.0}
  assert result["eval/accuracy"] == 3 / 8 and result["eval/failures"] == 0.0
  # Every key is documented (docs/reference/metrics.md), a source with a slash included.
  assert metric_docs.describe("eval/source/arith/add").key == "eval/source/<source>"
  assert all(metric_docs.describe(key) is not None for key in result), result
