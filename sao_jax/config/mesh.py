"""Device mesh shape."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import fail

MESH_AXES = ("data", "fsdp", "sequence", "tensor", "expert")


def split_length_multiple(shards: int) -> int:
  """What a sequence length split over `shards` devices must be a multiple of: each
  device holds two of 2 x shards equal chunks (causal load balance,
  `sao_jax.sharding.sequence`); 1 when nothing splits."""
  return 2 * shards if shards > 1 else 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
  """Device mesh shape. Exactly one axis may be -1: it takes the remaining devices.

  Axis order is (data, fsdp, sequence, tensor, expert); `sao_jax.sharding` maps
  logical axis names onto these.
  """

  data: int = 1  # data-parallel replicas (batch split, params replicated)
  fsdp: int = -1  # fully-sharded data parallel: batch and params split (-1: the remaining devices)
  # Sequence (context) parallel, learner only: each sequence's tokens split over this
  # many devices, chunk i and 2 * sequence - 1 - i on device i for causal load balance,
  # keys/values all-gathered for attention (docs/explanation/long-episodes.md). The
  # learner's sequence length must be a multiple of 2 * sequence; weights split over it
  # too (ZeRO-3, like fsdp). A sampler's mesh must keep it 1.
  sequence: int = 1
  tensor: int = 1  # tensor parallel: attention heads, MLP width and vocab split
  expert: int = 1  # expert parallel: MoE experts split (needs model.num_experts)

  @classmethod
  def parse(cls, text: str) -> "MeshConfig":
    """'data=1,fsdp=-1,tensor=4' -> MeshConfig (unnamed axes keep their defaults); the
    text form of `--set mesh=...`, `--set sampler.mesh=...` and sao-plan's --sampler-mesh."""
    sizes = {}
    for item in text.split(","):
      axis, sep, size = item.strip().partition("=")
      if not sep or axis not in MESH_AXES or not size.lstrip("-").isdigit():
        raise ValueError(f"mesh {text!r}: {item!r} is not AXIS=SIZE with AXIS in "
                         f"{', '.join(MESH_AXES)}, e.g. fsdp=1,tensor=4")
      if axis in sizes:
        raise ValueError(f"mesh {text!r} names axis {axis!r} twice; name each axis once")
      sizes[axis] = int(size)
    return cls(**sizes)

  def text(self) -> str:
    """The `parse` form: 'data=1,fsdp=-1,sequence=1,tensor=1,expert=1'."""
    return ",".join(f"{axis}={getattr(self, axis)}" for axis in MESH_AXES)

  def shape(self, num_devices: int) -> dict[str, int]:
    """Axis sizes with the -1 axis filled in for `num_devices` devices."""
    self.validate()
    sizes = {axis: getattr(self, axis) for axis in MESH_AXES}
    known = 1
    for size in sizes.values():
      if size != -1:
        known *= size
    free = [axis for axis, size in sizes.items() if size == -1]
    if free:
      if num_devices % known:
        raise ValueError(
            f"mesh: {num_devices} devices cannot be split with fixed axes "
            f"{ {a: s for a, s in sizes.items() if s != -1} } (product {known}); "
            f"choose axis sizes whose product divides {num_devices}.")
      sizes[free[0]] = num_devices // known
    elif known != num_devices:
      raise ValueError(
          f"mesh: axis sizes {sizes} use {known} devices but {num_devices} are "
          "available; set one axis to -1 or make the product match.")
    return sizes

  def validate(self) -> None:
    free = [axis for axis in MESH_AXES if getattr(self, axis) == -1]
    if len(free) > 1:
      fail("mesh", free[1], -1, f"only one axis may be -1 (already {free[0]})")
    for axis in MESH_AXES:
      value = getattr(self, axis)
      if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        fail("mesh", axis, value, "expected a positive integer or -1")
