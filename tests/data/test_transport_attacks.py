"""Attacks on the sealed directory transport by a peer who can read and write the shared
directory but does not hold the run secret: each test reproduces one attack that worked
before the fix it names."""

import os
import threading

import numpy as np
import pytest

from sao_jax.channel import sealed
from sao_jax.channel.transport import DirectoryTransport
from sao_jax.data import pipeline
from traj_factory import make_traj

MAX_TOKENS = 64
SECRET = b"the run's shared secret, 32 byte"


def transport(path, capacity=8, writer_id=None) -> DirectoryTransport:
  return DirectoryTransport(path, capacity, writer_id=writer_id, max_tokens=MAX_TOKENS,
                            secret=SECRET)


def reader_of(path, capacity=8, drops=None) -> DirectoryTransport:
  reader = DirectoryTransport(path, capacity, max_tokens=MAX_TOKENS, secret=SECRET, drops=drops)
  reader.start_run()
  return reader


def within(action, seconds=10.0):
  """`action()`'s result, from a thread that must finish within `seconds` (a stall fails)."""
  got = []
  worker = threading.Thread(target=lambda: got.append(action()), daemon=True)
  worker.start()
  worker.join(seconds)
  assert not worker.is_alive(), "stalled"
  return got[0]


def test_an_earlier_run_s_markers_put_back_neither_stop_nor_turn_the_samplers(tmp_path):
  # Both markers of a finished run are validly signed. Put back, they made every sampler
  # of the current run write for the old run (records the learner drops) and then see it
  # closed: the run stopped, and each sampler said the learner closed it.
  earlier = reader_of(tmp_path)
  earlier.close()
  old_run, old_close = (tmp_path / "RUN").read_bytes(), (tmp_path / "CLOSED").read_bytes()
  reader = reader_of(tmp_path)
  sampler = transport(tmp_path, writer_id="w")
  assert sampler.running
  (tmp_path / "RUN").write_bytes(old_run)
  (tmp_path / "CLOSED").write_bytes(old_close)
  assert sampler.running and not sampler.closed
  sampler.put(make_traj(seed=1))
  np.testing.assert_array_equal(reader.get(timeout=0.5).tokens, make_traj(seed=1).tokens)
  # A sampler host that starts now finds the learner's own marker again.
  assert transport(tmp_path).running
  assert not reader.drops


def test_a_newer_learner_s_run_is_left_to_it(tmp_path):
  """The learner puts its RUN marker back only over an older or unsigned one: a learner
  restarted while the old one still polls must not be fought over the marker."""
  old = reader_of(tmp_path)
  new = reader_of(tmp_path)
  marker = (tmp_path / "RUN").read_bytes()
  assert old.get(timeout=0.05) is None
  assert (tmp_path / "RUN").read_bytes() == marker
  (tmp_path / "RUN").write_bytes(b"not a marker")
  assert new.get(timeout=0.05) is None
  assert (tmp_path / "RUN").read_bytes() == marker


@pytest.mark.parametrize("trap", ["link", "fifo"])
def test_a_trap_at_a_writer_s_next_temporary_name_is_never_written_through(tmp_path, trap):
  # A writer's next temporary file name followed from the names it had written: a link
  # there made it overwrite any file it could write (here the peer's chosen victim), a
  # FIFO blocked it forever.
  reader = reader_of(tmp_path)
  sampler = transport(tmp_path, writer_id="w")
  sampler.put(make_traj(seed=1))
  assert reader.get(timeout=0.5) is not None
  victim = tmp_path.parent / f"{tmp_path.name}-victim"
  victim.write_bytes(b"precious")
  for prompt in range(4):  # the peer guesses the next prompt ids too
    squat = tmp_path / f"w-000000000001.p{prompt}.traj.tmp"
    if trap == "link":
      os.symlink(victim, squat)
    else:
      os.mkfifo(squat)
  within(lambda: sampler.put(make_traj(seed=2, prompt_id=1)))
  assert victim.read_bytes() == b"precious"
  np.testing.assert_array_equal(reader.get(timeout=0.5).tokens, make_traj(seed=2).tokens)


def squat_directory(path):
  path.mkdir()
  (path / "inside").write_bytes(b"")


@pytest.mark.parametrize("name", ["RUN", "CLOSED", "w-000000000000.p0.traj"])
def test_a_directory_squatting_a_name_the_learner_or_a_sampler_uses_is_moved_aside(
    tmp_path, name):
  # A sampler reading a marker that was a directory crashed (open() refuses one), and a
  # rename cannot replace one: RUN there crashed the learner at start, CLOSED there
  # crashed its close (so the samplers never stopped), and a record's next name there
  # crashed the sampler, again after every restart.
  sampler = transport(tmp_path, writer_id="w")
  if name == "RUN":
    squat_directory(tmp_path / name)
    assert not sampler.running
  reader = reader_of(tmp_path)
  if name != "RUN":
    squat_directory(tmp_path / name)
  assert sampler.running and not sampler.closed
  sampler.put(make_traj(seed=1))
  np.testing.assert_array_equal(reader.get(timeout=0.5).tokens, make_traj(seed=1).tokens)
  reader.close()
  assert sampler.closed and not sampler.running


def test_directories_named_like_records_cost_the_reader_no_file_descriptors(tmp_path):
  # Each one leaked the descriptor the reader opened it with: a thousand of them and the
  # learner could open nothing, every real record then quarantined as unreadable.
  reader = reader_of(tmp_path)
  for seq in range(20):
    squat_directory(tmp_path / f"x-{seq}.p0.traj")
  before = len(os.listdir("/proc/self/fd"))
  assert reader.get(timeout=0.05) is None
  assert len(os.listdir("/proc/self/fd")) == before
  assert dict(reader.drops) == {"quarantined_unreadable": 20}


def test_entries_the_reader_cannot_remove_do_not_fill_the_writers_capacity(tmp_path):
  # A directory named like a record, whose quarantine name is taken by another non-empty
  # directory, can be neither moved nor deleted; `capacity` of them blocked every writer
  # for good (each counted them as records waiting to be read).
  reader = reader_of(tmp_path, capacity=2)
  (tmp_path / "quarantine").mkdir()
  for seq in range(2):
    name = f"x-{seq}.p0.traj"
    squat_directory(tmp_path / "quarantine" / f"{name}.unreadable")
    squat_directory(tmp_path / name)
  assert reader.get(timeout=0.05) is None
  assert dict(reader.drops) == {"quarantined_unreadable": 2}
  sampler = transport(tmp_path, capacity=2, writer_id="w")
  sampler.put(make_traj(seed=1), timeout=0.5)
  np.testing.assert_array_equal(reader.get(timeout=0.5).tokens, make_traj(seed=1).tokens)


def test_a_record_name_that_is_not_utf8_is_quarantined_and_reported(tmp_path):
  # The name went into the MAC as UTF-8, which a name of arbitrary bytes is not: the
  # reader crashed (UnicodeEncodeError) on every read, and its example crashed the log.
  reader = reader_of(tmp_path, drops=pipeline.Drops())
  name = b"\xff-000000000000.p0.traj"
  with open(os.path.join(os.fsencode(tmp_path), name), "wb") as file:
    file.write(sealed.RECORD_MAGIC + bytes(sealed.MAC_BYTES))
  assert reader.get(timeout=0.05) is None
  assert dict(reader.drops) == {"quarantined_bad_signature": 1}
  reader.drops.examples["quarantined_bad_signature"].encode()  # printable: log() must not crash
  assert os.listdir(os.fsencode(tmp_path / "quarantine")) == [name + b".bad_signature"]


# What a terminal would do with it: write the clipboard, erase the line, forge a line.
ESCAPES = "\x1b]52;c;Y3VybCBldmlsLnNofHNo\x07\x1b[2K\r\nstep 1000 | reward 1.000"  # no "/": a name


def test_a_record_name_holding_escape_sequences_reaches_the_log_escaped(tmp_path):
  # The example the learner logs held the peer's name as it was: a terminal tailing the
  # log ran its escape sequences and showed a forged progress line.
  reader = reader_of(tmp_path, drops=pipeline.Drops())
  name = f"{ESCAPES}-000000000000.p0.traj"
  (tmp_path / name).write_bytes(sealed.RECORD_MAGIC + bytes(sealed.MAC_BYTES))
  assert reader.get(timeout=0.05) is None
  example = reader.drops.examples["quarantined_bad_name"]
  assert example.isprintable() and "\\x1b]52;" in example and "\\nstep 1000" in example


def test_a_marker_swapped_away_and_back_while_a_sampler_looks_is_read_again(tmp_path,
                                                                              monkeypatch):
  # A writer knew the marker by its file's identity, taken before reading it: a peer who
  # swapped the file away and back in between left it never reading the real one again,
  # and a sampler host starting then waited for the run for good.
  reader_of(tmp_path)
  sampler = transport(tmp_path, writer_id="w")
  run, aside = tmp_path / "RUN", tmp_path / ".RUN.aside"
  real_read_small = sealed.read_small

  def read_while_swapped(path, limit):
    if path.name != "RUN":
      return real_read_small(path, limit)
    run.rename(aside)
    run.write_bytes(b"a peer's file")
    try:
      return real_read_small(path, limit)
    finally:
      aside.rename(run)

  monkeypatch.setattr(sealed, "read_small", read_while_swapped)
  assert not sampler.running
  monkeypatch.setattr(sealed, "read_small", real_read_small)
  assert sampler.running


def test_a_link_swapped_in_for_the_quarantine_folder_is_not_followed(tmp_path, monkeypatch):
  # The folder was checked, then renamed into by path: a link a peer swapped in between
  # (it can keep swapping) had the learner move files the peer chose into any directory
  # it can write.
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  shared = tmp_path / "shared"
  reader = reader_of(shared)
  (shared / "quarantine").mkdir()
  (shared / "w-000000000000.p0.traj").write_bytes(b"a peer's file")
  real_rename = os.rename

  def rename_after_a_swap(src, dst, **kwargs):
    if (shared / "quarantine").is_dir() and not (shared / "quarantine").is_symlink():
      real_rename(shared / "quarantine", shared / "checked")
      os.symlink(elsewhere, shared / "quarantine")
    return real_rename(src, dst, **kwargs)

  monkeypatch.setattr(os, "rename", rename_after_a_swap)
  assert reader.get(timeout=0.05) is None
  monkeypatch.setattr(os, "rename", real_rename)
  assert not list(elsewhere.iterdir())
  assert dict(reader.drops) == {"quarantined_bad_signature": 1}
  assert os.listdir(shared / "checked") == ["w-000000000000.p0.traj.bad_signature"]


def test_stray_files_do_not_fill_quarantine_forever(tmp_path, monkeypatch):
  # 20,000 stray files stayed in quarantine/ for good. Now it keeps at most
  # QUARANTINE_FILES files (and QUARANTINE_BYTES bytes), the oldest dropped and counted.
  monkeypatch.setattr(DirectoryTransport, "QUARANTINE_FILES", 40)
  reader = reader_of(tmp_path)
  for i in range(200):
    (tmp_path / f"stray{i}.traj").write_bytes(b"x")
    assert within(lambda: reader.get(timeout=0)) is None
  kept = os.listdir(tmp_path / "quarantine")
  assert len(kept) <= 40
  assert reader.drops["quarantined_bad_name"] == 200
  assert reader.drops["quarantine_pruned"] == 200 - len(kept)
  assert "stray199.traj.bad_name" in kept and "stray0.traj.bad_name" not in kept


def test_quarantine_is_bounded_in_bytes_too(tmp_path, monkeypatch):
  monkeypatch.setattr(DirectoryTransport, "QUARANTINE_BYTES", 64 << 10)
  reader = reader_of(tmp_path)
  for i in range(40):
    (tmp_path / f"big{i}.traj").write_bytes(os.urandom(8 << 10))
    within(lambda: reader.get(timeout=0))
  sizes = [os.path.getsize(tmp_path / "quarantine" / n) for n in os.listdir(tmp_path / "quarantine")]
  assert sum(sizes) <= 64 << 10
  assert reader.drops["quarantine_pruned"] == 40 - len(sizes) > 0


def test_pruning_never_deletes_outside_quarantine(tmp_path, monkeypatch):
  # A link a peer put into quarantine/ is unlinked as a name, its target never touched.
  monkeypatch.setattr(DirectoryTransport, "QUARANTINE_FILES", 8)
  outside = tmp_path.parent / f"{tmp_path.name}_outside"
  outside.mkdir()
  (outside / "precious").write_bytes(b"keep")
  (tmp_path / "quarantine").mkdir()
  os.symlink(outside / "precious", tmp_path / "quarantine" / "link")
  reader = reader_of(tmp_path)
  for i in range(40):
    (tmp_path / f"stray{i}.traj").write_bytes(b"x")
    within(lambda: reader.get(timeout=0))
  assert (outside / "precious").read_bytes() == b"keep"
  assert len(os.listdir(tmp_path / "quarantine")) <= 8 + 1
