"""TPU generations and named topologies, for planning without the hardware.

  chip_spec("v5p")                  -> Chip(hbm_bytes, peak_bf16_flops, hbm_bytes_per_s)
  parse_topology("v5p:2x2x4")       -> ("v5p", (2, 2, 4))
  topology_devices("v5p:2x2x4")     -> compile-only TPU devices (needs libtpu, no TPU)

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
  """One TPU chip: HBM capacity (bytes), peak bf16 FLOP/s, HBM bandwidth (bytes/s)."""

  name: str
  hbm_bytes: float
  peak_bf16_flops: float
  hbm_bytes_per_s: float

  def per_device(self, chips: int, devices: int) -> "Chip":
    """The share of one JAX device when `devices` devices span `chips` chips."""
    share = chips / devices
    return Chip(self.name, self.hbm_bytes * share, self.peak_bf16_flops * share,
                self.hbm_bytes_per_s * share)


CHIPS = {
    "v4": Chip("v4", 32 * GiB, 275e12, 1200e9),
    "v5e": Chip("v5e", 16 * GiB, 197e12, 819e9),
    "v5p": Chip("v5p", 95 * GiB, 459e12, 2765e9),
    "v6e": Chip("v6e", 32 * GiB, 918e12, 1640e9),
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
  return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
