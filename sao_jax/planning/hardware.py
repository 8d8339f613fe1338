"""TPU generations and named topologies, for planning without the hardware.

  chip_spec("v5p")                  -> Chip(hbm_bytes, peak_bf16_flops, hbm_bytes_per_s)
  parse_topology("v5p:2x2x4")       -> ("v5p", (2, 2, 4))
  topology_devices("v5p:2x2x4")     -> compile-only TPU devices (needs libtpu, no TPU)

A topology of at most `Chip.host_chips` chips (a TPU VM's: 8 on v5e/v6e, 4 on
v4/v5p) is one process's chips on one host (a whole VM, or the share
`run.device_split` gives one process, e.g. "v6e:1x4"): it compiles with chip
bounds equal to its own shape, as that process runs (TPU_CHIPS_PER_PROCESS_BOUNDS);
larger ones are pod slices of libtpu's default hosts.

Per-chip figures are Google Cloud's published specs (cloud.google.com/tpu/docs/
v4, v5e, v5p, v6e): HBM capacity, peak dense bf16 FLOP/s and HBM bandwidth.
`libtpu` may expose one JAX device per TensorCore instead of per chip (v4
without megacore); `per_device` divides the chip's figures accordingly.
"""

from __future__ import annotations

import dataclasses
import os
import re

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip: HBM capacity (bytes), peak bf16 FLOP/s, HBM bandwidth (bytes/s),
  and the chips of one host (TPU VM) of its generation."""

  name: str
  hbm_bytes: float
  peak_bf16_flops: float
  hbm_bytes_per_s: float
  host_chips: int = 4

  def per_device(self, chips: int, devices: int) -> "Chip":
    """The share of one JAX device when `devices` devices span `chips` chips."""
    share = chips / devices
    return dataclasses.replace(self, hbm_bytes=self.hbm_bytes * share,
                               peak_bf16_flops=self.peak_bf16_flops * share,
                               hbm_bytes_per_s=self.hbm_bytes_per_s * share)


CHIPS = {
    "v4": Chip("v4", 32 * GiB, 275e12, 1200e9),
    "v5e": Chip("v5e", 16 * GiB, 197e12, 819e9, host_chips=8),
    "v5p": Chip("v5p", 95 * GiB, 459e12, 2765e9),
    "v6e": Chip("v6e", 32 * GiB, 918e12, 1640e9, host_chips=8),
}
# GPUs, for estimates only (`sao_jax.config.hosts`: a GPU host's programs are compiled
# for a TPU proxy and rated with these): NVIDIA's H100 SXM datasheet, dense bf16 (not
# the 2:4-sparse figure), HBM as nvidia-smi reports it (81,559 MiB).
GPUS = {
    "h100": Chip("h100", 81559 * 2**20, 989e12, 3.35e12, host_chips=8),
}
_TOPOLOGY = re.compile(r"^(v[0-9][a-z]*):([0-9]+(?:x[0-9]+){1,2})$")


def chip_spec(generation: str) -> Chip:
  """The `Chip` of a TPU generation name such as 'v5p'."""
  if generation not in CHIPS:
    raise ValueError(f"TPU generation {generation!r} is unknown: known generations are "
                     f"{', '.join(CHIPS)}")
  return CHIPS[generation]


def parse_topology(name: str) -> tuple[str, tuple[int, ...]]:
  """'v5p:2x2x4' -> ('v5p', (2, 2, 4)); ValueError naming the expected form."""
  match = _TOPOLOGY.match(name)
  if not match:
    raise ValueError(f"topology {name!r} is invalid: expected GENERATION:AxB or GENERATION:AxBxC, "
                     "e.g. 'v5e:2x2' or 'v5p:4x4x4'")
  generation, dims = match.group(1), tuple(int(d) for d in match.group(2).split("x"))
  chip_spec(generation)
  if any(d <= 0 for d in dims):
    raise ValueError(f"topology {name!r} is invalid: every dimension must be positive")
  return generation, dims


def num_chips(name: str) -> int:
  """Chips in a named topology (the product of its dimensions)."""
  count = 1
  for d in parse_topology(name)[1]:
    count *= d
  return count


def topology_devices(name: str) -> list:
  """Compile-only devices of a TPU topology; ImportError if libtpu is not installed."""
  parse_topology(name)
  try:
    import libtpu  # noqa: F401  (only its presence matters: jax loads it for the topology)
  except ImportError as error:
    raise ImportError("planning for a TPU topology needs libtpu at the jax version: "
                      "pip install 'jax[tpu]==<your jax version>'") from error
  from jax.experimental import topologies
  # Compile-only devices touch no chip, so planning must not take libtpu's
  # one-process lock: it would fail next to another plan or a training run.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  generation, dims = parse_topology(name)
  bounds = {}
  if num_chips(name) <= chip_spec(generation).host_chips:  # one process's chips (docstring)
    bounds = {"chips_per_host_bounds": list(dims) + [1] * (3 - len(dims))}
  return list(topologies.get_topology_desc(platform="tpu", topology_name=name, **bounds).devices)
