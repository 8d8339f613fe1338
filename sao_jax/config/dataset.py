"""Prompt/answer tasks read from dataset files: where they are, which columns hold
what, how the reference answer is written (the `env.dataset` section)."""

from __future__ import annotations

import dataclasses
import os

from sao_jax.config.checks import check_choice, fail

# Task sources that read `env.dataset`: Parquet (a file, or a directory of *.parquet
# files) and a directory written by Hugging Face `datasets.Dataset.save_to_disk`.
DATASET_SOURCES = ("parquet", "hf_disk")
# How the answer column writes the reference (`sao_jax.envs.math.answers.reference_answer`):
# "plain" = the answer itself (text or an integer, AIME / MATH-500 `answer`),
# "gsm8k" = worked solution ending in `#### answer`, "boxed" = a solution whose last
# `\boxed{...}` holds the answer (MATH `solution`).
ANSWER_FORMATS = ("plain", "gsm8k", "boxed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetConfig:
  """Which file and which columns (semantics: `sao_jax.envs.dataset_tasks`).

  Defaults fit MATH-500 (`problem`, `answer`); GSM8K is `prompt_column="question"`,
  `answer_format="gsm8k"`; AIME 2024 is `prompt_column="Problem"`,
  `answer_column="Answer"`; verl-style rows are `DatasetConfig.verl(path)`.
  `id_column` empty: ids are `<name>:<row>`; `source_column` empty: every row's
  source (metrics are broken down per source) is the dataset's name, the file
  or directory name without suffix. A column name may walk into a struct
  column with dots: `reward_model.ground_truth`. The prompt column holds text,
  or a list of chat messages ({"role", "content"}). `metadata_columns`: more
  columns copied into `Task.metadata` under their names (what a reward function
  reads, e.g. verl's `extra_info`).
  """

  path: str = ""  # the Parquet file or directory, or the save_to_disk split directory
  prompt_column: str = "problem"  # column holding the prompt
  answer_column: str = "answer"  # column holding the reference answer
  # How the reference is read: plain (the cell), gsm8k (after ####), boxed (last \boxed{}).
  answer_format: str = "plain"
  id_column: str = ""  # column of task ids ('': <name>:<row>)
  # Column naming each row's source for sao-eval's breakdown ('': the dataset's name).
  source_column: str = ""
  # Columns kept whole beside each task (e.g. verl's extra_info), for reward functions.
  metadata_columns: tuple[str, ...] = ()

  @classmethod
  def verl(cls, path: str, **changes) -> DatasetConfig:
    """The column mapping of verl / OpenRLHF parquet rows: a chat-message `prompt`,
    `reward_model.ground_truth`, `data_source` and `extra_info`."""
    fields = dict(prompt_column="prompt", answer_column="reward_model.ground_truth",
                  source_column="data_source", metadata_columns=("extra_info",))
    return cls(path=path, **{**fields, **changes})

  def columns(self) -> tuple[str, ...]:
    """The mapped column names (dotted ones whole), each once, in field order."""
    named = (self.prompt_column, self.answer_column, self.id_column, self.source_column,
             *self.metadata_columns)
    return tuple(dict.fromkeys(c for c in named if c))

  def validate(self, source: str) -> None:
    """Checks the fields for task source `source` (one of DATASET_SOURCES)."""
    if source == "parquet" and not (os.path.isfile(self.path) or os.path.isdir(self.path)):
      fail("env.dataset", "path", self.path,
           "task_source='parquet' needs an existing .parquet file or a directory of them")
    if source == "hf_disk" and not os.path.isdir(self.path):
      fail("env.dataset", "path", self.path, "task_source='hf_disk' needs the directory "
           "`datasets.Dataset.save_to_disk` wrote (it holds state.json)")
    for name in ("prompt_column", "answer_column"):
      if not isinstance(getattr(self, name), str) or not getattr(self, name):
        fail("env.dataset", name, getattr(self, name), "expected a column name")
    for name in ("id_column", "source_column"):
      if not isinstance(getattr(self, name), str):
        fail("env.dataset", name, getattr(self, name), "expected a column name or ''")
    if not isinstance(self.metadata_columns, tuple) or not all(
        isinstance(c, str) and c for c in self.metadata_columns):
      fail("env.dataset", "metadata_columns", self.metadata_columns,
           "expected a tuple of column names, e.g. ('extra_info',)")
    check_choice("env.dataset", self, "answer_format", ANSWER_FORMATS)
