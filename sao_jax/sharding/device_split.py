"""One host's devices split between the learner and its local sampler processes.

`run.device_split = (n_learner, n_sampler_0, n_sampler_1, ...)` hands the host's
devices out in order: the learner takes the first n_learner (its mesh is built
over them alone), sampler process i the next n_sampler_i. E.g. (6, 2) on 8 chips:
learner devices 0-5, the one sampler 6-7. The split must add up to the devices the
host has, which `split_devices` checks before anything is compiled.

A sampler process sees only its devices: it starts (spawn) with environment
variables that make its JAX runtime open them alone (`sampler_env`), set before
its backend starts:

  cpu  JAX_PLATFORMS=cpu, JAX_NUM_CPU_DEVICES=n (emulated devices: n of its own)
  gpu  CUDA_VISIBLE_DEVICES=<its GPUs> (mapped through the learner's own
       CUDA_VISIBLE_DEVICES when that is set)

The learner process opened the whole host before the split was known, so on GPU
it must not preallocate memory on the samplers' GPUs: the split is refused unless
XLA_PYTHON_CLIENT_PREALLOCATE=false. TPU is refused: one process opens all of a
VM's chips unless each is started with its chips and process bounds
(TPU_VISIBLE_CHIPS, TPU_PROCESS_BOUNDS, ...), which is not done here.

  split_devices(split, devices)            -> [learner devices, sampler 0's, ...]
  sampler_env(platform, indices, environ)  -> {variable: value} for one sampler
  local_plan(split, devices, environ)      -> (learner devices, [sampler envs])
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax


def split_devices(split: Sequence[int], devices: Sequence[jax.Device]) -> list[list[jax.Device]]:
  """`devices` cut in order into groups of `split`'s sizes; ValueError naming the
  split and the device count when they do not add up."""
  if sum(split) != len(devices):
    samplers = len(split) - 1
    example = (len(devices) - samplers,) + (1,) * samplers if len(devices) > samplers else None
    raise ValueError(
        f"run.device_split={tuple(split)} gives out {sum(split)} devices but this host has "
        f"{len(devices)}; make the learner's share and each of the {samplers} sampler "
        f"processes' shares add up to {len(devices)}"
        + (f", e.g. --set run.device_split={list(example)}" if example else "")
        + ", or set run.device_split=[] to give every process all of them")
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
  raise ValueError(
      f"run.device_split on {platform!r} devices is not supported: a {platform} process "
      "opens all of the host's chips unless started with its own chip bounds; set "
      "run.device_split=[] and run the samplers on other hosts (run.num_samplers=0, "
      "sao-sampler), or on CPU/GPU hosts")


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
