"""The directory weight channel is signed: what a peer writes there is not played with.

Each attack below made the old subscriber (which restored the newest step directory it
found) play weights the learner never published.
"""

import json
import os
import shutil
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from sao_jax.channel import sealed
from sao_jax.channel import weights, weights_digest, weights_directory
from sao_jax.sampler import worker

SECRET = b"s" * 32


def params(value):
  return {"embed": jnp.full((8, 4), value, jnp.float32),
          "layers": {0: {"w": jnp.full((6,), value, jnp.bfloat16)}},
          "scale": jnp.asarray(value, jnp.float32)}


def values(tree):
  return sorted({float(np.asarray(x, np.float32).ravel()[0]) for x in jax.tree.leaves(tree)})


@pytest.fixture
def channel(tmp_path):
  publisher = weights.DirectoryWeights(tmp_path / "weights", params(0.0), SECRET)
  subscriber = weights.subscribe(publisher.spec)
  yield tmp_path / "weights", publisher, subscriber
  subscriber.close()
  publisher.close()


def _plant(directory, step, tree):
  """What anyone who can write the directory can do: an orbax step of their own."""
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(directory / str(step) / "default", tree)
  checkpointer.wait_until_finished()
  checkpointer.close()


def test_a_version_planted_without_the_secret_is_not_played(channel):
  directory, publisher, subscriber = channel
  publisher.publish(params(1.0), version=1)
  _plant(directory, 5, params(666.0))
  tree, version = subscriber.poll()
  assert (version, values(tree)) == (1, [1.0])
  assert subscriber.skipped[5].startswith("unsigned")
  # The learner's signatures of version 1 copied to the planted version's names.
  for name in ("head", "0"):
    shutil.copyfile(directory / "signatures" / f"1.{name}", directory / "signatures" / f"5.{name}")
  assert subscriber.poll() is None
  assert subscriber.skipped[5].startswith("bad_signature")


def test_arrays_swapped_under_a_signed_version_are_refused(channel):
  directory, publisher, subscriber = channel
  publisher.publish(params(1.0), version=1)
  publisher.publish(params(2.0), version=2)
  shutil.rmtree(directory / "2" / "default")  # its signatures stay, its arrays are theirs
  _plant(directory, 2, params(666.0))
  tree, version = subscriber.poll()
  assert (version, values(tree)) == (1, [1.0])
  assert subscriber.skipped[2].startswith("bad_digest") and "differs" in subscriber.skipped[2]
  publisher.publish(params(3.0), version=3)  # the channel goes on
  tree, version = subscriber.poll()
  assert (version, values(tree)) == (3, [3.0])


def test_an_earlier_runs_signed_versions_are_older_than_the_current_runs(tmp_path):
  directory = tmp_path / "weights"
  first = weights.DirectoryWeights(directory, params(0.0), SECRET)
  first.publish(params(5.0), version=5)
  first.publish(params(6.0), version=6)
  first.close()
  saved = tmp_path / "saved"
  shutil.copytree(directory, saved)
  follower = weights.subscribe(first.spec)
  assert follower.poll()[1] == 6
  # The learner restarts (resumed from an earlier checkpoint): the new run's versions
  # are newer than the old run's, whatever their numbers. Before: the follower waited
  # for a version above 6, playing stale weights.
  second = weights.DirectoryWeights(directory, params(0.0), SECRET)
  assert not (directory / "6").exists()  # the earlier run's versions are deleted
  second.publish(params(1.0), version=1)
  tree, version = follower.poll()
  assert (version, values(tree)) == (1, [1.0])
  # The earlier run's version 6, validly signed, put back: not played.
  shutil.copytree(saved / "6", directory / "6")
  for path in (saved / "signatures").glob("6.*"):
    shutil.copyfile(path, directory / "signatures" / path.name)
  fresh = weights.subscribe(second.spec)
  assert fresh.poll()[1] == 1 and follower.poll() is None
  fresh.close()
  follower.close()
  second.close()


def test_signatures_of_versions_gone_are_deleted(channel):
  directory, publisher, _ = channel
  for version in range(1, 5):
    publisher.publish(params(float(version)), version=version)
  assert sorted(p.name for p in (directory / "signatures").iterdir()) == [
      "3.0", "3.head", "4.0", "4.head"]


def _sharded(value):
  """`params(value)` over the 8 emulated devices: embed split 4 x 2, w split 2 ways and
  replicated 4 ways, scale replicated."""
  mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  spec = jax.sharding.PartitionSpec
  shardings = {"embed": spec("a", "b"), "layers": {0: {"w": spec("b")}}, "scale": spec()}
  return jax.tree.map(lambda x, s: jax.device_put(x, jax.sharding.NamedSharding(mesh, s)),
                      params(value), shardings)


def _payload(tree, version=1, run=7):
  data = weights_digest.sign(SECRET, tree, run=run, version=version)
  return weights_digest.read_signature(SECRET, data, version=version, process=0)


def test_shard_digests_of_a_sharded_tree_check_the_whole_arrays():
  tree = _sharded(3.0)
  tree["embed"] = tree["embed"] + jnp.arange(32, dtype=jnp.float32).reshape(8, 4)
  payload = _payload(tree)
  assert len(payload["leaves"]["['embed']"]["boxes"]) == 8  # one per shard
  assert len(payload["leaves"]["['layers'][0]['w']"]["boxes"]) == 2  # replicas signed once
  host = jax.tree.map(np.asarray, tree)  # what a subscriber restores, on one device
  weights_digest.verify([payload], host, run=7)
  changed = jax.tree.map(np.copy, host)
  changed["embed"][7, 3] += 1.0  # one element, in the last shard
  with pytest.raises(weights_digest.DigestError, match=r"\['embed'\]: box \[\[6, 8\], \[2, 4\]\]"):
    weights_digest.verify([payload], changed, run=7)
  with pytest.raises(weights_digest.DigestError, match="run 8"):
    weights_digest.verify([payload], host, run=8)


@pytest.mark.parametrize("edit, message", [
    (lambda boxes: boxes.pop(), "do not partition|do not tile"),  # a shard left unsigned
    (lambda boxes: boxes.append(boxes[0]), "do not tile"),  # one signed twice
    (lambda boxes: boxes.__setitem__(0, [[[0, 2], [0, 4]], boxes[0][1]]), "do not partition"),
])
def test_boxes_must_tile_each_leaf_exactly_once(edit, message):
  # Signed, so only a learner bug (or a future format) could write these: still refused.
  payload = _payload(_sharded(1.0))
  edit(payload["leaves"]["['embed']"]["boxes"])
  with pytest.raises(weights_digest.DigestError, match=message):
    weights_digest.verify([payload], jax.tree.map(np.asarray, _sharded(1.0)), run=7)


def test_unsigned_oversized_or_mislabelled_signatures_are_refused(tmp_path):
  data = weights_digest.sign(SECRET, params(1.0), run=7, version=1)
  with pytest.raises(weights_digest.DigestError, match="does not match"):
    weights_digest.read_signature(b"t" * 32, data, version=1, process=0)
  with pytest.raises(weights_digest.DigestError, match="signs version 1"):
    weights_digest.read_signature(SECRET, data, version=2, process=0)
  forged = weights_digest.MAGIC + data[len(weights_digest.MAGIC):].replace(b"7", b"8", 1)
  with pytest.raises(weights_digest.DigestError, match="does not match"):
    weights_digest.read_signature(SECRET, forged, version=1, process=0)
  head = weights_digest.sign_head(SECRET, run=7, version=1, processes=1)
  with pytest.raises(weights_digest.DigestError, match="does not match"):  # labels differ
    weights_digest.read_signature(SECRET, head, version=1, process=0)
  big = tmp_path / "big"
  big.write_bytes(b"x" * 100)
  assert len(weights_digest.read_file(big, limit=10)) == 11  # read no further than the cap
  payload = json.dumps({"run": 7, "version": 1, "processes": 2}).encode()
  head = weights_digest.MAGIC + sealed.hmac_parts(SECRET, b"head", payload) + payload
  assert weights_digest.read_head(SECRET, head, version=1) == (7, 2)
  with pytest.raises(weights_digest.DigestError, match="unsigned"):
    weights_digest.read_head(SECRET, None, version=1)


def test_a_version_saved_sharded_restores_on_one_device_and_checks(tmp_path):
  # Shards signed per device by the learner, checked whole by the subscriber.
  publisher = weights.DirectoryWeights(tmp_path / "weights", params(0.0), SECRET)
  subscriber = weights.subscribe(publisher.spec)
  try:
    publisher.publish(_sharded(4.0), version=1)
    tree, version = subscriber.poll()
    assert (version, values(tree)) == (1, [4.0]) and subscriber.skipped == {}
  finally:
    subscriber.close()
    publisher.close()


# A peer who can write the directory, without the secret: it must not lead the learner
# outside the directory, crash or hang either side, or keep a sampler off a new version.


def _victim(tmp_path):
  victim = tmp_path / "victim"  # a directory of the learner's host, outside the channel
  victim.mkdir()
  for name in ("id_rsa", "notes.txt", "1.0", "7.head"):
    (victim / name).write_text("precious")
  return victim


def test_signatures_made_a_link_never_lead_the_learner_outside(channel, tmp_path):
  directory, publisher, subscriber = channel
  victim = _victim(tmp_path)
  (directory / "signatures").symlink_to(victim)  # before the first version
  publisher.publish(params(1.0), version=1)
  publisher.publish(params(2.0), version=2)
  publisher.publish(params(3.0), version=3)
  # Before: every file there that signed no kept version was deleted, ours written there.
  assert sorted(p.name for p in victim.iterdir()) == ["1.0", "7.head", "id_rsa", "notes.txt"]
  assert not (directory / "signatures").is_symlink()
  tree, version = subscriber.poll()
  assert (version, values(tree)) == (3, [3.0])


def test_a_version_made_a_link_never_leads_the_learner_outside(tmp_path, monkeypatch):
  # Orbax's deleter walks a step in parallel on hosts of 4+ cores, following a link.
  monkeypatch.setattr("os.cpu_count", lambda: 8)
  directory = tmp_path / "weights"
  directory.mkdir()
  victim = _victim(tmp_path)
  (directory / "5").symlink_to(victim)  # an earlier run's version, as a peer left it
  publisher = weights.DirectoryWeights(directory, params(0.0), SECRET)  # before: raised
  subscriber = weights.subscribe(publisher.spec)
  try:
    publisher.publish(params(1.0), version=1)
    shutil.rmtree(directory / "1")
    (directory / "1").symlink_to(victim)  # a kept version, swapped after the save
    (directory / "3").symlink_to(victim)  # the name of a version to come
    for version in (2, 3, 4):  # before: the save of 3 raised
      publisher.publish(params(float(version)), version=version)
    assert sorted(p.name for p in victim.iterdir()) == ["1.0", "7.head", "id_rsa", "notes.txt"]
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) == [
        "3", "4", "signatures"]
    tree, version = subscriber.poll()
    assert (version, values(tree)) == (4, [4.0])
  finally:
    subscriber.close()
    publisher.close()


def test_a_fifo_or_endless_file_in_a_bare_version_does_not_hang_a_poll(channel):
  directory, publisher, subscriber = channel
  publisher.publish(params(1.0), version=1)
  (directory / "8").mkdir()
  (directory / "8" / "_CHECKPOINT_METADATA").write_text("{")  # (a link to /dev/zero: no end)
  (directory / "9").mkdir()
  os.mkfifo(directory / "9" / "_CHECKPOINT_METADATA")
  got = []
  poller = threading.Thread(target=lambda: got.append(subscriber.poll()), daemon=True)
  poller.start()
  poller.join(timeout=60)
  try:
    # Before: orbax's listing read every step's metadata, and waited for the FIFO's writer.
    assert not poller.is_alive(), "a poll hung on a FIFO a peer put in a bare step"
  finally:
    if poller.is_alive():  # let the hung poll go
      os.close(os.open(directory / "9" / "_CHECKPOINT_METADATA", os.O_WRONLY | os.O_NONBLOCK))
  assert got[0][1] == 1 and sorted(subscriber.skipped) == [8, 9]


def test_oversized_heads_are_read_no_further_and_gone_versions_forgotten(channel, monkeypatch):
  directory, publisher, subscriber = channel
  publisher.publish(params(1.0), version=1)
  for step in range(2, 42):  # bare versions with 2 MiB heads
    (directory / str(step)).mkdir()
    head = directory / "signatures" / f"{step}.head"
    head.write_bytes(weights_digest.MAGIC + b"x" * (2 << 20))
  read = []
  real_read_file = weights_digest.read_file
  def read_file(*args, **kwargs):
    read.append(real_read_file(*args, **kwargs))
    return read[-1]

  monkeypatch.setattr(weights_digest, "read_file", read_file)
  assert subscriber.poll()[1] == 1
  assert len(subscriber.skipped) == 40 and all(
      "bad_signature" in why for why in subscriber.skipped.values())
  # Before: 80 MiB read at every poll, and kept (the head of each skipped version).
  assert sum(len(data or b"") for data in read) < 41 * 2048
  for step in range(2, 42):  # a peer churning names: what is gone is forgotten
    shutil.rmtree(directory / str(step))
  assert subscriber.poll() is None and subscriber.skipped == {}


def test_a_bare_directory_at_the_next_versions_name_does_not_skip_it(channel, monkeypatch):
  monkeypatch.setattr(weights.DirectorySubscriber, "RETRY_S", 0.0)  # no wait to retry
  directory, publisher, subscriber = channel
  publisher.publish(params(1.0), version=1)
  assert subscriber.poll()[1] == 1
  (directory / "2").mkdir()  # planted before the learner publishes 2, as if committed
  (directory / "2" / weights_directory.COMMITTED).write_text("")
  save = publisher._manager.save

  def save_after_a_poll(*args, **kwargs):  # a sampler polls while the learner saves
    assert subscriber.poll() is None
    return save(*args, **kwargs)

  publisher._manager.save = save_after_a_poll
  publisher.publish(params(2.0), version=2)
  # Before: skipped for good (its head had not changed since the bare directory failed).
  tree, version = subscriber.poll()
  assert (version, values(tree)) == (2, [2.0]) and subscriber.skipped == {}


def test_the_skip_log_forgets_versions_gone():
  lines = []
  skips = worker._SkipLog(lines.append)
  subscriber = types.SimpleNamespace(skipped={3: "unsigned: no head of version 3"})
  skips.report(subscriber)
  skips.report(subscriber)
  subscriber.skipped = {}
  skips.report(subscriber)
  assert lines == ["weight version 3 skipped: unsigned: no head of version 3 "
                   "(skipped version #1; logged at 1, 2, 4, 8, ...)"]
  assert skips._told == {}  # before: one entry kept for every name a peer ever made


def test_a_peer_churning_bad_versions_cannot_flood_the_sampler_log():
  # One line per version a peer planted (and again per name it churned): a peer writing
  # the weights directory filled the sampler's log, one line per mkdir, with its own text.
  lines = []
  skips = worker._SkipLog(lines.append)
  for version in range(1000):
    skips.report(types.SimpleNamespace(
        skipped={version: "restore failed: \x1b]52;c;ZXZpbA==\x07\nstep 1000/1000 | done"}))
  assert skips.reports == 1000 and len(lines) == 10  # 1, 2, 4, ..., 512
  assert all(line.isprintable() and "\\x1b]52;" in line for line in lines)


def test_a_restarted_learner_whose_clock_is_behind_still_follows_the_run_before(
    tmp_path, monkeypatch):
  directory = tmp_path / "weights"
  first = weights.DirectoryWeights(directory, params(0.0), SECRET)
  first.publish(params(6.0), version=6)
  first.close()
  saved = tmp_path / "saved"  # what a peer kept of the earlier run
  shutil.copytree(directory, saved)
  with monkeypatch.context() as patch:  # restarted on a host whose clock is an hour behind
    patch.setattr(weights_directory.time, "time_ns", lambda: first._run - 3600 * 10**9)
    second = weights.DirectoryWeights(directory, params(0.0), SECRET)
  second.publish(params(1.0), version=1)
  shutil.copytree(saved / "6", directory / "6")  # the earlier run's version, put back
  for path in (saved / "signatures").glob("6.*"):
    shutil.copyfile(path, directory / "signatures" / path.name)
  subscriber = weights.subscribe(second.spec)
  try:
    # Before: the run was the clock alone, so the earlier run's version 6 was the newer.
    tree, version = subscriber.poll()
    assert (version, values(tree)) == (1, [1.0])
  finally:
    subscriber.close()
    second.close()


def test_a_file_at_the_signatures_name_is_moved_aside(channel):
  directory, publisher, subscriber = channel
  (directory / "signatures").write_text("a peer's")  # before: every publish raised
  publisher.publish(params(1.0), version=1)
  assert subscriber.poll()[1] == 1
  assert [p.read_text() for p in directory.glob(".signatures.*.moved")] == ["a peer's"]


def test_a_fifo_in_a_signed_versions_files_does_not_hang_a_poll(channel):
  directory, publisher, subscriber = channel
  publisher.publish(params(1.0), version=1)
  publisher.publish(params(2.0), version=2)
  fifo = directory / "2" / "default" / "_METADATA"  # the learner's newest version
  fifo.unlink()
  os.mkfifo(fifo)
  got = []
  poller = threading.Thread(target=lambda: got.append(subscriber.poll()), daemon=True)
  poller.start()
  poller.join(timeout=60)
  try:
    assert not poller.is_alive(), "a poll hung on a FIFO a peer put in a signed version"
  finally:
    if poller.is_alive():  # let the hung poll go
      os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
  assert got[0][1] == 1 and "not a regular file" in subscriber.skipped[2]


def test_a_failed_version_touched_at_every_poll_is_restored_at_most_every_retry_s(channel):
  directory, publisher, subscriber = channel
  publisher.publish(params(1.0), version=1)
  publisher.publish(params(2.0), version=2)
  shutil.rmtree(directory / "2" / "default")
  _plant(directory, 2, params(666.0))  # fails its check: a restore and a hash of it all
  now = [0.0]
  subscriber._clock = lambda: now[0]
  restores = []
  restore = subscriber._restore
  subscriber._restore = lambda step, *args: restores.append(step) or restore(step, *args)
  assert subscriber.poll()[1] == 1
  for _ in range(5):  # a peer makes its entry change before every poll
    (directory / "2" / weights_directory.COMMITTED).touch()
    (directory / "2" / "x").mkdir()
    (directory / "2" / "x").rmdir()
    assert subscriber.poll() is None
  assert restores == [2, 1]  # tried once, then version 1 taken
  now[0] += weights.DirectorySubscriber.RETRY_S
  assert subscriber.poll() is None and restores == [2, 1, 2]


def test_a_retired_version_put_back_is_refused_and_counted(channel, tmp_path):
  """A writer of the directory keeps a copy of version 1 (signed, this run) and puts it
  back once the learner retired it: a sampler that moved on never returns to it, and
  counts it (`stats`, which the worker reports as `weights/sampler_errors`)."""
  directory, publisher, subscriber = channel
  publisher.publish(params(1.0), version=1)
  assert subscriber.poll()[1] == 1
  saved = tmp_path / "saved"
  shutil.copytree(directory / "1", saved / "1")
  for path in (directory / "signatures").glob("1.*"):
    shutil.copyfile(path, saved / path.name)
  for version in (2, 3):  # version 1 is retired (KEEP = 2)
    publisher.publish(params(float(version)), version=version)
  tree, version = subscriber.poll()
  assert (version, values(tree)) == (3, [3.0]) and not (directory / "1").exists()
  assert subscriber.stats == {}  # version 2, listed with 3, is the learner's own
  shutil.copytree(saved / "1", directory / "1")
  for path in saved.glob("1.*"):
    shutil.copyfile(path, directory / "signatures" / path.name)
  assert subscriber.poll() is None and subscriber.version == 3
  assert subscriber.stats == {"stale_version": 1}
  assert subscriber.poll() is None and subscriber.stats == {"stale_version": 1}  # once
