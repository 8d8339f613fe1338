"""Queue and directory transports: order, backpressure, close, atomic records, and
poison-pill records and races in the shared directory."""

import io
import json
import multiprocessing
import os
import pickle
import queue
import threading
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from sao_jax.channel import records, sealed
from sao_jax.channel.transport import DirectoryTransport, QueueTransport, TransportClosed
from sao_jax.data import pipeline
from traj_factory import make_traj

MAX_TOKENS = 64  # sampler.max_seq_len of these tests' records (make_traj: 10 tokens)
SECRET = b"the run's shared secret, 32 byte"


def reader_of(path, capacity=8, **kwargs) -> DirectoryTransport:
  """A learner's end of the directory `path`, with a run started (RUN marker written)."""
  reader = DirectoryTransport(path, capacity, max_tokens=MAX_TOKENS, secret=SECRET, **kwargs)
  reader.start_run()
  return reader


def plant(path, payload: bytes, secret: bytes = SECRET) -> None:
  """Writes `payload` as the record file `path`, sealed for the directory's current run with
  `secret`: what an insider (a host holding the secret) could write."""
  _, nonce = sealed.read_run(SECRET, (path.parent / "RUN").read_bytes())
  path.write_bytes(sealed.seal(secret, nonce, path.name, payload))


def transports(tmp_path, capacity):
  return [QueueTransport(capacity, multiprocessing.get_context("spawn")),
          reader_of(tmp_path / "records", capacity)]


@pytest.mark.parametrize("index", [0, 1], ids=["queue", "directory"])
def test_in_order_delivery_and_backpressure(tmp_path, index):
  transport = transports(tmp_path, capacity=2)[index]
  transport.put(make_traj(seed=1))
  time.sleep(0.01)  # distinct mtimes for the directory backend
  transport.put(make_traj(seed=2))
  with pytest.raises(queue.Full):  # full: the writer is held back
    transport.put(make_traj(seed=3), timeout=0.3)
  first = transport.get(timeout=1.0)
  np.testing.assert_array_equal(first.tokens, make_traj(seed=1).tokens)
  transport.put(make_traj(seed=3), timeout=1.0)  # room again
  assert transport.get(timeout=1.0) is not None and transport.get(timeout=1.0) is not None
  assert transport.get(timeout=0.1) is None


@pytest.mark.parametrize("index", [0, 1], ids=["queue", "directory"])
def test_close_releases_a_blocked_writer(tmp_path, index):
  transport = transports(tmp_path, capacity=1)[index]
  transport.put(make_traj())
  errors = []

  def writer():
    try:
      transport.put(make_traj())
    except TransportClosed as error:
      errors.append(error)

  thread = threading.Thread(target=writer)
  thread.start()
  time.sleep(0.2)
  transport.close()
  thread.join(timeout=5)
  assert not thread.is_alive() and errors and transport.closed


def test_directory_reader_ignores_partial_records(tmp_path):
  transport = reader_of(tmp_path, capacity=4)
  (tmp_path / "w-000000000001.traj.tmp").write_bytes(b"half a record")
  assert transport.get(timeout=0.1) is None
  transport.put(make_traj(seed=5))
  assert transport.get(timeout=0.5) is not None


def test_bad_capacity_is_named(tmp_path):
  with pytest.raises(ValueError, match="capacity=0"):
    QueueTransport(0)
  with pytest.raises(ValueError, match="capacity=-1"):
    DirectoryTransport(tmp_path, -1, max_tokens=MAX_TOKENS, secret=SECRET)
  with pytest.raises(ValueError, match="secret holds 4 bytes; a secret needs at least 16"):
    DirectoryTransport(tmp_path, 4, max_tokens=MAX_TOKENS, secret=b"1234")


@pytest.mark.parametrize("by_prompt", [False, True], ids=["by_record", "by_prompt"])
def test_directory_readers_split_the_records_without_overlap(tmp_path, by_prompt):
  # The first learner host announces the run; the others read for the nonce it drew.
  readers = [DirectoryTransport(tmp_path, capacity=64, shard=(i, 3), by_prompt=by_prompt,
                                max_tokens=MAX_TOKENS, secret=SECRET) for i in range(3)]
  nonce = b"n" * sealed.NONCE_BYTES
  for i, reader in enumerate(readers):
    reader.start_run(nonce, announce=i == 0)
  writers = [DirectoryTransport(tmp_path, capacity=64, writer_id=f"w{i}", max_tokens=MAX_TOKENS,
                                secret=SECRET) for i in range(2)]
  for seed in range(12):
    writers[seed % 2].put(make_traj(seed=seed, prompt_id=seed % 5))
  got = [[] for _ in readers]
  for reader, mine in zip(readers, got):
    while (traj := reader.get()) is not None:
      mine.append(traj)
  tokens = [sorted(t.tokens.tobytes() for t in mine) for mine in got]
  everything = sorted(make_traj(seed=s).tokens.tobytes() for s in range(12))
  assert sorted(sum(tokens, [])) == everything, "every record read exactly once"
  assert all(len(mine) > 0 for mine in got), [len(m) for m in got]
  if by_prompt:  # a prompt's records (a GRPO group) all reach one reader
    owners = {t.prompt_id: i for i, mine in enumerate(got) for t in mine}
    assert all(owners[t.prompt_id] == i for i, mine in enumerate(got) for t in mine)
    assert all(t.prompt_id % 3 == i for i, mine in enumerate(got) for t in mine)


def test_directory_copies_in_other_processes_are_new_writers(tmp_path):
  # The learner's end, with its pipeline's drop counter, is what spawned samplers get.
  writer = reader_of(tmp_path, capacity=8, drops=pipeline.Drops())
  copies = [pickle.loads(pickle.dumps(writer)) for _ in range(2)]
  for seed, copy in enumerate(copies):  # same sequence number 0 in each copy
    copy.put(make_traj(seed=seed))
  assert len(list(tmp_path.glob("*.traj"))) == 2, "a copy overwrote another's record"
  assert writer.get() is not None and writer.get() is not None


def test_directory_shard_is_checked_and_a_new_run_ends_the_old_close(tmp_path):
  with pytest.raises(ValueError, match=r"shard=\(2, 2\)"):
    DirectoryTransport(tmp_path, 4, shard=(2, 2), max_tokens=MAX_TOKENS, secret=SECRET)
  transport = reader_of(tmp_path, 4)
  transport.close()
  with pytest.raises(TransportClosed):
    transport.put(make_traj(seed=0))
  transport.start_run()
  transport.put(make_traj(seed=0))
  assert not transport.closed and transport.get() is not None


def archive(compression=zipfile.ZIP_STORED, **members: np.ndarray) -> bytes:
  """An .npz of `members` (name -> array) written member by member, as an attacker could."""
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", compression) as out:
    for name, array in members.items():
      member = io.BytesIO()
      np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
      out.writestr(f"{name}.npy", member.getvalue())
  return buffer.getvalue()


def record_members(traj, meta=None) -> dict[str, np.ndarray]:
  """The members `records.to_bytes` writes, with `meta` (any JSON text) if given."""
  meta = meta if meta is not None else json.dumps(
      {"prompt_id": traj.prompt_id, "policy_versions": list(traj.policy_versions),
       "env_failure": None, "info": {}})
  return {"meta": np.frombuffer(meta.encode(), np.uint8),
          **{name: getattr(traj, name) for name in records.ARRAYS}}


def poison(case: str) -> bytes:
  """A payload the parser must refuse (sealed by `plant`: an insider's, past the MAC)."""
  good = records.to_bytes(make_traj(seed=9))
  if case == "truncated":
    return good[:len(good) // 2]
  if case == "garbage":
    return np.random.default_rng(0).bytes(2000)
  if case == "nested":  # json.loads would raise RecursionError
    return archive(**record_members(make_traj(seed=9), meta="[" * 100_000 + "]" * 100_000))
  if case == "unexpected":  # a float token array and an extra member
    return archive(**record_members(make_traj(seed=9, tokens=np.zeros(10))), extra=np.zeros(3))
  raise AssertionError(case)


@pytest.mark.parametrize("case, reason", [
    ("truncated", "unreadable"), ("garbage", "unreadable"), ("nested", "malformed"),
    ("unexpected", "malformed")])
def test_poison_record_is_quarantined_counted_and_never_read_again(tmp_path, case, reason):
  drops = pipeline.Drops()
  reader = reader_of(tmp_path, drops=drops)
  plant(tmp_path / "w-000000000000.p0.traj", poison(case))
  time.sleep(0.01)  # the poison is the oldest record
  DirectoryTransport(tmp_path, 8, writer_id="v", max_tokens=MAX_TOKENS,
                     secret=SECRET).put(make_traj(seed=3))
  traj = reader.get(timeout=1.0)  # today: raises, and the record stays for the next restart
  np.testing.assert_array_equal(traj.tokens, make_traj(seed=3).tokens)
  assert dict(drops) == {f"quarantined_{reason}": 1}
  assert "w-000000000000.p0.traj" in drops.examples[f"quarantined_{reason}"]
  assert not list(tmp_path.glob("*.traj"))
  assert [p.name for p in (tmp_path / "quarantine").iterdir()] == [
      f"w-000000000000.p0.traj.{reason}"]
  assert reader.get(timeout=0.1) is None


def get_within(reader, wait=1.0, seconds=10.0):
  """reader.get(wait), from a thread that must finish within `seconds` (a stall fails the test)."""
  got = []
  worker = threading.Thread(target=lambda: got.append(reader.get(timeout=wait)), daemon=True)
  worker.start()
  worker.join(seconds)
  assert not worker.is_alive(), "the reader stalled"
  return got[0]


@pytest.mark.parametrize("case", ["fifo", "link_loop", "dangling_link", "link_to_a_record"])
def test_a_peer_s_special_file_named_like_a_record_is_quarantined(tmp_path, case):
  # A FIFO used to block the reader's open() forever; a link loop crashed its listing.
  reader = reader_of(tmp_path)
  name = tmp_path / "w-000000000000.p0.traj"
  if case == "fifo":
    os.mkfifo(name)
  elif case == "link_loop":
    os.symlink(name.name, name)
  elif case == "dangling_link":
    os.symlink(tmp_path / "nowhere", name)
  else:  # links are never followed, even to a valid record
    plant(tmp_path / "elsewhere", records.to_bytes(make_traj(seed=1)))
    os.symlink(tmp_path / "elsewhere", name)
  time.sleep(0.01)  # the special file is the oldest entry
  DirectoryTransport(tmp_path, 8, writer_id="v", max_tokens=MAX_TOKENS,
                     secret=SECRET).put(make_traj(seed=3))
  np.testing.assert_array_equal(get_within(reader).tokens, make_traj(seed=3).tokens)
  assert dict(reader.drops) == {"quarantined_unreadable": 1}
  assert [p.name for p in (tmp_path / "quarantine").iterdir()] == [f"{name.name}.unreadable"]


@pytest.mark.parametrize("folder", ["file", "link_elsewhere"])
def test_a_bad_record_is_deleted_when_the_quarantine_folder_is_a_peer_s_trap(tmp_path, folder):
  # A file named quarantine crashed the reader (FileExistsError); a link there made it
  # move records into another directory, or crash (EXDEV) on another file system.
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  shared = tmp_path / "shared"
  shared.mkdir()
  if folder == "file":
    (shared / "quarantine").write_bytes(b"")
  else:
    os.symlink(elsewhere, shared / "quarantine")
  reader = reader_of(shared)
  (shared / "w-000000000000.p0.traj").write_bytes(poison("garbage"))
  assert get_within(reader, wait=0.1) is None
  assert dict(reader.drops) == {"quarantined_bad_signature": 1}
  assert not list(shared.glob("*.traj")) and not list(elsewhere.iterdir())


def test_a_bad_entry_that_can_be_neither_moved_nor_deleted_is_counted_once(tmp_path):
  (tmp_path / "quarantine").write_bytes(b"")
  reader = reader_of(tmp_path)
  (tmp_path / "w-000000000000.p0.traj").mkdir()
  (tmp_path / "w-000000000000.p0.traj" / "inside").write_bytes(b"")
  assert get_within(reader, wait=0.1) is None and get_within(reader, wait=0.1) is None
  assert dict(reader.drops) == {"quarantined_unreadable": 1}


def test_zip_bomb_is_quarantined_without_expanding_it(tmp_path):
  """32 MB of tokens deflate to ~32 KB; a reader must not decompress them."""
  zeros = {name: np.zeros(8 << 20, np.int32 if name == "tokens" else np.float32)
           for name in ("tokens", "behavior_logp", "rewards")}
  bomb = archive(zipfile.ZIP_DEFLATED, **record_members(make_traj(
      length=8 << 20, action_mask=np.zeros(8 << 20, np.int8), **zeros)))
  assert len(bomb) < 1 << 20
  reader = reader_of(tmp_path)
  plant(tmp_path / "w-000000000000.p0.traj", bomb)
  tracemalloc.start()
  try:
    got = reader.get(timeout=0.1)  # today: returns a 8M-token trajectory
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert got is None and dict(reader.drops) == {"quarantined_oversized": 1}
  assert peak < 4 << 20, f"peak {peak} bytes while rejecting the bomb"


def test_stray_names_are_quarantined_not_parsed(tmp_path):
  reader = reader_of(tmp_path, shard=(0, 2))
  for name in ("w-.p.traj", "notes.traj", "w-12.pX.traj"):  # today: int('') in the reader
    plant(tmp_path / name, records.to_bytes(make_traj(seed=1)))
  (tmp_path / "w-000000000001.traj.tmp").write_bytes(b"a writer's partial record")
  assert reader.get(timeout=0.1) is None
  assert dict(reader.drops) == {"quarantined_bad_name": 3}
  assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
      "RUN", "w-000000000001.traj.tmp"]


def test_record_whose_prompt_differs_from_its_name_is_quarantined(tmp_path):
  """The name routes a GRPO group to one reader; a record must hold what its name says."""
  reader = reader_of(tmp_path)
  plant(tmp_path / "w-000000000000.p3.traj", records.to_bytes(make_traj(prompt_id=4)))
  assert reader.get(timeout=0.1) is None
  assert dict(reader.drops) == {"quarantined_malformed": 1}


def test_record_vanishing_between_listing_and_reading_is_skipped(tmp_path, monkeypatch):
  """Another reader takes the oldest record right after this one listed the directory."""
  reader = reader_of(tmp_path)
  writer = DirectoryTransport(tmp_path, 8, writer_id="w", max_tokens=MAX_TOKENS, secret=SECRET)
  writer.put(make_traj(seed=1))
  time.sleep(0.01)
  writer.put(make_traj(seed=2))
  victim = tmp_path / "w-000000000000.p0.traj"
  real_scandir = os.scandir

  class Listing:  # the directory as it was, with the victim gone when it is used
    def __init__(self, path):
      self._entries = list(real_scandir(path))
      victim.unlink(missing_ok=True)

    def __enter__(self):
      return iter(self._entries)

    def __exit__(self, *exc):
      return False

    def __iter__(self):
      return iter(self._entries)

  monkeypatch.setattr(os, "scandir", Listing)
  traj = reader.get(timeout=0.5)  # today: FileNotFoundError from stat
  np.testing.assert_array_equal(traj.tokens, make_traj(seed=2).tokens)
  assert not reader.drops


# --- the shared directory's writers without the secret (data.sealed) -----------------


@pytest.mark.parametrize("forgery", ["unsealed", "other_secret"])
def test_a_record_forged_without_the_secret_is_quarantined_not_trained_on(tmp_path, forgery):
  # Anyone who can write the directory could hand the learner a perfect reward for
  # tokens of their choosing; before sealing the reader took it as a sampler's.
  reader = reader_of(tmp_path)
  forged = records.to_bytes(make_traj(seed=7, rewards=np.ones(10, np.float32)))
  path = tmp_path / "w-000000000000.p0.traj"
  if forgery == "unsealed":
    path.write_bytes(forged)
  else:
    plant(path, forged, secret=b"a guess at the secret, 32 bytes!")
  assert reader.get(timeout=0.1) is None
  assert dict(reader.drops) == {"quarantined_bad_signature": 1}


def test_a_record_copied_under_another_name_or_put_back_is_refused(tmp_path):
  # Renaming a copy moves it into another reader's shard or GRPO group; putting a
  # consumed record back trains on it twice.
  reader = reader_of(tmp_path)
  writer = DirectoryTransport(tmp_path, 8, writer_id="w", max_tokens=MAX_TOKENS, secret=SECRET)
  writer.put(make_traj(seed=1))
  original = tmp_path / "w-000000000000.p0.traj"
  data = original.read_bytes()
  (tmp_path / "w-000000000007.p0.traj").write_bytes(data)
  assert reader.get(timeout=0.5) is not None  # the original
  assert reader.get(timeout=0.1) is None and dict(reader.drops) == {
      "quarantined_bad_signature": 1}
  original.write_bytes(data)
  assert reader.get(timeout=0.1) is None
  assert reader.drops["quarantined_replayed"] == 1


def test_a_close_marker_without_the_secret_or_from_an_earlier_run_stops_nobody(tmp_path):
  # Touching CLOSED used to stop every sampler of the run.
  reader = reader_of(tmp_path)
  writer = DirectoryTransport(tmp_path, 8, writer_id="w", max_tokens=MAX_TOKENS, secret=SECRET)
  (tmp_path / "CLOSED").touch()
  assert writer.running and not writer.closed
  writer.put(make_traj(seed=1))
  reader.close()  # the real one
  assert writer.closed and not writer.running
  stale = (tmp_path / "CLOSED").read_bytes()
  reader.start_run()  # the next run: the old marker, even put back, no longer applies
  (tmp_path / "CLOSED").write_bytes(stale)
  assert writer.running
  writer.put(make_traj(seed=2))
  np.testing.assert_array_equal(reader.get(timeout=0.5).tokens, make_traj(seed=2).tokens)
  assert dict(reader.drops) == {"quarantined_earlier_run": 1}  # seed 1, of the first run


def test_a_writer_waits_for_a_run_it_can_verify_and_follows_a_restarted_learner(tmp_path):
  writer = DirectoryTransport(tmp_path, 8, writer_id="w", max_tokens=MAX_TOKENS, secret=SECRET)
  with pytest.raises(queue.Full, match="no RUN marker signed with this secret"):
    writer.put(make_traj(seed=1), timeout=0.2)
  impostor = DirectoryTransport(tmp_path, 8, max_tokens=MAX_TOKENS,
                                secret=b"a guess at the secret, 32 bytes!")
  impostor.start_run()  # a RUN marker without the run's secret
  assert not writer.running
  with pytest.raises(queue.Full, match="no RUN marker"):
    writer.put(make_traj(seed=1), timeout=0.2)
  first = reader_of(tmp_path)
  writer.put(make_traj(seed=1))
  assert first.get(timeout=0.5) is not None
  restarted = reader_of(tmp_path)  # a learner restarted without closing: a new run
  writer.put(make_traj(seed=2))
  np.testing.assert_array_equal(restarted.get(timeout=0.5).tokens, make_traj(seed=2).tokens)
  assert not restarted.drops


def test_a_transport_dir_that_cannot_be_a_directory_is_named(tmp_path):
  # Before: a FileExistsError traceback out of sao-sampler / sao-train.
  (tmp_path / "taken").write_text("x")
  with pytest.raises(ValueError, match=r"data.transport_dir='.*taken' cannot be created as a "
                                       r"directory \(File exists\)"):
    DirectoryTransport(tmp_path / "taken", 4, max_tokens=MAX_TOKENS, secret=SECRET)
