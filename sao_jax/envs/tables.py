"""Rows of columnar dataset files by index, without holding the files in memory.

    table = open_parquet("gsm8k/test.parquet", ["question", "answer"])
    table = open_saved_dataset("math500/", ["problem", "answer"])   # save_to_disk output
    len(table); table.row(17)   # -> Row(file, index in the file, {column: value})
    for row in table.rows(): ...  # every row in order, a row group at a time

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
heap. Its files are input too: only the named columns are read, a file with
compressed batches (which pyarrow decompresses into the heap, whatever the
file's size) is refused before a batch is read, and the named columns are
validated in full when opened (offsets past their data would read outside the
mapping: a crash, or other memory in a prompt), a scan of their bytes through
the mapping.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import json
import os
import pathlib
import struct
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

CACHED_CHUNKS = 2  # decoded Parquet row groups kept; a shuffled read hits one group at a time
MAX_ROW_GROUP_BYTES = 256 << 20  # bytes one Parquet row group's named columns may decode into
DECODE_ROWS = 1024  # rows of a row group decoded at a time, each step checked against the cap
STATE_FILE = "state.json"  # what save_to_disk writes beside the .arrow files
DATASET_DICT_FILE = "dataset_dict.json"  # save_to_disk of a DatasetDict (one directory per split)
_FILE_MAGIC = b"ARROW1"  # how an Arrow IPC file (not stream) starts
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3  # MessageHeader union types of an IPC message


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

  def rows(self) -> Iterator[Row]:
    """Every row in order, decoded DECODE_ROWS at a time: a scan (`row` slices one row
    out of a group per call) that holds one group's named columns, like `row`."""
    for position, chunk in enumerate(self._chunks):
      offset = 0
      for batch in self._table(position).to_batches(max_chunksize=DECODE_ROWS):
        for values in batch.to_pylist():
          yield Row(chunk.file, chunk.first + offset, values)
          offset += 1

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
                         f"a row group may decode to (sao_jax.envs.tables.MAX_ROW_GROUP_BYTES); "
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
          f"(sao_jax.envs.tables.MAX_ROW_GROUP_BYTES) in its first {decoded} of {rows} rows, "
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
    table = _map_arrow(str(path / name), columns)
    chunks.append(_Chunk(str(path / name), 0, table.num_rows, lambda t=table: t))
  return ColumnTable(chunks, columns, name=path.name)


def _map_arrow(file: str, columns: Sequence[str]) -> pa.Table:
  """The named columns of an Arrow IPC file (stream format, as `datasets` writes; or the
  file format), memory-mapped: the table's buffers point into the mapping. The file is
  input: compressed batches (decompressed into memory, however small the file) are
  refused before they are read, and the columns are validated in full (offsets that
  point past their data would read memory outside the mapping when a row is read)."""
  try:
    mapped = pa.memory_map(file).read_buffer()  # zero-copy: the mapping itself
  except OSError as error:
    raise ValueError(f"{file}: cannot open the data file ({error})") from None
  file_format = mapped.slice(0, 6).to_pybytes() == _FILE_MAGIC
  open_reader = pa.ipc.open_file if file_format else pa.ipc.open_stream
  try:
    names = open_reader(mapped).schema.names
    _check_columns(file, names, columns)
    _refuse_compressed(file, mapped.slice(8) if file_format else mapped)
    options = pa.ipc.IpcReadOptions(included_fields=[names.index(c) for c in columns])
    table = open_reader(mapped, options=options).read_all().select(list(columns))
  except (pa.ArrowException, struct.error, IndexError) as error:
    raise ValueError(f"{file}: not an Arrow IPC stream or file ({error})") from None
  try:
    table.validate(full=True)
  except pa.ArrowInvalid as error:
    raise ValueError(f"{file}: invalid Arrow data in the columns {', '.join(columns)} "
                     f"({error}); a corrupt or forged file, write it again with datasets' "
                     "save_to_disk") from None
  return table


def _refuse_compressed(file: str, stream: pa.Buffer) -> None:
  """Refuses an IPC stream with a compressed (LZ4, ZSTD) record or dictionary batch, read
  from each message's flatbuffer metadata before any batch is decoded: `datasets` writes
  none, and pyarrow would decompress every batch into memory on reading it."""
  reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(stream))
  while True:
    try:
      message = reader.read_next_message()
    except StopIteration:
      return
    if message is None:
      return
    if _compressed(message.metadata.to_pybytes()):
      raise ValueError(
          f"{file}: its {message.type} messages are compressed, which pyarrow decompresses "
          "into memory instead of memory-mapping them (a small file can decode to gigabytes); "
          "write it again uncompressed, as datasets' save_to_disk does (or "
          "pyarrow.ipc.new_stream without IpcWriteOptions(compression=...))")


def _compressed(metadata: bytes) -> bool:
  """Whether an IPC message's metadata (a flatbuffer `Message`, format/Message.fbs) is a
  record batch, or a dictionary batch, whose `compression` field is set."""
  def table(position):  # field index -> its absolute position, None where absent
    vtable = position - struct.unpack_from("<i", metadata, position)[0]
    size = struct.unpack_from("<H", metadata, vtable)[0]

    def field(index):
      slot = 4 + 2 * index
      offset = struct.unpack_from("<H", metadata, vtable + slot)[0] if slot < size else 0
      return position + offset if offset else None
    return field

  def follow(position):  # an offset field -> the table it points to
    return table(position + struct.unpack_from("<I", metadata, position)[0])

  message = table(struct.unpack_from("<I", metadata, 0)[0])
  # Message: version 0, header_type 1, header 2; RecordBatch: length 0, nodes 1,
  # buffers 2, compression 3; DictionaryBatch: id 0, data 1 (a RecordBatch).
  kind = metadata[message(1)] if message(1) is not None else 0
  if kind not in (_DICTIONARY_BATCH, _RECORD_BATCH) or message(2) is None:
    return False
  batch = follow(message(2))
  if kind == _DICTIONARY_BATCH:
    if batch(1) is None:
      return False
    batch = follow(batch(1))
  return batch(3) is not None
