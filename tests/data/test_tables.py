"""Hostile dataset files: a Parquet row group (or a save_to_disk Arrow file) that would
decode into far more memory than its footer or its size on disk says is refused, with
the file, the row group, the size, the cap and the fix."""

import json
import pathlib
import struct
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sao_jax.envs import tables

CAP = 1 << 20  # MAX_ROW_GROUP_BYTES in these tests
ROWS, WIDTH = 2000, 1000  # 2 MB of text: twice the cap


def _varint(value: int, length: int | None = None) -> bytes:
  """Thrift's compact encoding of an i32/i64 (zigzag, then a varint), padded to `length`
  bytes with continuation bits (readers accept the non-minimal form)."""
  value = (value << 1) ^ (value >> 63)
  out = bytearray()
  while value or not out or (length and len(out) < length):
    out.append(value & 0x7F | 0x80)
    value >>= 7
  out[-1] &= 0x7F
  return bytes(out)


def _forge(path, old: int, new: int, keep=lambda metadata: True) -> None:
  """Rewrites the footer of `path`: each i64 field holding `old` for which `keep(metadata)`
  holds afterwards now says `new`, in as many bytes (the footer keeps its length)."""
  data = bytearray(path.read_bytes())
  footer_start = len(data) - 8 - struct.unpack("<I", data[-8:-4])[0]
  was = _varint(old)
  position = data.find(was, footer_start)
  assert position > 0, "the value is not in the footer"
  while position > 0:
    forged = data[:position] + _varint(new, len(was)) + data[position + len(was):]
    path.write_bytes(forged)
    if keep(pq.ParquetFile(path).metadata):
      data = forged
    position = data.find(was, position + 1)
  path.write_bytes(data)


def _decoded_bytes(path) -> int:
  """What reading the row group whole (the old code) allocates for it."""
  return pq.ParquetFile(path).read_row_group(0).nbytes


@pytest.fixture(autouse=True)
def small_cap(monkeypatch):
  monkeypatch.setattr(tables, "MAX_ROW_GROUP_BYTES", CAP, raising=False)
  monkeypatch.setattr(tables, "DECODE_ROWS", 64, raising=False)  # old code: no such names


def test_a_row_group_larger_than_the_cap_is_refused_at_open(tmp_path):
  path = tmp_path / "big.parquet"
  pq.write_table(pa.table({"q": ["a" * WIDTH] * ROWS, "small": list(range(ROWS))}), path,
                 use_dictionary=False, compression="zstd")  # a 2 MB group in a 20 kB file
  assert _decoded_bytes(path) > CAP
  with pytest.raises(ValueError) as info:
    tables.open_parquet(path, ["q"])
  message = str(info.value)
  assert f"{path}: row group 0 holds 20" in message and f"than the {CAP} " in message
  assert "MAX_ROW_GROUP_BYTES" in message and "row_group_size=521)" in message
  # Only the named columns count: the small one alone opens and reads.
  assert tables.open_parquet(path, ["small"]).row(1999).values == {"small": 1999}


def test_a_dictionary_bomb_that_the_footer_understates_is_refused_while_decoding(tmp_path):
  """One long string repeated: the footer counts it once (its dictionary page), decoding
  writes it out per row. The old code read the group whole: 2 MB for a 10 kB footer."""
  path = tmp_path / "bomb.parquet"
  pq.write_table(pa.table({"q": ["a" * WIDTH] * ROWS}), path, compression="zstd")
  stored = pq.ParquetFile(path).metadata.row_group(0).column(0).total_uncompressed_size
  assert stored < CAP < _decoded_bytes(path)
  table = tables.open_parquet(path, ["q"])  # the footer passes
  with pytest.raises(ValueError) as info:
    table.row(0)
  message = str(info.value)
  assert f"{path}: row group 0 decodes to more than {CAP} bytes" in message
  assert f"take {stored} bytes" in message and "row_group_size=" in message


def test_a_forged_footer_that_understates_a_row_group_is_refused_while_decoding(tmp_path):
  path = tmp_path / "forged.parquet"
  pq.write_table(pa.table({"q": ["a" * WIDTH] * ROWS}), path, use_dictionary=False,
                 compression="zstd")
  stored = pq.ParquetFile(path).metadata.row_group(0).column(0).total_uncompressed_size
  _forge(path, stored, 100)  # the column chunk's and the row group's sizes
  metadata = pq.ParquetFile(path).metadata
  assert metadata.row_group(0).column(0).total_uncompressed_size == 100
  assert metadata.row_group(0).total_byte_size == 100
  assert _decoded_bytes(path) > CAP
  table = tables.open_parquet(path, ["q"])
  with pytest.raises(ValueError, match=r"decodes to more than 1048576 bytes .* take 100 bytes"):
    table.row(ROWS - 1)


def test_a_footer_claiming_more_rows_than_the_group_holds_is_refused(tmp_path):
  """The old code indexed rows by the footer's count and failed with an IndexError on the
  missing row."""
  path = tmp_path / "rows.parquet"
  pq.write_table(pa.table({"q": [f"x{i}" for i in range(300)]}), path)
  _forge(path, 300, 301, keep=lambda m: m.row_group(0).num_rows == 301 and m.num_rows == 300)
  table = tables.open_parquet(path, ["q"])
  assert len(table) == 301
  with pytest.raises(ValueError, match=r"row group 0 decodes to 300 rows but its footer says 301"):
    table.row(300)


def test_row_groups_under_the_cap_read_in_steps_as_before(tmp_path):
  path = tmp_path / "ok.parquet"
  text = [f"row {i} " + "b" * (i % 50) for i in range(ROWS)]
  pq.write_table(pa.table({"q": text, "n": list(range(ROWS))}), path, row_group_size=700)
  table = tables.open_parquet(path, ["n", "q"])
  assert [table.row(i).values for i in (0, 699, 700, 1999)] == [
      {"n": i, "q": text[i]} for i in (0, 699, 700, 1999)]
  assert table.row(1400).file == str(path) and table.row(1400).index == 1400


def _saved(directory, table, *, file_format=False, **options):
  """`table` in save_to_disk's layout (state.json + one Arrow IPC file), written with
  `options` (pyarrow.ipc.IpcWriteOptions)."""
  directory.mkdir()
  path = directory / "data-00000-of-00001.arrow"
  with pa.OSFile(str(path), "wb") as sink:
    new = pa.ipc.new_file if file_format else pa.ipc.new_stream
    with new(sink, table.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
      writer.write_table(table, max_chunksize=ROWS // 2)
  (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": path.name}]}))
  return path


def test_a_compressed_save_to_disk_file_is_refused_before_it_is_decompressed(tmp_path):
  """save_to_disk files are memory-mapped; a compressed one is decompressed into memory
  whole when opened (every column, the old code): 2 MB from a 1 kB file here."""
  table = pa.table({"q": ["a" * WIDTH] * ROWS, "n": list(range(ROWS))})
  path = _saved(tmp_path / "bomb", table, compression="zstd")
  assert path.stat().st_size < 10_000
  before = pa.total_allocated_bytes()
  decoded = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
  assert pa.total_allocated_bytes() - before > CAP
  del decoded
  before = pa.total_allocated_bytes()
  with pytest.raises(ValueError, match=rf"{path}: its (record batch|dictionary) messages are "
                     r"compressed.*write it again uncompressed"):
    tables.open_saved_dataset(tmp_path / "bomb", ["n"])
  assert pa.total_allocated_bytes() - before < CAP // 8
  _saved(tmp_path / "file", table, file_format=True, compression="lz4")  # the file format too
  with pytest.raises(ValueError, match="compressed"):
    tables.open_saved_dataset(tmp_path / "file", ["n"])


def test_offsets_past_their_data_are_refused_at_open(tmp_path):
  """A string column whose offsets point 100 MB past its data: reading the row read
  memory outside the mapping (the old code crashed with SIGSEGV, in a subprocess here)."""
  path = _saved(tmp_path / "forged", pa.table({"q": ["abcdefgh", "ijklmnop"]}))
  data = bytearray(path.read_bytes())
  offsets = data.find(struct.pack("<iii", 0, 8, 16))
  data[offsets + 8:offsets + 12] = struct.pack("<i", 100_000_000)
  path.write_bytes(data)
  read = ("import sys; from sao_jax.envs import tables\n"
          "print(tables.open_saved_dataset(sys.argv[1], ['q']).row(1))")
  root = pathlib.Path(tables.__file__).parents[2]  # this checkout's sao_jax
  result = subprocess.run([sys.executable, "-c", read, str(tmp_path / "forged")], cwd=root,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1, (result.returncode, result.stderr[-500:])
  assert f"ValueError: {path}: invalid Arrow data in the columns q" in result.stderr
  assert "offsets (100000000) larger than values" in result.stderr


def test_saved_files_map_only_the_named_columns_in_either_ipc_format(tmp_path):
  table = pa.table({"q": [f"q{i}" for i in range(ROWS)], "n": list(range(ROWS))})
  for name, file_format in (("stream", False), ("file", True)):
    _saved(tmp_path / name, table, file_format=file_format)
    read = tables.open_saved_dataset(tmp_path / name, ["n", "q"])
    assert len(read) == ROWS and read.row(1999).values == {"n": 1999, "q": "q1999"}
    assert read._table(0).column_names == ["n", "q"]
