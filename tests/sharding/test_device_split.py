"""`run.device_split` on the 8 emulated CPU devices: the learner's and the samplers'
meshes come from disjoint devices, each sampler process opens only its own, and a
split that does not add up is refused before anything compiles."""

import dataclasses
import os
import pathlib
import time
import types

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


# TPU: the split is made from the chip count before any backend starts.

def tpu_env(chips, port):
  """The variables the recipe gives a process owning `chips` (a list) on `port`."""
  return {"TPU_VISIBLE_CHIPS": ",".join(map(str, chips)),
          "TPU_CHIPS_PER_PROCESS_BOUNDS": f"1,{len(chips)},1", "TPU_PROCESS_BOUNDS": "1,1,1",
          "TPU_PROCESS_PORT": str(port), "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
          "CLOUD_TPU_TASK_ID": "0", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


@pytest.mark.parametrize("split, chips, expected", [
    ((4, 4), 8, [{"TPU_VISIBLE_CHIPS": "0,1,2,3", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,4,1",
                  "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_PORT": "8476",
                  "TPU_PROCESS_ADDRESSES": "localhost:8476", "CLOUD_TPU_TASK_ID": "0",
                  "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
                 {"TPU_VISIBLE_CHIPS": "4,5,6,7", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,4,1",
                  "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_PORT": "8477",
                  "TPU_PROCESS_ADDRESSES": "localhost:8477", "CLOUD_TPU_TASK_ID": "0",
                  "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}]),
    ((2, 2), 4, [tpu_env([0, 1], 8476), tpu_env([2, 3], 8477)]),
    ((6, 2), 8, [tpu_env([0, 1, 2, 3, 4, 5], 8476), tpu_env([6, 7], 8477)]),
    ((4, 1, 3), 8, [tpu_env([0, 1, 2, 3], 8476), tpu_env([4], 8477), tpu_env([5, 6, 7], 8478)]),
])
def test_each_tpu_process_gets_its_chips_bounds_and_port(split, chips, expected):
  assert device_split.tpu_plan(split, chips, {}) == expected


def test_tpu_ports_count_up_from_the_learners_tpu_process_port():
  envs = device_split.tpu_plan((2, 1, 1), 4, {"TPU_PROCESS_PORT": "9100"})
  assert [(e["TPU_PROCESS_PORT"], e["TPU_PROCESS_ADDRESSES"]) for e in envs] == [
      ("9100", "localhost:9100"), ("9101", "localhost:9101"), ("9102", "localhost:9102")]
  for port in ("auto", "0", "65535"):
    with pytest.raises(ValueError, match=rf"TPU_PROCESS_PORT='{port}'.*ports TPU_PROCESS_PORT "
                                         r"to TPU_PROCESS_PORT \+ 2.*below 65534"):
      device_split.tpu_plan((2, 1, 1), 4, {"TPU_PROCESS_PORT": port})


@pytest.mark.parametrize("split", [(4, 3), (6, 4)])
def test_a_tpu_split_that_does_not_add_up_to_the_chips_is_refused(split):
  with pytest.raises(ValueError, match=(rf"run.device_split=\({split[0]}, {split[1]}\) gives out "
                                        rf"{sum(split)} TPU chips but this host has 8.*"
                                        r"e.g. --set run.device_split=\[7, 1\]")):
    device_split.tpu_plan(split, 8, {})


def test_chips_of_two_devices_and_an_earlier_chip_bound_are_refused():
  with pytest.raises(ValueError, match=r"TPU7x \(PCI device 0x0076\), which JAX shows as two "
                                       r"devices each.*run.device_split=\[\]"):
    device_split.tpu_plan((4, 4), 8, {}, "TPU7x (PCI device 0x0076)")
  with pytest.raises(ValueError, match=r"TPU_VISIBLE_CHIPS='4,5,6,7' is set.*all of this "
                                       r"host's 8 TPU chips itself; unset it"):
    device_split.tpu_plan((4, 4), 8, {"TPU_VISIBLE_CHIPS": "4,5,6,7"})
  # The learner's own value (a second run in one process) is no conflict.
  assert device_split.tpu_plan((4, 4), 8, {"TPU_VISIBLE_CHIPS": "0,1,2,3"})[0][
      "TPU_VISIBLE_CHIPS"] == "0,1,2,3"


def test_tpu_chips_are_counted_from_dev(tmp_path):
  assert device_split.tpu_chip_count(tmp_path) == 0
  (tmp_path / "accel").mkdir()  # the kernel's accel subsystem (other vendors), no TPU chip
  assert device_split.tpu_chip_count(tmp_path) == 0
  (tmp_path / "vfio").mkdir()
  for name in ("vfio", "0", "1", "2", "3"):  # /dev/vfio/vfio is the container, not a chip
    (tmp_path / "vfio" / name).touch()
  assert device_split.tpu_chip_count(tmp_path) == 4
  for n in range(8):  # /dev/accel<n> (TPU v2-v4) is counted first
    (tmp_path / f"accel{n}").touch()
  assert device_split.tpu_chip_count(tmp_path) == 8
  # These tests force JAX onto the CPU: not a TPU host, whatever /dev holds.
  assert jax.config.jax_platforms == "cpu" and device_split.host_tpu_chips(tmp_path) == 0


@pytest.mark.parametrize("platforms, tpu", [(None, True), ("", True), ("tpu", True),
                                            ("TPU,cpu", True), ("cpu", False), ("cuda", False),
                                            ("cpu,tpu", False)])
def test_tpu_is_the_backend_unless_jax_platforms_puts_another_first(platforms, tpu):
  assert device_split.tpu_first(platforms) is tpu


def test_chips_of_two_devices_are_found_on_the_pci_bus(tmp_path):
  def pci_device(slot, vendor, device):
    (tmp_path / slot).mkdir()
    (tmp_path / slot / "vendor").write_text(vendor + "\n")
    (tmp_path / slot / "device").write_text(device + "\n")

  pci_device("0000:00:01.0", "0x8086", "0x0076")  # another vendor's 0x0076
  pci_device("0000:00:04.0", "0x1ae0", "0x006f")  # v6e: one device per chip
  assert device_split.two_device_chips(tmp_path) is None
  pci_device("0000:00:05.0", "0x1ae0", "0x0076")
  assert device_split.two_device_chips(tmp_path) == "TPU7x (PCI device 0x0076)"
  assert device_split.two_device_chips(tmp_path / "absent") is None


@pytest.fixture
def tpu_host(monkeypatch):
  """This process as the learner on a TPU host of 8 one-device chips: no TPU variables
  or cluster set (restored after), and any call that would start a JAX backend fails."""
  from sao_jax.sharding import distributed

  for name in (*device_split.TPU_VARIABLES, distributed.ENV_ADDRESS):
    monkeypatch.setenv(name, "recorded so that teardown restores it")
    monkeypatch.delenv(name)
  monkeypatch.setattr(device_split, "host_tpu_chips", lambda: 8)
  monkeypatch.setattr(device_split, "two_device_chips", lambda: None)

  def backend(*args, **kwargs):
    raise AssertionError("the JAX backend was asked for before the TPU chips were claimed")

  for name in ("devices", "local_devices", "device_count", "process_count", "process_index"):
    monkeypatch.setattr(jax, name, backend)
  return monkeypatch


def test_the_learner_claims_its_tpu_chips_without_starting_the_backend(tpu_host):
  from sao_jax.jobs import train

  cfg = C.Config(run=C.RunConfig(num_samplers=1, device_split=(6, 2))).validate()
  samplers = train.claim_tpu_chips(cfg)
  assert samplers == [tpu_env([6, 7], 8477)]
  assert {name: os.environ[name] for name in device_split.TPU_VARIABLES} == tpu_env(
      [0, 1, 2, 3, 4, 5], 8476)
  assert train.claim_tpu_chips(dataclasses.replace(
      cfg, run=dataclasses.replace(cfg.run, device_split=()))) is None


def test_a_tpu_split_is_refused_before_anything_is_claimed(tpu_host):
  from sao_jax.jobs import train
  from sao_jax.sharding import distributed

  cfg = C.Config(run=C.RunConfig(num_samplers=1, device_split=(6, 1))).validate()
  with pytest.raises(ValueError, match=r"gives out 7 TPU chips but this host has 8"):
    train.claim_tpu_chips(cfg)
  tpu_host.setenv(distributed.ENV_ADDRESS, "10.0.0.2:8476")
  with pytest.raises(ValueError, match=r"run.device_split=\(6, 2\) splits one host's devices, "
                                       r"and SAO_COORDINATOR_ADDRESS='10.0.0.2:8476' makes this "
                                       r"learner a cluster of hosts; set run.device_split=\[\]"):
    train.claim_tpu_chips(dataclasses.replace(
        cfg, run=dataclasses.replace(cfg.run, device_split=(6, 2))))
  assert not set(device_split.TPU_VARIABLES) & set(os.environ)


def test_sao_train_claims_the_tpu_chips_before_it_joins_a_cluster(tpu_host, tmp_path):
  """`train.run`'s first act: the learner's variables are in os.environ when
  `distributed.initialize` (the first thing that may start a backend) is called."""
  from sao_jax.jobs import train
  from sao_jax.sharding import distributed

  seen = {}

  class Joined(Exception):
    """Stops the run there: what follows is the ordinary start."""

  def initialize():
    seen.update({name: os.environ.get(name) for name in device_split.TPU_VARIABLES})
    raise Joined

  tpu_host.setattr(distributed, "initialize", initialize)
  cfg = C.Config(run=C.RunConfig(run_dir=str(tmp_path), num_samplers=1,
                                 device_split=(4, 4))).validate()
  with pytest.raises(Joined):
    train.run(cfg)
  assert seen == tpu_env([0, 1, 2, 3], 8476)


def test_nothing_sao_train_loads_before_the_claim_starts_a_backend():
  """sao-train imports the CLI, loads the config and imports the training job before
  `train.run` claims the chips; none of it may start the backend, else libtpu would
  open every chip first."""
  import subprocess
  import sys

  code = ("from sao_jax.cli import train as cli\n"
          "from sao_jax.jobs import startup\n"
          "startup.load('configs/demo_cpu.py', ['run.num_samplers=1', 'run.device_split=[4,4]'])\n"
          "from sao_jax.jobs import train\n"
          "from jax._src import xla_bridge\n"
          "print(xla_bridge.backends_are_initialized())\n")
  root = pathlib.Path(__file__).resolve().parents[2]
  out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(root)}, check=True)
  assert out.stdout.strip() == "False", out.stderr


def test_the_learner_on_tpu_must_have_opened_its_share(monkeypatch):
  """After the claim, the backend the learner starts must be TPU and hold its chips
  alone: other devices mean the host was no TPU host; more, that the variables came
  too late or were ignored."""
  from sao_jax.jobs import train

  cfg = C.Config(run=C.RunConfig(num_samplers=1, device_split=(6, 2))).validate()
  monkeypatch.setenv("TPU_VISIBLE_CHIPS", "0,1,2,3,4,5")
  samplers = [tpu_env([6, 7], 8477)]
  with pytest.raises(ValueError, match=r"taken for a TPU host.*but JAX opened cpu devices; "
                                       r"start sao-train with JAX_PLATFORMS=cpu"):
    train.local_devices(cfg, samplers)
  chips = [types.SimpleNamespace(platform="tpu", id=i) for i in range(8)]
  monkeypatch.setattr(jax, "local_devices", lambda: chips)
  with pytest.raises(ValueError, match=r"the learner opened 8 TPU devices under "
                                       r"TPU_VISIBLE_CHIPS='0,1,2,3,4,5', not its 6"):
    train.local_devices(cfg, samplers)
  monkeypatch.setattr(jax, "local_devices", lambda: chips[:6])
  assert train.local_devices(cfg, samplers) == (chips[:6], samplers)
