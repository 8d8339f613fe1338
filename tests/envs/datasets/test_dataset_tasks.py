"""Tasks from Parquet files and save_to_disk directories: column mapping, answer
formats, grading with math-verify, bad rows named, bounded memory while streaming."""

import dataclasses
import itertools
import json

import pyarrow as pa
import pytest

from dataset_fixtures import (AIME, GSM8K, GSM8K_ANSWERS, MATH500, write_parquet,
                              write_saved_dataset)
from sao_jax.config import EnvConfig
from sao_jax.config.dataset import DatasetConfig
from sao_jax.envs import dataset_tasks, registry
from sao_jax.envs import tables
from sao_jax.envs.math import answers

GSM8K_CONFIG = dict(prompt_column="question", answer_format="gsm8k")
AIME_CONFIG = dict(prompt_column="Problem", answer_column="Answer", id_column="ID")


def _table(path, source="parquet", **fields):
  return dataset_tasks.TaskTable(DatasetConfig(path=str(path), **fields), source)


def test_gsm8k_parquet_rows_in_order_across_row_groups(tmp_path):
  path = write_parquet(tmp_path / "gsm8k_test.parquet", GSM8K, row_group_size=2)
  table = _table(path, **GSM8K_CONFIG)
  assert len(table) == 5 and table.name == "gsm8k_test"
  tasks = [table[i] for i in range(len(table))]
  assert [t.prompt for t in tasks] == GSM8K["question"]
  assert [t.answer for t in tasks] == GSM8K_ANSWERS  # "#### 1,234" -> "1234"
  assert [t.id for t in tasks] == [f"gsm8k_test:{i}" for i in range(5)]
  assert {t.metadata["source"] for t in tasks} == {"gsm8k_test"}


def test_math500_answer_column_and_boxed_solution_agree(tmp_path):
  path = write_parquet(tmp_path / "math500.parquet", MATH500)
  plain = _table(path, id_column="unique_id", source_column="subject")
  boxed = _table(path, answer_column="solution", answer_format="boxed")
  for i in range(3):
    assert plain[i].answer == boxed[i].answer == MATH500["answer"][i]
    assert plain[i].id == MATH500["unique_id"][i]
    assert plain[i].metadata["source"] == MATH500["subject"][i]


def test_aime_saved_dataset_integer_answers(tmp_path):
  directory = write_saved_dataset(tmp_path / "aime_2024", AIME, shards=2)  # rows 0-1, 2
  table = _table(directory, "hf_disk", **AIME_CONFIG)
  tasks = [table[i] for i in range(len(table))]
  assert [t.answer for t in tasks] == ["204", "25", "33"]
  assert [t.id for t in tasks] == AIME["ID"]
  assert [t.prompt for t in tasks] == AIME["Problem"]
  with pytest.raises(ValueError, match=r"data-00001-of-00002.arrow row 0, column 'Answer'"):
    bad = dict(AIME, Answer=pa.array([1, 2, None], pa.int64()))
    _table(write_saved_dataset(tmp_path / "bad", bad, shards=2), "hf_disk", **AIME_CONFIG)[2]
  assert {t.metadata["source"] for t in tasks} == {"aime_2024"}


@pytest.mark.parametrize("predicted, index, correct", [
    ("72", 0, True), ("72.0", 0, True), ("73", 0, False), ("1234", 2, True)])
def test_gsm8k_grading(tmp_path, predicted, index, correct):
  table = _table(write_parquet(tmp_path / "g.parquet", GSM8K), **GSM8K_CONFIG)
  assert answers.verify_answer(predicted, table[index].answer) is correct


@pytest.mark.parametrize("predicted, index, correct", [
    ("\\dfrac{14}{3}", 1, True), ("14/3", 1, True), ("4.67", 1, False),
    ("\\sqrt{18}", 2, True), ("(3, \\pi/2)", 0, True), ("(3, \\pi)", 0, False)])
def test_math500_grading_with_math_verify(tmp_path, predicted, index, correct):
  table = _table(write_parquet(tmp_path / "m.parquet", MATH500))
  assert answers.verify_answer(predicted, table[index].answer) is correct


def test_aime_grading_through_the_math_environment(tmp_path):
  """End to end: the env built from the config rewards the boxed integer answer."""
  directory = write_saved_dataset(tmp_path / "aime", AIME)
  config = EnvConfig(task_source="hf_disk", sandbox="unisolated",
                     dataset=DatasetConfig(path=str(directory), **AIME_CONFIG))
  table = _table(directory, "hf_disk", **AIME_CONFIG)
  for text, reward in [("so \\boxed{25}", 1.0), ("\\boxed{025}", 1.0), ("\\boxed{26}", 0.0)]:
    env = registry.make_env(config)
    env.reset(table[1])
    assert env.step(text).reward == reward


def test_make_tasks_streams_a_fresh_permutation_each_epoch(tmp_path):
  path = write_parquet(tmp_path / "g.parquet", GSM8K, row_group_size=1)
  config = EnvConfig(task_source="parquet", seed=-3,  # any integer seed works
                     dataset=DatasetConfig(path=str(path), **GSM8K_CONFIG))
  ids = [t.id for t in itertools.islice(registry.make_tasks(config), 15)]
  epochs = [ids[0:5], ids[5:10], ids[10:15]]
  assert all(sorted(e) == [f"g:{i}" for i in range(5)] for e in epochs)
  assert len({tuple(e) for e in epochs}) > 1
  again = [t.id for t in itertools.islice(registry.make_tasks(config), 15)]
  assert again == ids


def test_parquet_reads_a_bounded_number_of_row_groups_and_only_named_columns(tmp_path):
  rows = 64
  columns = {"question": [f"q{i}" for i in range(rows)],
             "answer": [f"#### {i}" for i in range(rows)],
             "unused": ["x" * 4096] * rows}
  table = _table(write_parquet(tmp_path / "big.parquet", columns, row_group_size=4),
                 **GSM8K_CONFIG)
  reader = table._table
  seen = []
  for task in itertools.islice(dataset_tasks.iterate_shuffled(table, seed=1), rows):
    seen.append(task.answer)
    assert len(reader._cache) <= tables.CACHED_CHUNKS
    assert all(t.column_names == ["question", "answer"] for t in reader._cache.values())
  assert sorted(seen, key=int) == [str(i) for i in range(rows)]


def test_saved_dataset_is_memory_mapped(tmp_path):
  big = 8 << 20
  directory = write_saved_dataset(tmp_path / "mapped", {
      "problem": ["p0", "p1"], "answer": ["1", "2"], "blob": [b"\0" * (big // 2)] * 2})
  before = pa.total_allocated_bytes()
  table = _table(directory, "hf_disk")
  assert [table[i].answer for i in range(2)] == ["1", "2"]
  assert pa.total_allocated_bytes() - before < big // 8  # the file was not read into memory


def _error(tmp_path, columns, **fields):
  path = write_parquet(tmp_path / "bad.parquet", columns, row_group_size=1)
  table = _table(path, **fields)
  with pytest.raises(ValueError) as info:
    for i in range(len(table)):
      table[i]
  return str(info.value)


def test_bad_rows_name_file_row_column_and_value(tmp_path):
  where = str(tmp_path / "bad.parquet")
  message = _error(tmp_path, {"question": ["a", "b", "c"], "answer": ["#### 1", None, "#### 3"]},
                   **GSM8K_CONFIG)
  assert f"{where} row 1, column 'answer'" in message and "null" in message
  message = _error(tmp_path, {"question": ["a", "b"], "answer": ["#### 1", "the answer is 2"]},
                   **GSM8K_CONFIG)
  assert "row 1, column 'answer'" in message and "'the answer is 2'" in message
  assert "####" in message and "answer_format='gsm8k'" in message
  message = _error(tmp_path, {"problem": ["ok", "  "], "answer": ["1", "2"]})
  assert "row 1, column 'problem'" in message and "non-empty text" in message
  message = _error(tmp_path, {"problem": ["x"], "solution": ["no box here"]},
                   answer_column="solution", answer_format="boxed")
  assert "row 0, column 'solution'" in message and "\\boxed" in message
  message = _error(tmp_path, {"problem": ["x"], "answer": pa.array([3], pa.int64())},
                   answer_format="gsm8k")
  assert "row 0, column 'answer'" in message and "answer_format='plain'" in message
  # Before: any length, copied into every trajectory, log line, transcript and report row.
  for column in ("id", "source"):
    message = _error(tmp_path, {"problem": ["x", "y"], "answer": ["1", "2"],
                                column: ["ok", "z" * (dataset_tasks.MAX_LABEL_CHARS + 1)]},
                     **{f"{column}_column": column})
    assert f"row 1, column '{column}'" in message
    assert "257 characters, more than the 256" in message


def test_missing_column_lists_the_file_columns(tmp_path):
  path = write_parquet(tmp_path / "g.parquet", GSM8K)
  with pytest.raises(ValueError, match=r"no column 'problem'; its columns are 'question', 'answer'"):
    _table(path)


def test_saved_dataset_layout_errors(tmp_path):
  split = write_saved_dataset(tmp_path / "dict" / "test", AIME)
  (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
  with pytest.raises(ValueError, match=r"DatasetDict \(splits test\).*dict/test"):
    _table(tmp_path / "dict", "hf_disk", **AIME_CONFIG)
  with pytest.raises(ValueError, match="no state.json"):
    _table(tmp_path, "hf_disk")
  state = json.loads((split / "state.json").read_text())
  state["_data_files"] = [{"filename": "../../secret.arrow"}]
  (split / "state.json").write_text(json.dumps(state))
  with pytest.raises(ValueError, match="not a plain file name"):
    _table(split, "hf_disk", **AIME_CONFIG)


def test_config_validation_names_the_field(tmp_path):
  with pytest.raises(ValueError, match=r"env.dataset.path='' is invalid"):
    registry.check(EnvConfig(task_source="parquet"))
  with pytest.raises(ValueError, match=r"env.dataset.answer_format='latex' is invalid"):
    registry.check(EnvConfig(task_source="hf_disk", dataset=DatasetConfig(
        path=str(tmp_path), answer_format="latex")))
  with pytest.raises(ValueError, match=r"env.task_source='dir' is invalid: 'style' accepts "
                                       "'builtin', 'jsonl', 'parquet', 'hf_disk'"):
    registry.check(EnvConfig(name="style", task_source="dir"))
  dataset = DatasetConfig(path=str(write_parquet(tmp_path / "m.parquet", MATH500)))
  assert registry.check(dataclasses.replace(EnvConfig(), task_source="parquet",
                                            dataset=dataset)).task_source == "parquet"
  # Dataset sources serve every environment, not only math_tool.
  assert registry.check(EnvConfig(name="style", task_source="parquet",
                                  dataset=dataset)).task_source == "parquet"
