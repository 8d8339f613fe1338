"""One host's devices split between the learner and its local sampler processes.

`run.device_split = (n_learner, n_sampler_0, n_sampler_1, ...)` hands the host's
devices out in order: the learner takes the first n_learner (its mesh is built
over them alone), sampler process i the next n_sampler_i. E.g. (6, 2) on 8 chips:
learner devices 0-5, the one sampler 6-7. The split must add up to the devices the
host has, which is checked before anything is compiled.

Each process sees only its devices: it starts with environment variables that
make its JAX runtime open them alone, set before its backend starts (a sampler
is spawned with them, `sao_jax.sampler.worker.spawned_with`):

  cpu  JAX_PLATFORMS=cpu, JAX_NUM_CPU_DEVICES=n (emulated devices: n of its own)
  gpu  CUDA_VISIBLE_DEVICES=<its GPUs> (mapped through the learner's own
       CUDA_VISIBLE_DEVICES when that is set)
  tpu  the chips [start, start + n) and a one-process slice of them (`tpu_env`):
       TPU_VISIBLE_CHIPS=start,...,start+n-1   TPU_CHIPS_PER_PROCESS_BOUNDS=1,n,1
       TPU_PROCESS_BOUNDS=1,1,1   TPU_PROCESS_PORT=p   TPU_PROCESS_ADDRESSES=localhost:p
       CLOUD_TPU_TASK_ID=0   ALLOW_MULTIPLE_LIBTPU_LOAD=1
       (the recipe of vLLM's tpu-inference for data-parallel processes on one
       host, tpu_inference/worker/tpu_worker.py; not yet run on a TPU VM here)

On CPU and GPU the learner process opens the whole host before the split is
made (`local_plan` takes its `jax.local_devices()`), so on GPU it must not
preallocate memory on the samplers' GPUs: the split is refused unless
XLA_PYTHON_CLIENT_PREALLOCATE=false. On TPU that cannot work: libtpu opens every
chip it is allowed when the backend starts and holds them, so the learner must
get its own variables first. There the split is made from the chip count alone
(`host_tpu_chips`: /dev entries, no backend) and the learner's variables go into
its os.environ before anything starts the backend (`sao_jax.jobs.train`).
`tpu_plan` counts chips, not devices: it is for generations with one JAX device
per chip (v4 and v5p megacore, v5e, v6e); hosts whose chips are two devices
each (v2, v3, TPU7x) are refused (`two_device_chips`).

  split_devices(split, devices)               -> [learner devices, sampler 0's, ...]
  sampler_env(platform, indices, environ)     -> {variable: value} for one sampler
  local_plan(split, devices, environ)         -> (learner devices, [sampler envs])
  host_tpu_chips()                            -> TPU chips JAX would open here, or 0
  tpu_plan(split, chips, environ, two_device) -> [learner env, sampler 0's, ...]
"""

from __future__ import annotations

import pathlib
from typing import Mapping, Sequence

import jax

# libtpu's variables, as `tpu_env` sets them for each process.
TPU_VARIABLES = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
                 "TPU_PROCESS_PORT", "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID",
                 "ALLOW_MULTIPLE_LIBTPU_LOAD")
# The learner's TPU_PROCESS_PORT unless sao-train starts with one set; sampler i takes
# the next ports (`tpu_plan`). Fixed ports rather than ones the OS picks: a restarted
# sampler binds the port its predecessor freed, and a port below the ephemeral range
# (32768 and up on Linux) cannot meanwhile be taken as the local end of one of the
# learner's own outgoing connections, as an OS-picked one could. 8476 is where
# torch_xla's single-host multi-process setup starts counting too.
TPU_BASE_PORT = 8476
# PCI device ids (vendor 0x1ae0) of TPU chips with two TensorCores that JAX shows as
# two devices each (as the tpu-info tool lists them): `tpu_plan`'s chip bounds
# assume one device per chip.
GOOGLE_PCI_VENDOR = "0x1ae0"
TWO_DEVICE_CHIPS = {"0x0027": "TPU v2/v3", "0x0076": "TPU7x"}


def adds_up(split: Sequence[int], count: int, unit: str) -> None:
  """ValueError naming `split`, what it gives out and the host's `count` of `unit`
  (devices, chips) when they differ."""
  if sum(split) == count:
    return
  samplers = len(split) - 1
  example = (count - samplers,) + (1,) * samplers if count > samplers else None
  raise ValueError(
      f"run.device_split={tuple(split)} gives out {sum(split)} {unit} but this host has "
      f"{count}; make the learner's share and each of the {samplers} sampler "
      f"processes' shares add up to {count}"
      + (f", e.g. --set run.device_split={list(example)}" if example else "")
      + ", or set run.device_split=[] to give every process all of them")


def split_devices(split: Sequence[int], devices: Sequence[jax.Device]) -> list[list[jax.Device]]:
  """`devices` cut in order into groups of `split`'s sizes; ValueError naming the
  split and the device count when they do not add up."""
  adds_up(split, len(devices), "devices")
  groups, start = [], 0
  for size in split:
    groups.append(list(devices[start:start + size]))
    start += size
  return groups


def sampler_env(platform: str, indices: Sequence[int], environ: Mapping[str, str]
                ) -> dict[str, str]:
  """Environment variables under which a process started from one with `environ`
  opens only the host devices at `indices` (positions in the learner's
  `jax.local_devices()`) of `platform` (module docstring)."""
  if platform == "cpu":
    return {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(len(indices))}
  if platform in ("gpu", "cuda"):
    if environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() != "false":
      raise ValueError(
          "run.device_split on GPUs: the learner process preallocates memory on every GPU "
          "it sees, the samplers' too; start sao-train with XLA_PYTHON_CLIENT_PREALLOCATE=false")
    visible = environ.get("CUDA_VISIBLE_DEVICES", "")
    host_ids = [part.strip() for part in visible.split(",")] if visible.strip() else None
    return {"CUDA_VISIBLE_DEVICES": ",".join(
        host_ids[i] if host_ids else str(i) for i in indices)}
  if platform == "tpu":  # host_tpu_chips found none, so nothing claimed chips before the backend
    raise ValueError(
        "run.device_split on 'tpu' devices is not supported once the backend has started: "
        "libtpu then holds every chip. On TPU the split is made before that, from the chips "
        "under /dev/accel<n> or /dev/vfio/<n>, and this host showed none there (or "
        f"JAX_PLATFORMS={jax.config.jax_platforms!r} does not put tpu first); set "
        "run.device_split=[] and run the samplers on other hosts (run.num_samplers=0, "
        "sao-sampler)")
  raise ValueError(
      f"run.device_split on {platform!r} devices is not supported: a {platform} process "
      "opens all of the host's chips unless started with its own chip bounds; set "
      "run.device_split=[] and run the samplers on other hosts (run.num_samplers=0, "
      "sao-sampler), or on CPU/GPU/TPU hosts")


def local_plan(split: Sequence[int], devices: Sequence[jax.Device], environ: Mapping[str, str]
               ) -> tuple[list[jax.Device], list[dict[str, str]]]:
  """(the learner's devices, each sampler process's environment) of `split` over this
  host's `devices` (`jax.local_devices()`); ValueError before anything is compiled
  when the split does not add up or the platform cannot be split."""
  groups = split_devices(split, devices)
  platform = devices[0].platform
  envs, start = [], len(groups[0])
  for group in groups[1:]:
    envs.append(sampler_env(platform, range(start, start + len(group)), environ))
    start += len(group)
  return groups[0], envs


def tpu_chip_count(dev: pathlib.Path = pathlib.Path("/dev")) -> int:
  """TPU chips attached to this host, counted without starting a JAX backend, as Ray
  and tpu-inference count them: the /dev/accel<n> entries (TPU v2-v4), else the
  numeric entries of /dev/vfio (v5e and later, one VFIO group per chip; /dev/vfio/vfio
  is the container, not a chip); 0 on a host with neither. Only accel<n>: the kernel's
  accel subsystem puts other vendors' devices in a /dev/accel/ directory."""
  accel = [entry for entry in dev.glob("accel*") if entry.name[len("accel"):].isdigit()]
  if accel:
    return len(accel)
  vfio = dev / "vfio"
  return sum(entry.name.isdigit() for entry in vfio.iterdir()) if vfio.is_dir() else 0


def tpu_first(platforms: str | None) -> bool:
  """Whether JAX's default backend can be TPU under `jax_platforms` (JAX_PLATFORMS):
  unset, JAX takes TPU first where there is one; set, the first platform listed."""
  return not platforms or platforms.split(",")[0].strip().lower() == "tpu"


def host_tpu_chips(dev: pathlib.Path = pathlib.Path("/dev")) -> int:
  """The TPU chips JAX's backend would open here, 0 where it would not be TPU (no
  chips, or `jax_platforms` naming another platform first); starts no backend."""
  return tpu_chip_count(dev) if tpu_first(jax.config.jax_platforms) else 0


def two_device_chips(pci: pathlib.Path = pathlib.Path("/sys/bus/pci/devices")) -> str | None:
  """The name of the TPU chips on this host's PCI bus that JAX shows as two devices
  each (`TWO_DEVICE_CHIPS`), or None: none such, or no PCI listing to read."""
  for vendor in sorted(pci.glob("*/vendor")):
    try:
      if vendor.read_text().strip() != GOOGLE_PCI_VENDOR:
        continue
      device = (vendor.parent / "device").read_text().strip()
    except OSError:  # a device that went away while listed: not a TPU chip we could use
      continue
    if device in TWO_DEVICE_CHIPS:
      return f"{TWO_DEVICE_CHIPS[device]} (PCI device {device})"
  return None


def tpu_env(start: int, count: int, port: int) -> dict[str, str]:
  """Environment under which a process opens only the TPU chips [start, start +
  count), as a one-process slice of 1 x count x 1 chips whose runtime listens on
  localhost:`port` (module docstring)."""
  return {"TPU_VISIBLE_CHIPS": ",".join(str(chip) for chip in range(start, start + count)),
          "TPU_CHIPS_PER_PROCESS_BOUNDS": f"1,{count},1",
          "TPU_PROCESS_BOUNDS": "1,1,1",
          "TPU_PROCESS_PORT": str(port),
          "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
          "CLOUD_TPU_TASK_ID": "0",
          # Several processes of one host load libtpu, each for its own chips; libtpu's
          # host-wide lock file would refuse all but the first (JAX's own multi-process
          # TPU tests set this beside the chip bounds).
          "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def tpu_plan(split: Sequence[int], chips: int, environ: Mapping[str, str],
             two_device: str | None = None) -> list[dict[str, str]]:
  """Each process's `tpu_env`, the learner's first: `split` handed out over the
  host's `chips` in order, process i on port TPU_PROCESS_PORT + i (environ's, else
  `TPU_BASE_PORT`). ValueError, before any backend starts, when the chips are
  `two_device` ones, the split does not add up to `chips`, sao-train was started
  with other TPU_VISIBLE_CHIPS, or a port is not one."""
  if two_device:
    raise ValueError(
        f"run.device_split on TPU: this host's chips are {two_device}, which JAX shows as "
        "two devices each, and the split hands out whole chips of one device (TPU v4, v5e, "
        "v5p, v6e); set run.device_split=[] and run the samplers on other hosts "
        "(run.num_samplers=0, sao-sampler)")
  adds_up(split, chips, "TPU chips")
  base = environ.get("TPU_PROCESS_PORT", str(TPU_BASE_PORT))
  if not base.isdigit() or not 0 < int(base) <= 65535 - (len(split) - 1):
    raise ValueError(
        f"TPU_PROCESS_PORT={base!r}: run.device_split gives its {len(split)} processes ports "
        f"TPU_PROCESS_PORT to TPU_PROCESS_PORT + {len(split) - 1}; set it to a free port "
        f"number below {65536 - (len(split) - 1)}, or unset it ({TPU_BASE_PORT})")
  envs, start = [], 0
  for i, size in enumerate(split):
    envs.append(tpu_env(start, size, int(base) + i))
    start += size
  visible = environ.get("TPU_VISIBLE_CHIPS")
  # Chips are counted from /dev, which a process already bounded to some of them does
  # not see; the learner's own value is fine (a second run in one process).
  if visible and visible != envs[0]["TPU_VISIBLE_CHIPS"]:
    raise ValueError(
        f"TPU_VISIBLE_CHIPS={visible!r} is set, and run.device_split hands out all of this "
        f"host's {chips} TPU chips itself; unset it, or set run.device_split=[] to keep "
        "this process on those chips")
  return envs
