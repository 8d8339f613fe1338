"""`run.device_split` on the 8 emulated CPU devices: the learner's and the samplers'
meshes come from disjoint devices, each sampler process opens only its own, and a
split that does not add up is refused before anything compiles."""

import dataclasses
import os
import pathlib
import time

import jax
import pytest

from sao_jax import config as C
from sao_jax.channel.transport import QueueTransport
from sao_jax.sampler.worker import SamplerSupervisor, WorkerSpec
from sao_jax.sharding import device_split
from sao_jax.sharding.mesh import make_mesh


def test_learner_and_sampler_meshes_use_disjoint_devices():
  learner, sampler = device_split.split_devices((6, 2), jax.devices())
  learner_mesh = make_mesh(C.MeshConfig(fsdp=-1, tensor=2), learner)
  sampler_mesh = make_mesh(C.MeshConfig(fsdp=1, tensor=-1), sampler)
  assert dict(learner_mesh.shape)["fsdp"] == 3 and dict(sampler_mesh.shape)["tensor"] == 2
  learner_ids = {d.id for d in learner_mesh.devices.flat}
  sampler_ids = {d.id for d in sampler_mesh.devices.flat}
  assert learner_ids == set(range(6)) and sampler_ids == {6, 7}


@pytest.mark.parametrize("split", [(5, 2), (6, 3), (8, 1)])
def test_a_split_that_does_not_add_up_is_refused(split):
  with pytest.raises(ValueError, match=(rf"run.device_split=\({split[0]}, {split[1]}\) gives out "
                                        rf"{sum(split)} devices but this host has 8.*"
                                        r"e.g. --set run.device_split=\[7, 1\]")):
    device_split.split_devices(split, jax.devices())


def test_the_split_is_checked_before_training_compiles(tmp_path):
  from sao_jax.jobs import train

  cfg = C.Config(run=C.RunConfig(run_dir=str(tmp_path), num_samplers=2,
                                 device_split=(4, 2, 1))).validate()
  with pytest.raises(ValueError, match=r"gives out 7 devices but this host has 8"):
    train.local_devices(cfg)
  learner, envs = train.local_devices(dataclasses.replace(
      cfg, run=dataclasses.replace(cfg.run, device_split=(4, 2, 2))))
  assert [d.id for d in learner] == [0, 1, 2, 3]
  assert envs == [{"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}] * 2


@pytest.mark.parametrize("split", [(6,), (6, 0), (6, True)])
def test_config_wants_one_count_per_process(split):
  with pytest.raises(ValueError, match=r"run.device_split.*1 \+ run.num_samplers = 2"):
    C.RunConfig(num_samplers=1, device_split=split).validate()


def test_gpu_and_tpu_variables():
  with pytest.raises(ValueError, match="XLA_PYTHON_CLIENT_PREALLOCATE=false"):
    device_split.sampler_env("gpu", [6, 7], {})
  assert device_split.sampler_env("gpu", [6, 7], {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}) == {
      "CUDA_VISIBLE_DEVICES": "6,7"}
  # Positions in the learner's devices map through its own CUDA_VISIBLE_DEVICES.
  assert device_split.sampler_env("gpu", [1, 2], {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                                                   "CUDA_VISIBLE_DEVICES": "3,5,9"}) == {
      "CUDA_VISIBLE_DEVICES": "5,9"}
  with pytest.raises(ValueError, match="'tpu' devices is not supported"):
    device_split.sampler_env("tpu", [6, 7], {})


def report_devices(spec, alive):
  """A sampler process's stand-in: writes the devices its JAX runtime opened."""
  devices = jax.local_devices()
  out = pathlib.Path(os.environ["SAO_TEST_DEVICES"]) / f"{spec.worker_id}.txt"
  out.write_text(f"{devices[0].platform} {len(devices)}")


def test_each_sampler_process_opens_only_its_devices(tmp_path, monkeypatch):
  """(5, 1, 2): the learner keeps 5 devices, sampler 0 opens 1 and sampler 1 opens 2."""
  monkeypatch.setenv("SAO_TEST_DEVICES", str(tmp_path))
  learner, envs = device_split.local_plan((5, 1, 2), jax.local_devices(), os.environ)
  assert len(learner) == 5
  transport = QueueTransport(capacity=4)
  specs = [WorkerSpec(cfg=C.Config(), tokenizer_path="", weights=None, transport=transport,
                      worker_id=i, env=tuple(sorted(env.items()))) for i, env in enumerate(envs)]
  supervisor = SamplerSupervisor(specs, run=report_devices, log=lambda line: None)
  try:
    supervisor.start()
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.txt"))) < 2 and time.monotonic() < deadline:
      time.sleep(0.1)
  finally:
    transport.close()
    supervisor.stop()
  assert (tmp_path / "0.txt").read_text() == "cpu 1"
  assert (tmp_path / "1.txt").read_text() == "cpu 2"
