"""Rows of columnar dataset files by index, without holding the files in memory.

    table = open_parquet("gsm8k/test.parquet", ["question", "answer"])
    table = open_saved_dataset("math500/", ["problem", "answer"])   # save_to_disk output
    len(table); table.row(17)   # -> Row(file, index in the file, {column: value})

Both read only the named columns. Parquet (a file, or every `*.parquet` in a
directory, in name order) is read one row group at a time, the last
`CACHED_CHUNKS` decoded groups kept: memory is a few row groups of the named
columns whatever the file's size. A file is input: a row group whose named
columns the footer says take more than MAX_ROW_GROUP_BYTES uncompressed is
refused when the file is opened, and since the footer can understate what a
group decodes to (a dictionary or delta encoding writes one long value out per
row; a footer can be forged), a group is decoded DECODE_ROWS rows at a time and
refused once past MAX_ROW_GROUP_BYTES, or if it holds another number of rows
than its footer says. Memory: CACHED_CHUNKS groups of at most
MAX_ROW_GROUP_BYTES, plus one step of DECODE_ROWS rows (each value is at most
a page, which Parquet caps at 2 GiB). A `save_to_disk` directory (`state.json` naming
Arrow IPC stream files `data-XXXXX-of-YYYYY.arrow`, what `datasets` writes) is
memory-mapped, as `datasets.load_from_disk` does: rows are read from the
mapping on access, and pages come from the OS file cache, not this process's
heap.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import json
import os
import pathlib
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

CACHED_CHUNKS = 2  # decoded Parquet row groups kept; a shuffled read hits one group at a time
MAX_ROW_GROUP_BYTES = 256 << 20  # bytes one Parquet row group's named columns may decode into
DECODE_ROWS = 1024  # rows of a row group decoded at a time, each step checked against the cap
STATE_FILE = "state.json"  # what save_to_disk writes beside the .arrow files
DATASET_DICT_FILE = "dataset_dict.json"  # save_to_disk of a DatasetDict (one directory per split)


@dataclasses.dataclass(frozen=True)
class Row:
  file: str  # the data file holding the row
  index: int  # the row's index in that file, from 0
  values: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _Chunk:
  file: str
  first: int  # index in `file` of the chunk's first row
  rows: int
  load: Callable[[], pa.Table]  # the chunk's named columns


class ColumnTable:
  """The rows of `chunks`, in order, as Python values of the named columns."""

  def __init__(self, chunks: Sequence[_Chunk], columns: Sequence[str], *, name: str):
    self.name, self.columns = name, tuple(columns)
    self._chunks = list(chunks)
    self._starts = [0]
    for chunk in self._chunks:
      self._starts.append(self._starts[-1] + chunk.rows)
    if not len(self):
      raise ValueError(f"dataset {name!r} has no rows")
    self._cache: collections.OrderedDict[int, pa.Table] = collections.OrderedDict()

  def __len__(self) -> int:
    return self._starts[-1]

  def row(self, index: int) -> Row:
    if not 0 <= index < len(self):
      raise IndexError(f"row {index} of dataset {self.name!r}, which has {len(self)} rows")
    position = bisect.bisect_right(self._starts, index) - 1
    chunk, offset = self._chunks[position], index - self._starts[position]
    values = self._table(position).slice(offset, 1).to_pylist()[0]
    return Row(chunk.file, chunk.first + offset, values)

  def _table(self, position: int) -> pa.Table:
    if position in self._cache:
      self._cache.move_to_end(position)
    else:
      self._cache[position] = self._chunks[position].load()
      while len(self._cache) > CACHED_CHUNKS:
        self._cache.popitem(last=False)
    return self._cache[position]


def _check_columns(file: str, names: Sequence[str], columns: Sequence[str]) -> None:
  missing = [c for c in columns if c not in names]
  if missing:
    raise ValueError(f"{file}: no column {missing[0]!r}; its columns are "
                     f"{', '.join(map(repr, names))}; set the env.dataset column names to match")


def open_parquet(path: str | os.PathLike, columns: Sequence[str]) -> ColumnTable:
  """A Parquet file, or the `*.parquet` files of a directory in name order."""
  path = pathlib.Path(path)
  files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
  if not files:
    raise ValueError(f"{path}: a directory without *.parquet files")
  chunks = []
  for file in map(str, files):
    try:
      metadata = pq.ParquetFile(file).metadata
    except (pa.ArrowInvalid, OSError) as error:
      raise ValueError(f"{file}: not a readable Parquet file ({error})") from None
    _check_columns(file, metadata.schema.to_arrow_schema().names, columns)
    first = 0
    for group in range(metadata.num_row_groups):
      rows, stored = metadata.row_group(group).num_rows, _stored_bytes(metadata, group, columns)
      if stored > MAX_ROW_GROUP_BYTES:
        raise ValueError(f"{file}: row group {group} holds {stored} bytes of the columns "
                         f"{', '.join(columns)} uncompressed, more than the {MAX_ROW_GROUP_BYTES} "
                         f"a row group may decode to (sao_jax.data.tables.MAX_ROW_GROUP_BYTES); "
                         + _rewrite(rows, stored))
      if rows < 0:
        raise ValueError(f"{file}: row group {group} has {rows} rows; a corrupt or forged file")
      chunks.append(_Chunk(file, first, rows, functools.partial(
          _read_row_group, file, group, tuple(columns), rows, stored)))
      first += rows
  return ColumnTable(chunks, columns, name=path.stem)


def _stored_bytes(metadata: pq.FileMetaData, group: int, columns: Sequence[str]) -> int:
  """What the footer says `columns` of row group `group` take uncompressed (their leaf
  column chunks: `a`, or `a.list.element` of a nested `a`)."""
  row_group = metadata.row_group(group)
  total = 0
  for leaf in range(row_group.num_columns):
    chunk = row_group.column(leaf)
    if any(chunk.path_in_schema == c or chunk.path_in_schema.startswith(c + ".")
           for c in columns):
      total += chunk.total_uncompressed_size
  return total


def _rewrite(rows: int, size: int) -> str:
  """The fix for a row group too large: smaller row groups, sized to half the cap."""
  suggested = max(1, rows * MAX_ROW_GROUP_BYTES // max(size, 1) // 2)
  return ("rewrite the file with smaller row groups, e.g. pyarrow.parquet.write_table(table, "
          f"path, row_group_size={suggested})")


def _read_row_group(file: str, group: int, columns: Sequence[str], rows: int,
                    stored: int) -> pa.Table:
  """Row group `group`'s `columns`, decoded DECODE_ROWS at a time and refused once past
  MAX_ROW_GROUP_BYTES: the footer's sizes are what the file claims, and a dictionary or
  delta encoding (or a forged footer) decodes to far more than they say."""
  batches, size = [], 0
  reader = pq.ParquetFile(file)
  for batch in reader.iter_batches(batch_size=DECODE_ROWS, row_groups=[group],
                                   columns=list(columns)):
    size += batch.nbytes
    batches.append(batch)
    if size > MAX_ROW_GROUP_BYTES:
      decoded = sum(b.num_rows for b in batches)
      raise ValueError(
          f"{file}: row group {group} decodes to more than {MAX_ROW_GROUP_BYTES} bytes "
          f"(sao_jax.data.tables.MAX_ROW_GROUP_BYTES) in its first {decoded} of {rows} rows, "
          f"though its footer says its columns {', '.join(columns)} take {stored} bytes "
          "(a dictionary or delta encoding of long repeated values, or a forged footer); "
          + _rewrite(decoded, size))
  decoded = sum(b.num_rows for b in batches)
  if decoded != rows:
    raise ValueError(f"{file}: row group {group} decodes to {decoded} rows but its footer says "
                     f"{rows}; a corrupt or forged file, rewrite it with pyarrow.parquet")
  if not batches:
    return reader.read_row_group(group, columns=list(columns))
  return pa.Table.from_batches(batches)


def open_saved_dataset(path: str | os.PathLike, columns: Sequence[str]) -> ColumnTable:
  """A directory written by `datasets.Dataset.save_to_disk`, memory-mapped."""
  path = pathlib.Path(path)
  if (path / DATASET_DICT_FILE).is_file():
    splits = sorted(p.name for p in path.iterdir() if (p / STATE_FILE).is_file())
    raise ValueError(f"{path} holds a DatasetDict (splits {', '.join(splits)}); point "
                     f"env.dataset.path at one split's directory, e.g. {path / splits[0]}"
                     if splits else f"{path} holds a DatasetDict without splits")
  state_file = path / STATE_FILE
  if not state_file.is_file():
    raise ValueError(f"{path} has no {STATE_FILE}; expected a directory written by "
                     "datasets' save_to_disk (or use task_source='parquet' for Parquet files)")
  try:
    names = [entry["filename"] for entry in json.loads(state_file.read_text())["_data_files"]]
  except (ValueError, KeyError, TypeError) as error:
    raise ValueError(f"{state_file}: not a save_to_disk state file (no list of "
                     f"'_data_files' with 'filename's: {error!r})") from None
  chunks = []
  for name in names:
    # state.json is input: a file name that climbs out of the directory is refused.
    if not isinstance(name, str) or pathlib.Path(name).name != name or name in ("", ".", ".."):
      raise ValueError(f"{state_file}: data file name {name!r} is not a plain file name "
                       "inside the dataset directory")
    table = _map_arrow(str(path / name))
    _check_columns(str(path / name), table.schema.names, columns)
    chunks.append(_Chunk(str(path / name), 0, table.num_rows,
                         lambda t=table.select(list(columns)): t))
  return ColumnTable(chunks, columns, name=path.name)


def _map_arrow(file: str) -> pa.Table:
  """An Arrow IPC file (stream format, as `datasets` writes; or the file format),
  memory-mapped: the table's buffers point into the mapping."""
  try:
    source = pa.memory_map(file)
  except OSError as error:
    raise ValueError(f"{file}: cannot open the data file ({error})") from None
  try:
    return pa.ipc.open_stream(source).read_all()
  except pa.ArrowInvalid:
    source.seek(0)
  try:
    return pa.ipc.open_file(source).read_all()
  except pa.ArrowInvalid as error:
    raise ValueError(f"{file}: not an Arrow IPC stream or file ({error})") from None
