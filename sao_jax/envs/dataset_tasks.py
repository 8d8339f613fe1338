"""Prompt/answer tasks from dataset files (`env.dataset`, task sources "parquet"
and "hf_disk"), read row by row (`sao_jax.envs.tables`).

Row i becomes `Task(id, prompt, answer, metadata={"source", "row"})`: the prompt
column's text, the answer column read as `answer_format`
(`envs.math.answers.reference_answer`: GSM8K's `#### 72`, MATH's `\\boxed{}`,
AIME's integers), the id column's value (text or integer) or `<name>:<row>`,
the source column's value or the dataset's name. A bad cell (missing value,
empty prompt, an answer not in the format, an id or source longer than
`MAX_LABEL_CHARS`) raises ValueError naming the file,
the row's index in it, the column and the value: no row is skipped. Rows are
checked when read; `sao-eval` reads them all.

`iterate_shuffled` streams a table through a grain `MapDataset`: a fresh seeded
permutation of the row indices each epoch (grain's index shuffle: no index
list is materialised), each row read when its turn comes.
"""

from __future__ import annotations

import itertools
import types
from typing import Iterator

import grain

from sao_jax.config.dataset import DatasetConfig
from sao_jax.envs import tables
from sao_jax.envs.base import Task
from sao_jax.envs.math import answers

_OPENERS = {"parquet": tables.open_parquet, "hf_disk": tables.open_saved_dataset}
_SHOWN_CHARS = 200  # of a bad value in an error message
MAX_LABEL_CHARS = 256  # of an id or source cell


class TaskTable:
  """Tasks of a dataset by row index (grain's RandomAccessDataSource protocol)."""

  def __init__(self, config: DatasetConfig, source: str):
    config.validate(source)
    self._config = config
    columns = dict.fromkeys(c for c in (config.prompt_column, config.answer_column,
                                        config.id_column, config.source_column) if c)
    self._table = _OPENERS[source](config.path, list(columns))

  @property
  def name(self) -> str:
    return self._table.name

  def __len__(self) -> int:
    return len(self._table)

  def __getitem__(self, index: int) -> Task:
    row = self._table.row(index)
    config = self._config
    prompt = _cell(row, config.prompt_column)
    if not isinstance(prompt, str) or not prompt.strip():
      _bad(row, config.prompt_column, "expected non-empty text")
    try:
      answer = answers.reference_answer(_cell(row, config.answer_column), config.answer_format)
    except ValueError as error:
      _bad(row, config.answer_column, f"{error} (env.dataset.answer_format="
                                      f"{config.answer_format!r})")
    task_id = f"{self.name}:{index}"
    if config.id_column:
      task_id = _label(row, config.id_column)
    source = _label(row, config.source_column) if config.source_column else self.name
    return Task(id=task_id, prompt=prompt, answer=answer,
                metadata=types.MappingProxyType({"source": source, "row": index}))


def _cell(row: tables.Row, column: str):
  value = row.values[column]
  if value is None:
    _bad(row, column, "missing value (null)")
  return value


def _label(row: tables.Row, column: str) -> str:
  """An id or source cell: non-empty text of at most MAX_LABEL_CHARS, or an integer."""
  value = _cell(row, column)
  if isinstance(value, int) and not isinstance(value, bool):
    return str(value)
  if not isinstance(value, str) or not value:
    _bad(row, column, "expected non-empty text or an integer")
  if len(value) > MAX_LABEL_CHARS:
    _bad(row, column, f"{len(value)} characters, more than the {MAX_LABEL_CHARS} an id or "
                      "source may have (it names the task in every trajectory, log line, "
                      "transcript and report)")
  return value


def _bad(row: tables.Row, column: str, problem: str):
  shown = repr(row.values[column])
  if len(shown) > _SHOWN_CHARS:
    shown = shown[:_SHOWN_CHARS] + f"... ({len(shown)} characters)"
  raise ValueError(f"{row.file} row {row.index}, column {column!r}: {problem}; "
                   f"the value is {shown}. Fix or remove the row.")


def iterate_shuffled(table: TaskTable, *, seed: int = 0) -> Iterator[Task]:
  """The table's tasks in a fresh seeded order each epoch, without end."""
  # grain takes seeds in [0, 2**32); env.seed may be any integer.
  dataset = grain.MapDataset.source(table).shuffle(seed=seed % 2**32).repeat()
  for index in itertools.count():
    yield dataset[index]
