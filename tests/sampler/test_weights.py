"""Weight channels: versions, no torn reads, cross-process shared memory, directory."""

import multiprocessing
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.channel import weights


def params(value):
  return {"embed": jnp.full((4, 3), value, jnp.float32),
          "layers": {0: {"w": jnp.full((5,), value, jnp.bfloat16)}},
          "scale": jnp.asarray(value, jnp.float32)}


def assert_params(tree, value):
  for leaf in jax.tree.leaves(tree):
    np.testing.assert_array_equal(np.asarray(leaf, np.float32), value)


def test_shared_memory_versions():
  publisher = weights.SharedMemoryWeights(params(0.0))
  subscriber = weights.subscribe(publisher.spec)
  try:
    assert subscriber.poll() is None  # nothing published yet
    publisher.publish(params(1.0), version=1)
    tree, version = subscriber.poll()
    assert version == 1 and jax.tree.structure(tree) == jax.tree.structure(params(0.0))
    assert_params(tree, 1.0)
    assert subscriber.poll() is None  # nothing newer
    publisher.publish(params(2.0), version=2)
    publisher.publish(params(3.0), version=3)
    tree, version = subscriber.poll()
    assert version == 3
    assert_params(tree, 3.0)  # newest only, never a mix
  finally:
    subscriber.close()
    publisher.close()


def test_the_shared_memory_block_is_the_learner_users_alone():
  """The shared-memory channel carries no signature: its block is readable and writable
  by the learner's own user only (mode 0600), who could as well rewrite the sampler's
  memory, and the sandbox has no /dev/shm (docs/explanation/peers.md)."""
  import os
  publisher = weights.SharedMemoryWeights(params(0.0))
  try:
    status = os.stat(os.path.join(weights.SHM_DIR, publisher.spec.name))
    assert status.st_mode & 0o777 == 0o600 and status.st_uid == os.getuid()
  finally:
    publisher.close()


def test_layout_mismatch_is_named():
  publisher = weights.SharedMemoryWeights(params(0.0))
  try:
    with pytest.raises(ValueError, match="leaves"):
      publisher.publish({"embed": jnp.zeros((4, 3))}, version=1)
    bad = params(0.0)
    bad["embed"] = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
      publisher.publish(bad, version=1)
  finally:
    publisher.close()


def _read_in_child(spec, out):
  import time
  subscriber = weights.subscribe(spec)
  seen = []
  deadline = time.monotonic() + 60  # never spin forever if the parent gave up
  while (len(seen) < 1 or seen[-1][0] < 20) and time.monotonic() < deadline:
    got = subscriber.poll()
    if got is not None:
      tree, version = got
      values = {float(np.asarray(x, np.float32).ravel()[0]) for x in jax.tree.leaves(tree)}
      seen.append((version, sorted(values)))
  subscriber.close()
  out.put(seen)


def test_shared_memory_across_processes_never_tears():
  context = multiprocessing.get_context("spawn")
  publisher = weights.SharedMemoryWeights(params(0.0))
  out = context.Queue()
  child = context.Process(target=_read_in_child, args=(publisher.spec, out), daemon=True)
  child.start()
  try:
    for version in range(1, 21):
      publisher.publish(params(float(version)), version=version)
    seen = out.get(timeout=300)  # spawn start-up can take long on a loaded machine
  finally:
    child.join(timeout=30)
    publisher.close()
  versions = [v for v, _ in seen]
  assert versions == sorted(versions) and versions[-1] == 20
  for version, values in seen:  # every leaf from the same version
    assert values == [float(version)]


def test_directory_channel(tmp_path):
  publisher = weights.DirectoryWeights(tmp_path / "weights", params(0.0))
  subscriber = weights.subscribe(publisher.spec)
  try:
    assert subscriber.poll() is None
    publisher.publish(params(1.0), version=1)
    publisher.publish(params(2.0), version=2)
    tree, version = subscriber.poll()
    assert version == 2
    assert_params(tree, 2.0)
    assert subscriber.poll() is None
  finally:
    subscriber.close()
    publisher.close()


def test_directory_channel_skips_versions_that_do_not_restore(tmp_path):
  """A shared weights directory can hold a newer version that does not restore (its
  files damaged, or a bare directory named like a step): the subscriber takes the
  newest one that does instead of raising on every poll."""
  publisher = weights.DirectoryWeights(tmp_path / "weights", params(0.0))
  subscriber = weights.subscribe(publisher.spec)
  try:
    publisher.publish(params(1.0), version=1)
    publisher.publish(params(2.0), version=2)
    shutil.copytree(tmp_path / "weights" / "2", tmp_path / "weights" / "7")
    for file in (tmp_path / "weights" / "7").rglob("manifest.ocdbt"):
      file.write_bytes(file.read_bytes()[:20])  # truncated
    (tmp_path / "weights" / "9").mkdir()
    tree, version = subscriber.poll()
    assert version == 2
    assert_params(tree, 2.0)
    assert sorted(subscriber.skipped) == [7, 9]
    assert subscriber.poll() is None  # the skipped ones are not restored again
  finally:
    subscriber.close()
    publisher.close()
