"""Multi-host plumbing on one process: cluster settings from the environment,
per-host batch rows, and bucket URLs that reach orbax intact (no network)."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from sao_jax import storage
from sao_jax.channel import weights, weights_directory
from sao_jax.config import CheckpointConfig, Config
from sao_jax.run import checkpoint
from sao_jax.sharding import distributed


def test_no_cluster_settings_means_single_host():
  assert distributed.initialize({}) is False
  assert jax.process_count() == 1


@pytest.mark.parametrize("environ, message", [
    ({"SAO_COORDINATOR_ADDRESS": "10.0.0.2:8476"}, "needs SAO_NUM_PROCESSES set to an integer"),
    ({"SAO_COORDINATOR_ADDRESS": "10.0.0.2:8476", "SAO_NUM_PROCESSES": "four",
      "SAO_PROCESS_ID": "0"}, "got 'four'"),
    ({"SAO_COORDINATOR_ADDRESS": "10.0.0.2:8476", "SAO_NUM_PROCESSES": "4"},
     "needs SAO_PROCESS_ID"),
    ({"SAO_COORDINATOR_ADDRESS": "10.0.0.2:8476", "SAO_NUM_PROCESSES": "4",
      "SAO_PROCESS_ID": "4"}, r"SAO_PROCESS_ID=4 is not in \[0, SAO_NUM_PROCESSES=4\)"),
])
def test_bad_cluster_settings_are_named(environ, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize(environ)


def test_one_host_loads_every_row_of_its_devices():
  mesh = jax.make_mesh((4, 2), ("data", "tensor"))
  shardings = {"tokens": NamedSharding(mesh, P("data", None)),
               "ids": NamedSharding(mesh, P("data"))}
  batch = {"tokens": np.arange(8 * 5, dtype=np.int32).reshape(8, 5),
           "ids": np.arange(8, dtype=np.int32)}
  assert distributed.local_rows(shardings["tokens"], (8, 5)) == slice(0, 8)
  assembled = distributed.global_batch(batch, shardings, batch_size=8)
  for name, array in assembled.items():
    assert array.sharding == shardings[name]
    np.testing.assert_array_equal(np.asarray(array), batch[name])
  with pytest.raises(ValueError, match=r"loaded 4 rows but holds rows \[0, 8\)"):
    distributed.global_batch({k: v[:4] for k, v in batch.items()}, shardings, batch_size=8)


def test_storage_path_keeps_bucket_urls(tmp_path, monkeypatch, emulated_gcs):
  assert str(storage.storage_path("gs://bucket/run")) == "gs://bucket/run"
  assert str(storage.storage_path("gs://bucket/run") / "7") == "gs://bucket/run/7"
  monkeypatch.chdir(tmp_path)
  assert storage.storage_path("runs/a") == tmp_path / "runs" / "a"


class FakeManager:
  """Records the directory orbax would be given; touches no storage."""

  def __init__(self, directory, **kwargs):
    del kwargs
    self.directory = directory

  def all_steps(self):  # an empty bucket: no earlier run's versions to delete
    return []

  def close(self):
    pass


def test_bucket_urls_reach_orbax_intact(monkeypatch, emulated_gcs):
  monkeypatch.setattr(checkpoint.ocp, "CheckpointManager", FakeManager)
  # The weights publisher lists the bucket itself (earlier versions, signed heads).
  listed = []
  monkeypatch.setattr(weights_directory, "_names",  # an empty bucket
                      lambda directory: listed.append(str(directory)) or [])
  cfg = Config(checkpoint=CheckpointConfig(directory="gs://bucket/run/checkpoints"))
  checkpointer = checkpoint.Checkpointer(cfg)
  assert str(checkpointer._manager.directory) == "gs://bucket/run/checkpoints"
  publisher = weights.DirectoryWeights("gs://bucket/run/weights", {"w": np.zeros(3)})
  assert str(publisher._manager.directory) == "gs://bucket/run/weights"
  assert publisher.spec.directory == "gs://bucket/run/weights"
  assert set(listed) == {"gs://bucket/run/weights", "gs://bucket/run/weights/signatures"}


def test_hosts_pad_their_rows_to_the_agreed_length():
  from sao_jax.types import Batch
  rows = Batch(*[np.ones((2, 3), dtype) for dtype in
                 (np.int32, np.int32, np.int32, np.float32, np.float32, np.int32, np.int32)])
  padded = distributed.pad_length(rows, 5, pad_id=7)
  assert padded.shape == (2, 5) and distributed.pad_length(rows, 3, pad_id=7) is rows
  np.testing.assert_array_equal(padded.tokens[:, 3:], 7)
  for name in ("segment_ids", "action_mask", "behavior_logp", "rewards"):
    np.testing.assert_array_equal(getattr(padded, name)[:, 3:], 0)  # joins no segment
  for name in ("prompt_ids", "behavior_version"):
    np.testing.assert_array_equal(getattr(padded, name)[:, 3:], -1)
  np.testing.assert_array_equal(padded.rewards[:, :3], 1)
  with pytest.raises(ValueError, match="length 3 to 2"):
    distributed.pad_length(rows, 2, pad_id=0)
  # One host: its own length, or stop when it has no batch.
  assert distributed.agree_on_batch(3) == 3 and distributed.agree_on_batch(None) is None
  assert distributed.any_host(True) and not distributed.any_host(False)


def test_each_learner_host_builds_an_equal_share_of_the_batch():
  import dataclasses

  from sao_jax.config import AlgorithmConfig, LearnerConfig
  from sao_jax.jobs.train import local_batch_sizes
  cfg = Config(learner=LearnerConfig(batch_trajectories=16))
  assert local_batch_sizes(cfg, 1) == (16, None) and local_batch_sizes(cfg, 4) == (4, None)
  packed = Config(learner=LearnerConfig(batch_trajectories=16, batch_tokens=1024,
                                        row_length=128))
  assert local_batch_sizes(packed, 2) == (8, 512)  # 4 of the 8 rows of 128 tokens
  with pytest.raises(ValueError, match="batch_rows=16.*multiple of the 3 learner hosts"):
    local_batch_sizes(cfg, 3)
  grpo = dataclasses.replace(cfg, algorithm=AlgorithmConfig.for_variant("grpo", group_size=8))
  with pytest.raises(ValueError, match="4 host shares of whole groups"):
    local_batch_sizes(grpo, 4)
