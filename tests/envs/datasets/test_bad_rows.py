"""A bad dataset row: named (file, row, column) by `sao-train --check` before a run
starts, once, and at run time a counted drop that the task stream goes on past."""

import itertools
import json
import pathlib

import pytest

from dataset_fixtures import write_parquet
from sao_jax.cli import train as train_cli
from sao_jax.config import EnvConfig
from sao_jax.config.dataset import DatasetConfig
from sao_jax.data import pipeline
from sao_jax.data.task_positions import TaskStart
from sao_jax.sampler.task_stream import served
from sao_jax.envs import dataset_tasks, registry
from sao_jax.envs.base import Task

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "configs" / "demo_cpu.py")


def qa_rows(n, *, null_at=None):
  """`n` verl-shaped rows (answer in reward_model.ground_truth); row `null_at`'s is null."""
  return {"prompt": [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(n)],
          "reward_model": [{"ground_truth": None if i == null_at else str(2 * i)}
                           for i in range(n)]}


def _verl(path):
  return DatasetConfig(path=str(path), prompt_column="prompt",
                       answer_column="reward_model.ground_truth")


def test_check_names_file_row_and_column_of_a_null_ground_truth(tmp_path, capsys):
  path = write_parquet(tmp_path / "train.parquet", qa_rows(6, null_at=3), row_group_size=2)
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--check", "--set", "env.task_source=parquet",
                    "--set", f"env.dataset.path={path}", "--set", "env.dataset.prompt_column=prompt",
                    "--set", "env.dataset.answer_column=reward_model.ground_truth",
                    "--set", f"run.run_dir={tmp_path / 'run'}"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2
  assert "has 1 bad row(s) of 6" in err
  assert f"{path} row 3, column 'reward_model.ground_truth': missing value (null)" in err


def test_check_names_a_bad_jsonl_line(tmp_path, capsys):
  tasks = tmp_path / "tasks.jsonl"
  tasks.write_text('{"prompt": "Compute 1 + 1.", "answer": "2"}\n{"prompt": "x", "answer": null}\n')
  with pytest.raises(SystemExit) as exit_info:
    train_cli.main(["--config", DEMO, "--check", "--set", "env.task_source=jsonl",
                    "--set", f"env.jsonl_path={tasks}", "--set", f"run.run_dir={tmp_path / 'r'}"])
  assert exit_info.value.code == 2
  assert f"{tasks}:2: 'answer' must be a non-empty string" in capsys.readouterr().err


def test_a_null_answer_is_named_once(tmp_path):
  """The null's own message, not wrapped again in the answer-format error."""
  path = write_parquet(tmp_path / "t.parquet", {"question": ["a", "b"], "answer": ["1", None]})
  table = dataset_tasks.TaskTable(DatasetConfig(path=str(path), prompt_column="question"),
                                  "parquet")
  with pytest.raises(dataset_tasks.BadRow) as error:
    table[1]
  assert str(error.value).count("column 'answer'") == 1
  assert str(error.value) == (f"{path} row 1, column 'answer': missing value (null); the value "
                              "is None. Fix or remove the row.")
  assert error.value.where == f"{path} row 1"


def test_check_rows_counts_every_bad_row_and_names_the_first(tmp_path):
  answers = [None if i % 3 == 0 else str(i) for i in range(20)]  # 7 bad rows
  path = write_parquet(tmp_path / "t.parquet", {"question": ["q"] * 20, "answer": answers},
                       row_group_size=4)
  config = DatasetConfig(path=str(path), prompt_column="question")
  with pytest.raises(ValueError, match=r"has 7 bad row\(s\) of 20") as error:
    dataset_tasks.check_rows(config, "parquet")
  assert [f"row {i}, column 'answer'" in str(error.value) for i in (0, 3, 6, 9, 12, 15, 18)] == [
      True] * 5 + [False] * 2  # the first MAX_REPORTED_ROWS are named
  good = write_parquet(tmp_path / "good.parquet", {"question": ["q"] * 9, "answer": ["1"] * 9},
                       row_group_size=4)
  dataset_tasks.check_rows(DatasetConfig(path=str(good), prompt_column="question"), "parquet")


def test_a_bad_row_at_run_time_is_passed_and_the_stream_goes_on(tmp_path):
  """A row gone bad after the start-up check: `served` gives it as the error, at its
  position, and the next positions follow (the old stream raised out of next())."""
  path = write_parquet(tmp_path / "train.parquet", qa_rows(4, null_at=2))
  config = EnvConfig(name="single_turn", task_source="parquet", dataset=_verl(path))
  got = list(itertools.islice(served(lambda k: registry.make_tasks(config, start=k),
                                     TaskStart()), 8))
  assert [position for position, _ in got] == list(range(8))
  bad = [(p, t) for p, t in got if isinstance(t, dataset_tasks.BadRow)]
  assert len(bad) == 2  # row 2, once in each of two epochs
  assert all(f"{path} row 2, column 'reward_model.ground_truth'" in str(t) for _, t in bad)
  assert sorted(t.answer for _, t in got if isinstance(t, Task)) == sorted(["0", "2", "6"] * 2)


class _Engine:  # what `EpisodeRunner.reject` and `step` touch of an engine with nothing in it
  version, busy, overlaps_host = 3, False, False

  def dispatch(self):
    return None

  def complete(self, in_flight):
    return []


def test_a_bad_row_is_a_counted_drop_naming_file_row_and_column(tmp_path):
  """Each episode of the row's task becomes a failed trajectory (a group stays whole),
  which the learner's pipeline counts as dropped/env_failure/BadRow."""
  from sao_jax.sampler.episodes import EpisodeRunner

  path = write_parquet(tmp_path / "train.parquet", qa_rows(4, null_at=1))
  table = dataset_tasks.TaskTable(_verl(path), "parquet")
  try:
    table[1]
  except dataset_tasks.BadRow as bad:
    error = bad
  lines = []
  runner = EpisodeRunner(_Engine(), chat=None, make_env=None, max_episodes=4, log=lines.append)
  task = Task(id=error.where, prompt="", answer="")
  ids = [runner.reject(task, error, prompt_id=7) for _ in range(2)]
  trajs = runner.step()
  assert ids == [0, 1] and [t.info["episode"] for t in trajs] == [0, 1]
  assert all(t.length == 0 and t.prompt_id == 7 and t.info["failure_kind"] == "BadRow"
             for t in trajs)
  assert f"row 1, column 'reward_model.ground_truth'" in trajs[0].env_failure
  assert runner.failures == {"BadRow": 2} and len(lines) == 1 and "BadRow" in lines[0]

  class Transport:
    closed = True

    def __init__(self):
      self.items = list(trajs)

    def get(self, timeout):
      return self.items.pop(0) if self.items else None

  drops = pipeline.Drops()
  batches = pipeline.learner_pipeline(
      Transport(), batch_size=2, group_size=2, max_lag=4, buckets=(8,), pad_id=0,
      vocab_size=16, current_version=lambda: 3, drops=drops)
  with pytest.raises(StopIteration):  # the bad row's group is dropped, not trained
    next(batches)
  assert drops["env_failure"] == 2 and drops["env_failure/BadRow"] == 2
  assert "row 1, column 'reward_model.ground_truth'" in drops.examples["env_failure/BadRow"]


def test_a_jsonl_row_stream_resumes_where_it_stopped(tmp_path):
  path = tmp_path / "tasks.jsonl"
  path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                          for i in range(5)))
  config = EnvConfig(name="single_turn", task_source="jsonl", jsonl_path=str(path))
  whole = [t.id for t in itertools.islice(registry.make_tasks(config), 13)]
  assert [t.id for t in itertools.islice(registry.make_tasks(config, start=7), 6)] == whole[7:]
