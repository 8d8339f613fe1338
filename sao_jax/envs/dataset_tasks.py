"""Prompt/answer tasks from dataset files (`env.dataset`, task sources "parquet"
and "hf_disk"), read row by row (`sao_jax.envs.tables`).

Row i becomes `Task(id, prompt, answer, metadata={"source", "row", ...})`: the
prompt column's text (or, for a list of chat messages, `Task.messages` and the
text of its last user message), the answer column read as `answer_format`
(`envs.math.answers.reference_answer`: GSM8K's `#### 72`, MATH's `\\boxed{}`,
AIME's integers), the id column's value (text or integer) or `<name>:<row>`,
the source column's value or the dataset's name, and each of
`metadata_columns` under its name. A dotted column (`reward_model.ground_truth`)
walks into a struct column. A bad cell (missing value, a struct without the
field, empty prompt, a message list that is not one, an answer not in the
format, an id or source longer than `MAX_LABEL_CHARS`) raises `BadRow` (a ValueError)
naming the file, the row's index in it, the column and the value: no row is skipped.

Every row is checked before a job starts (`check_rows`, from `registry.check_tasks`,
which `jobs.startup.check` runs for sao-train, its --check, sao-eval and
sao-sampler): one scan of the mapped columns, a row group at a time, refused with
the number of bad rows and the first `MAX_REPORTED_ROWS` of them.

`iterate_shuffled` streams a table through a grain `MapDataset`: a fresh seeded
permutation of the row indices each epoch (grain's index shuffle: no index
list is materialised), each row read when its turn comes, from any position of
the stream (`start`: a restarted sampler continues where its stream stood). A row
that has turned bad since the check (the file rewritten under a run) raises
`BadRow` from that `next()` only: the stream stays usable and serves the next
position after it (the sampler counts the row as a dropped episode).
"""

from __future__ import annotations

import functools
import os
import pathlib
import types
from typing import Iterator

import grain

from sao_jax.config.dataset import DatasetConfig
from sao_jax.envs import tables
from sao_jax.envs.base import Task
from sao_jax.envs.math import answers
from sao_jax.envs.tasks import CHAT_ROLES

_OPENERS = {"parquet": tables.open_parquet, "hf_disk": tables.open_saved_dataset}
_SHOWN_CHARS = 200  # of a bad value in an error message
_CELL = object()  # `_bad`'s default: show the cell
MAX_LABEL_CHARS = 256  # of an id or source cell
MAX_REPORTED_ROWS = 5  # bad rows `check_rows` names (it counts them all)


class BadRow(ValueError):
  """A dataset row that does not make a task; the message names the file, the row, the
  column and the value, `where` the file and the row."""

  def __init__(self, message: str, where: str):
    super().__init__(message)
    self.where = where


class TaskTable:
  """Tasks of a dataset by row index (grain's RandomAccessDataSource protocol)."""

  def __init__(self, config: DatasetConfig, source: str):
    config.validate(source)
    self._config = config
    columns = dict.fromkeys(c.split(".")[0] for c in config.columns())
    self._table = _OPENERS[source](config.path, list(columns))

  @property
  def name(self) -> str:
    return self._table.name

  def __len__(self) -> int:
    return len(self._table)

  def __getitem__(self, index: int) -> Task:
    return self._task(self._table.row(index), index)

  def check_rows(self) -> None:
    """ValueError naming how many rows are bad and the first MAX_REPORTED_ROWS (each
    its file, row, column and value), after reading every row (`tables.ColumnTable.rows`)."""
    bad, count = [], 0
    for index, row in enumerate(self._table.rows()):
      try:
        self._task(row, index)
      except BadRow as error:
        count += 1
        if len(bad) < MAX_REPORTED_ROWS:
          bad.append(str(error))
    if count:
      raise ValueError(f"dataset {self.name!r} has {count} bad row(s) of {len(self)} (every row "
                       f"is read before the run starts); the first {len(bad)}: "
                       + " | ".join(bad))

  def _task(self, row: tables.Row, index: int) -> Task:
    config = self._config
    prompt, messages = _prompt(row, config.prompt_column)
    # The cell is read outside the `try`: its own error (a null) already names the row.
    cell = _cell(row, config.answer_column)
    try:
      answer = answers.reference_answer(cell, config.answer_format)
    except ValueError as error:
      _bad(row, config.answer_column, f"{error} (env.dataset.answer_format="
                                      f"{config.answer_format!r})")
    task_id = f"{self.name}:{index}"
    if config.id_column:
      task_id = _label(row, config.id_column)
    source = _label(row, config.source_column) if config.source_column else self.name
    extra = {column: _value(row, column) for column in config.metadata_columns}
    return Task(id=task_id, prompt=prompt, answer=answer, messages=messages,
                metadata=types.MappingProxyType({**extra, "source": source, "row": index}))


def _value(row: tables.Row, column: str):
  """The cell `column` names: a column, or a field of a struct column (`a.b`)."""
  top, *fields = column.split(".")
  value = row.values[top]
  for depth, field in enumerate(fields):
    if not isinstance(value, dict) or field not in value:
      _bad(row, column, f"no field {field!r} in {'.'.join([top, *fields[:depth]])!r}",
           value)
    value = value[field]
  return value


def _cell(row: tables.Row, column: str):
  value = _value(row, column)
  if value is None:
    _bad(row, column, "missing value (null)")
  return value


def _prompt(row: tables.Row, column: str) -> tuple[str, tuple]:
  """(prompt text, chat messages or ()) of a prompt cell: text, or a list of
  {"role", "content"} messages with a user message (the text is the last one's)."""
  value = _cell(row, column)
  if isinstance(value, str):
    if not value.strip():
      _bad(row, column, "expected non-empty text or a list of chat messages")
    return value, ()
  if not isinstance(value, list) or not value:
    _bad(row, column, "expected non-empty text or a list of chat messages")
  messages = []
  for i, message in enumerate(value):
    if (not isinstance(message, dict) or message.get("role") not in CHAT_ROLES
        or not isinstance(message.get("content"), str)):
      _bad(row, column, f"message {i} is not {{'role': one of {CHAT_ROLES}, 'content': text}}")
    messages.append(types.MappingProxyType({"role": message["role"],
                                            "content": message["content"]}))
  users = [m["content"] for m in messages if m["role"] == "user"]
  if not users or not users[-1].strip() or messages[-1]["role"] == "assistant":
    _bad(row, column, "a chat prompt needs a non-empty user message and must not end with "
                      "an assistant message (the policy writes that one)")
  return users[-1], tuple(messages)


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


def _bad(row: tables.Row, column: str, problem: str, value=_CELL):
  """BadRow naming file, row, column, the problem and `value` (default: the cell)."""
  shown = repr(_value(row, column) if value is _CELL else value)
  if len(shown) > _SHOWN_CHARS:
    shown = shown[:_SHOWN_CHARS] + f"... ({len(shown)} characters)"
  where = f"{row.file} row {row.index}"
  raise BadRow(f"{where}, column {column!r}: {problem}; the value is {shown}. Fix or remove "
               "the row.", where)


def check_columns(config: DatasetConfig, source: str) -> None:
  """Opens the dataset once per process and state of its files (a missing mapped column,
  an unreadable file: ValueError naming the file), so that `registry.check` refuses
  it at start-up; cheap: Parquet footers, a save_to_disk directory's mapped columns."""
  _opened(config, source, _stamp(config, source))


def check_rows(config: DatasetConfig, source: str) -> None:
  """`TaskTable.check_rows` of the dataset, once per process and state of its files:
  every row read (memory: a row group or two of the mapped columns, as when training)."""
  _rows_checked(config, source, _stamp(config, source))


def _stamp(config: DatasetConfig, source: str) -> tuple:
  """(path, mtime, size) of the dataset's files: a cache key that a rewrite changes."""
  config.validate(source)
  files = sorted(pathlib.Path(config.path).iterdir()) if os.path.isdir(config.path) else [
      pathlib.Path(config.path)]
  return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.is_file())


@functools.lru_cache(maxsize=16)
def _opened(config: DatasetConfig, source: str, stamp: tuple) -> None:
  del stamp  # part of the cache key: a file rewritten since is checked again
  TaskTable(config, source)


@functools.lru_cache(maxsize=16)
def _rows_checked(config: DatasetConfig, source: str, stamp: tuple) -> None:
  del stamp  # as `_opened`
  TaskTable(config, source).check_rows()


class Shuffled:
  """The table's tasks in a fresh seeded order each epoch, without end, from stream
  position `start` (module docstring). `position` is that of the next task; a bad row
  raises `BadRow` and is passed (the next call serves the position after it)."""

  def __init__(self, table: TaskTable, *, seed: int = 0, start: int = 0):
    # grain takes seeds in [0, 2**32); env.seed may be any integer.
    self._dataset = grain.MapDataset.source(table).shuffle(seed=seed % 2**32).repeat()
    self.position = start

  def __iter__(self) -> Iterator[Task]:
    return self

  def __next__(self) -> Task:
    index, self.position = self.position, self.position + 1
    return self._dataset[index]


def iterate_shuffled(table: TaskTable, *, seed: int = 0, start: int = 0) -> Iterator[Task]:
  """`Shuffled(table, seed=seed, start=start)`: the table's tasks in a fresh seeded order
  each epoch, without end."""
  return Shuffled(table, seed=seed, start=start)
