"""Orbax checkpoints in a bucket (`checkpoint.directory=gs://...`), saved, listed, restored and
moved aside through `sao_jax.run.checkpoint.Checkpointer` against an emulated GCS server.

Orbax reaches a gs:// directory through three clients, and the `gcs_server` fixture points
all three at one local server (gcp-storage-emulator, GCS's JSON API over HTTP, in memory):
  - epath, through fsspec's `gcsfs` (STORAGE_EMULATOR_HOST): the step directories and their
    listing (`latest_step`), the JSON items, `_CHECKPOINT_METADATA`, the commit markers, the
    deletion of old steps and the rename of a damaged one;
  - TensorStore's own `gcs` driver (TENSORSTORE_GCS_HTTP_URL): the arrays, as OCDBT manifests
    and data files;
  - google-cloud-storage (STORAGE_EMULATOR_HOST): orbax asks it whether the bucket has a
    hierarchical namespace before it lists the steps.
The in-memory `emulated_gcs` fixture (conftest.py) reaches only the first, so the arrays of
a bucket checkpoint are tested here only.
"""

import json
import os
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gcs_emulator
from sao_jax.config import CheckpointConfig, Config
from sao_jax.run.checkpoint import Checkpointer

BUCKET = "bucket"


@pytest.fixture(scope="session")
def _server():
  """One emulator per test process, on a free port: TensorStore reads
  TENSORSTORE_GCS_HTTP_URL once, at its first gs:// request, and keeps that URL for the
  life of the process, so a second server (on another port) would never be reached."""
  from gcp_storage_emulator.server import create_server

  server = create_server("127.0.0.1", 0, in_memory=True, default_bucket=BUCKET)
  server.start()
  host, port = server._api._httpd.server_address  # pylint: disable=protected-access  # port 0's pick
  yield server, f"http://{host}:{port}"
  server.stop()


@pytest.fixture
def gcs_server(_server, monkeypatch, tmp_path):
  """An empty bucket `bucket` on the emulator, every gs:// client of orbax pointed at it, and
  an empty working directory (where pathlib's reading of a URL would make `gs:/bucket`)."""
  import fsspec
  from etils.epath import backend
  from gcsfs import extended_gcsfs
  from orbax.checkpoint._src.path import gcs_utils

  server, url = _server
  server.wipe(keep_buckets=True)
  # Each test its own directory: no client's cache of an earlier test's objects answers for it.
  emulator = gcs_emulator.Emulator(url, BUCKET, f"{tmp_path.name}/checkpoints")
  gcs_emulator.complete(monkeypatch, emulator)
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)  # gcsfs and google-cloud-storage
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", url)
  # TensorStore sends this token instead of looking for credentials (none on a test machine;
  # a developer's own must not be used).
  monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
  monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})  # gcsfs: no credentials

  # gcsfs asks the Storage Control API (gRPC, which the emulator does not serve) whether a
  # bucket is flat or hierarchical; answer as GCS does for a flat bucket, the kind emulated.
  async def flat(self, bucket):
    del self, bucket
    return extended_gcsfs.BucketType.NON_HIERARCHICAL

  monkeypatch.setattr(extended_gcsfs.ExtendedGcsFileSystem, "_get_bucket_type", flat)

  def forget_clients():  # cached filesystems, clients and buckets hold an endpoint
    fsspec.get_filesystem_class("gs").clear_instance_cache()
    backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
    gcs_utils.get_bucket.cache_clear()

  forget_clients()
  monkeypatch.chdir(tmp_path)
  yield emulator
  forget_clients()
  assert os.listdir(tmp_path) == []  # nothing of the bucket landed on local disk


class State(typing.NamedTuple):
  """A train-state-like pytree: nested float and integer arrays, and the `policy_version`
  that `Checkpointer.save` records in the meta."""
  params: dict
  opt_state: tuple
  policy_version: jax.Array


def state_at(step: int) -> State:
  return State(params={"w": jnp.arange(12.0).reshape(3, 4) * step, "b": jnp.full((5,), step, jnp.int32)},
               opt_state=(jnp.linspace(0.0, 1.0, 7) + step, jnp.int32(step)),
               policy_version=jnp.int32(10 * step))


def abstract(state: State):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def assert_equal(restored: State, expected: State):
  assert jax.tree.structure(restored) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def config(directory: str, **checkpoint) -> Config:
  return Config(checkpoint=CheckpointConfig(directory=directory, **{"save_every_steps": 2, "keep": 2,
                                                                    **checkpoint}))


def save_steps(directory: str, steps: range, **checkpoint) -> None:
  """What the training loop does: save when due (orbax: the first step, then every
  `save_every_steps`), and the last step forced."""
  checkpointer = Checkpointer(config(directory, **checkpoint), writer=True)
  for step in steps:
    checkpointer.save(step, state_at(step), {"position": step}, force=step == steps[-1])
  checkpointer.close()


@pytest.mark.parametrize("async_save", [True, False])
def test_checkpoints_in_a_bucket_are_saved_listed_and_restored_there(gcs_server, async_save):
  directory = gcs_server.directory
  save_steps(directory, range(1, 6), async_save=async_save)  # 1, 2, 4 and 5 saved; keep 2
  checkpointer = Checkpointer(config(directory))  # a new process's view: the bucket's listing
  assert checkpointer.latest_step() == 5 and checkpointer.all_steps() == [4, 5]

  state, data, meta = checkpointer.restore(abstract(state_at(0)))
  assert_equal(state, state_at(5))
  assert data == {"position": 5} and meta["step"] == 5 and meta["policy_version"] == 50
  assert meta["config"]["checkpoint"]["directory"] == directory
  state, data, _ = checkpointer.restore(abstract(state_at(0)), step=4)
  assert_equal(state, state_at(4))
  assert data == {"position": 4}
  checkpointer.close()

  names = gcs_server.names()
  assert {name.split("/")[0] for name in names} == {"4", "5"}  # 1, 2 deleted; no temporary left
  for step in (4, 5):
    assert json.loads(gcs_server.read(f"{step}/meta/metadata"))["step"] == step
    assert f"{step}/_CHECKPOINT_METADATA" in names and f"{step}/state/manifest.ocdbt" in names
    arrays = [name for name in names if name.startswith(f"{step}/state/ocdbt.process_0/d/")]
    assert arrays
    # The array data went through TensorStore's gcs driver to the emulator.
    assert {gcs_server.uploads[name] for name in arrays} == {"tensorstore"}


def test_a_damaged_bucket_checkpoint_is_moved_aside_in_the_bucket(gcs_server):
  directory = gcs_server.directory
  save_steps(directory, range(1, 5))  # checkpoints 2 and 4 kept
  files = [name.removeprefix("4/") for name in gcs_server.names() if name.startswith("4/")]
  arrays = [name for name in files if name.startswith("state/") and name.split("/")[-2] == "d"]
  assert arrays
  for name in arrays:  # what an interrupted copy leaves: every array object cut in half
    data = gcs_server.read(f"4/{name}")
    gcs_server.write(f"4/{name}", data[:len(data) // 2])

  checkpointer = Checkpointer(config(directory), writer=True)  # the learner's: it moves
  messages = []
  state, data, _ = checkpointer.restore(abstract(state_at(0)), log=messages.append)
  assert_equal(state, state_at(2))
  assert data == {"position": 2}
  assert checkpointer.all_steps() == [2] and checkpointer.latest_step() == 2
  checkpointer.close()

  [message] = messages
  assert message.startswith(f"checkpoint {directory}/4 does not restore")
  assert "resuming from step 2" in message and "tensorstore_spec" not in message
  [moved] = {name.split("/")[0] for name in gcs_server.names()} - {"2"}
  assert moved.startswith("corrupt-4-") and f"Moved it to {directory}/{moved}" in message
  moved_files = [name.removeprefix(f"{moved}/") for name in gcs_server.names()
                 if name.startswith(f"{moved}/")]
  assert sorted(moved_files) == sorted(files)  # kept whole, in the bucket
