"""verl / OpenRLHF-shaped rows (chat-message prompt, reward_model.ground_truth,
data_source, extra_info) through the column mapping, for any environment."""

import itertools

import pyarrow as pa
import pytest

from dataset_fixtures import write_parquet, write_saved_dataset
from sao_jax.config import EnvConfig
from sao_jax.config.dataset import DatasetConfig
from sao_jax.envs import dataset_tasks, registry
from sao_jax.envs.base import play

SYSTEM = {"role": "system", "content": "Put the final answer in \\boxed{}."}


def verl_rows(n=4):
  """What verl's examples/data_preprocess/gsm8k.py writes, n rows, two data sources."""
  return {
      "data_source": [("openai/gsm8k" if i % 2 == 0 else "lighteval/MATH") for i in range(n)],
      "prompt": [[SYSTEM, {"role": "user", "content": f"What is {i} + {i}?"}] for i in range(n)],
      "ability": ["math"] * n,
      "reward_model": [{"style": "rule", "ground_truth": str(2 * i)} for i in range(n)],
      "extra_info": [{"split": "train", "index": i} for i in range(n)],
  }


def test_verl_parquet_rows_become_chat_tasks(tmp_path):
  path = write_parquet(tmp_path / "train.parquet", verl_rows())
  table = dataset_tasks.TaskTable(DatasetConfig.verl(str(path)), "parquet")
  task = table[3]
  assert task.prompt == "What is 3 + 3?" and task.answer == "6"
  assert task.messages == (SYSTEM, {"role": "user", "content": "What is 3 + 3?"})
  assert task.metadata["source"] == "lighteval/MATH"
  assert task.metadata["extra_info"] == {"split": "train", "index": 3}
  assert task.id == "train:3"


def test_verl_rows_from_a_saved_dataset(tmp_path):
  directory = write_saved_dataset(tmp_path / "train", verl_rows(3), shards=2)
  table = dataset_tasks.TaskTable(DatasetConfig.verl(str(directory)), "hf_disk")
  assert [table[i].answer for i in range(3)] == ["0", "2", "4"]
  assert [table[i].metadata["source"] for i in range(3)] == [
      "openai/gsm8k", "lighteval/MATH", "openai/gsm8k"]


def test_single_turn_env_plays_the_rows_chat_prompt(tmp_path):
  """The verl prompt's messages are the conversation; the boxed answer is graded."""
  path = write_parquet(tmp_path / "train.parquet", verl_rows())
  config = EnvConfig(name="single_turn", task_source="parquet",
                     dataset=DatasetConfig.verl(str(path)))
  config.validate()
  tasks = list(itertools.islice(registry.make_tasks(config), 4))
  assert sorted(t.metadata["extra_info"]["index"] for t in tasks) == [0, 1, 2, 3]
  env = registry.make_env(config)
  task = tasks[0]
  transcript = play(env, task, [f"So \\boxed{{{task.answer}}}."])
  assert transcript.messages[:2] == [SYSTEM, {"role": "user", "content": task.prompt}]
  assert transcript.result.reward == 1.0
  assert play(env, task, ["\\boxed{-1}"]).result.reward == 0.0


def test_plain_prompt_answer_columns_still_load(tmp_path):
  path = write_parquet(tmp_path / "qa.parquet", {"prompt": ["2+2?"], "answer": ["4"]})
  task = dataset_tasks.TaskTable(DatasetConfig(path=str(path), prompt_column="prompt"),
                                 "parquet")[0]
  assert (task.prompt, task.answer, task.messages) == ("2+2?", "4", ())


@pytest.mark.parametrize("change, error", [
    ({"reward_model": [{"style": "rule"}] * 2},
     r"row 1, column 'reward_model.ground_truth': no field 'ground_truth' in 'reward_model'"),
    ({"prompt": [[SYSTEM]] * 2},
     r"row 1, column 'prompt': a chat prompt needs a non-empty user message"),
    ({"prompt": [[{"role": "robot", "content": "x"}]] * 2},
     r"row 1, column 'prompt': message 0 is not"),
    ({"prompt": [[SYSTEM, {"role": "user", "content": "q"},
                  {"role": "assistant", "content": "a"}]] * 2},
     r"row 1, column .prompt.: a chat prompt needs .* must not end with an assistant"),
])
def test_a_bad_verl_row_names_file_row_and_column(tmp_path, change, error):
  path = write_parquet(tmp_path / "bad.parquet", {**verl_rows(2), **change})
  table = dataset_tasks.TaskTable(DatasetConfig.verl(str(path)), "parquet")
  with pytest.raises(ValueError, match=str(path).replace(".", r"\.") + " " + error):
    table[1]


def test_a_missing_mapped_column_is_refused_when_the_file_is_opened(tmp_path):
  rows = verl_rows(2)
  del rows["extra_info"]
  path = write_parquet(tmp_path / "no_extra.parquet", rows)
  with pytest.raises(ValueError, match=r"no_extra.parquet: no column 'extra_info'; its columns "
                                       r"are 'data_source', 'prompt'"):
    registry.check(EnvConfig(name="single_turn", task_source="parquet",
                             dataset=DatasetConfig.verl(str(path))))


def test_metadata_columns_are_validated():
  with pytest.raises(ValueError, match=r"env.dataset.metadata_columns='extra_info' is invalid"):
    DatasetConfig(path="/", metadata_columns="extra_info").validate("parquet")


def test_dataset_tasks_serve_other_environments(tmp_path):
  """The style environment reads its keyword tasks from Parquet as well."""
  path = write_parquet(tmp_path / "style.parquet", {
      "problem": ["Explain tides in 20 to 80 words."], "answer": ["moon"]})
  config = EnvConfig(name="style", task_source="parquet",
                     dataset=DatasetConfig(path=str(path)))
  task = next(registry.make_tasks(config))
  assert (task.prompt, task.answer) == ("Explain tides in 20 to 80 words.", "moon")
  assert registry.make_env(config).reset(task)[-1]["content"] == task.prompt


def test_write_saved_dataset_handles_nested_columns(tmp_path):
  """(The fixture writes struct and list columns as datasets does.)"""
  directory = write_saved_dataset(tmp_path / "d", verl_rows(1))
  assert pa.ipc.open_stream(str(directory / "data-00000-of-00001.arrow")).read_all().num_rows == 1


def test_verl_shaped_jsonl_rows(tmp_path):
  import json
  path = tmp_path / "train.jsonl"
  rows = verl_rows(2)
  path.write_text("".join(json.dumps({key: rows[key][i] for key in rows}) + "\n"
                          for i in range(2)))
  config = EnvConfig(name="single_turn", task_source="jsonl", jsonl_path=str(path))
  tasks = sorted(itertools.islice(registry.make_tasks(config), 2), key=lambda t: t.answer)
  assert [(t.prompt, t.answer, t.metadata["source"]) for t in tasks] == [
      ("What is 0 + 0?", "0", "openai/gsm8k"), ("What is 1 + 1?", "2", "lighteval/MATH")]
  assert tasks[0].messages[0] == SYSTEM and tasks[0].metadata["extra_info"]["index"] == 0
  path.write_text(json.dumps({"prompt": [SYSTEM], "answer": "1"}) + "\n")
  with pytest.raises(ValueError, match=r"train.jsonl:1: a chat 'prompt' needs a user message"):
    next(registry.make_tasks(config))
