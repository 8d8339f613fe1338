"""Ready single-host layouts: one machine's accelerators split between the learner
and one local sampler process.

A config made for a host (`configs/qwen3_4b.py:v6e-8`, `on_host`) records its name
in `run.host` and gets the host's split and meshes:

  run.num_samplers = 1, run.device_split = (learner devices, sampler devices)
  mesh             = fsdp over the learner's devices (params, Adam moments, batch)
  sampler.mesh     = tensor over all the devices a sampler process opens (KV heads
                     and weights split; one device: an unsharded engine); tensor=-1,
                     so `sao-eval`, which opens the whole host, spreads it over that

`sao-plan` compiles exactly that: the learner's program for the chips the learner
process opens and the sampler's for the sampler process's (`process_topology`).
A split TPU VM gives each process the contiguous chips [start, start + n) with
bounds 1,n,1 (`sao_jax.sharding.device_split`), so its topology is GEN:1xn (v5p:
1xnx1); a whole host keeps its own shape.

GPU hosts have no compile-only target on a CPU machine: their figures are the TPU
compiler's memory analysis of the same program on the same mesh (`proxy`), rated
with the GPU's HBM, peak FLOP/s and bandwidth (`sao_jax.planning.hardware.GPUS`).
They are estimates until measured on a GPU. On one GPU the learner and the sampler
share the device (no split): both programs must fit in its memory together, and
both processes must start with XLA_PYTHON_CLIENT_PREALLOCATE=false.
"""

from __future__ import annotations

import dataclasses

from sao_jax.config.mesh import MeshConfig


@dataclasses.dataclass(frozen=True)
class Host:
  """One machine: its accelerator, device count and (learner, sampler) split."""

  name: str
  platform: str  # "tpu" or "gpu"
  chip: str  # a TPU generation (v5p, v6e) or a GPU (h100): sao_jax.planning.hardware
  devices: int
  split: tuple[int, ...]  # run.device_split; () shares every device (one GPU)
  topology: str = ""  # TPU: the whole host's topology
  proxy: str = ""  # GPU: the TPU topology whose compiler gives the estimate (per process)

  @property
  def learner_devices(self) -> int:
    return self.split[0] if self.split else self.devices

  @property
  def sampler_devices(self) -> int:
    return self.split[1] if self.split else self.devices


HOSTS = {
    "v6e-8": Host("v6e-8", "tpu", "v6e", 8, (4, 4), topology="v6e:2x4"),
    "v5p-8": Host("v5p-8", "tpu", "v5p", 4, (2, 2), topology="v5p:2x2x1"),
    # A GPU box's process of 4 GPUs is compiled as 4 v5p chips (95 GiB each, so
    # the compiler never runs out of memory before the H100's 80 GB limit is checked).
    "h100-8": Host("h100-8", "gpu", "h100", 8, (4, 4), proxy="v5p:2x2x1"),
    "h100-1": Host("h100-1", "gpu", "h100", 1, (), proxy="v5p:1x1x1"),
}


def host(name: str) -> Host:
  """The `Host` named `name`; ValueError listing the known ones."""
  if name not in HOSTS:
    raise ValueError(f"host {name!r} is unknown: ready layouts are {', '.join(HOSTS)} "
                     "(sao_jax/config/hosts.py)")
  return HOSTS[name]


def process_topology(spec: Host, devices: int) -> str:
  """The topology one process of `spec` opens with `devices` of its chips: the
  whole host's, or a split share's GEN:1xn (1xnx1 on 3-D generations), as its
  TPU_CHIPS_PER_PROCESS_BOUNDS=1,n,1 lays them out; GPU hosts: their proxy."""
  if spec.platform == "gpu":
    return spec.proxy
  if devices == spec.devices:
    return spec.topology
  dims = spec.topology.partition(":")[2].count("x") + 1
  return f"{spec.chip}:1x{devices}" + ("x1" if dims == 3 else "")


def on_host(cfg, name: str):
  """`cfg` laid out on host `name` (module docstring); the caller still sets what
  depends on the model (batch, micro-batches, slots, KV pages)."""
  spec = host(name)
  run = dataclasses.replace(cfg.run, host=name, num_samplers=1, device_split=spec.split)
  sharded = spec.sampler_devices > 1
  sampler = dataclasses.replace(cfg.sampler, sharded=sharded, mesh=MeshConfig(
      data=1, fsdp=1, tensor=-1) if sharded else None)
  return dataclasses.replace(cfg, run=run, sampler=sampler,
                             mesh=MeshConfig(data=1, fsdp=-1, tensor=1, expert=1))
