"""Splitting each sequence's positions over the mesh's sequence axis (context parallel).

The mesh axes that split a sequence are those of the logical axis
"activation_length" in `sao_jax.sharding.rules.RULES` (the `sequence` axis). With
S devices over them, a `[B, T]` batch array is laid out in *natural* order, device d
holding positions [d T/S, (d + 1) T/S): elementwise work, sums and the GAE's
chunked scan (`sao_jax.losses.gae`) read it that way.

Causal attention gives the last positions the most keys, so the model runs in the
*balanced* order instead (as MaxText and Megatron do): cut the sequence into 2S
chunks of C = T / 2S positions and give device d chunks d and 2S - 1 - d. Each
device then attends (d + 1) C + (2S - d) C = (2S + 1) C query-key chunk pairs'
worth of keys, the same on every device. Only `[B, T]` integer inputs (tokens,
segment ids, positions) are reordered into the balanced order and `[B, T]`
outputs (log-probs, values, router logits) back; the `[B, T, D]` activations
never move.

  shards(mesh=None)               -> S (1: nothing splits sequences)
  axes(mesh=None)                 -> the mesh axes that split them
  check_length(length, shards)    -> ValueError unless 2S divides length
  to_balanced(x_BxT..., shards)   -> the balanced order of a natural-order array
  from_balanced(x_BxT..., shards) -> its inverse
  device_chunks(shards, index)    -> (chunk d, chunk 2S - 1 - d) of this device, inside
                                     a shard_map over `axes()`
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sao_jax.config.mesh import split_length_multiple
from sao_jax.sharding.rules import RULES

_LOGICAL = "activation_length"


def axes(mesh: jax.sharding.AbstractMesh | None = None) -> tuple[str, ...]:
  """Mesh axes of size > 1 that split sequences (default: the active abstract mesh)."""
  mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
  if mesh.empty:
    return ()
  sizes = dict(mesh.shape)
  return tuple(axis for axis in RULES[_LOGICAL] if sizes.get(axis, 1) > 1)


def shards(mesh: jax.sharding.AbstractMesh | None = None) -> int:
  """How many devices split each sequence (1 without such an axis)."""
  mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
  return math.prod(dict(mesh.shape)[axis] for axis in axes(mesh)) if not mesh.empty else 1


def check_length(length: int, num_shards: int) -> None:
  """ValueError unless `length` cuts into 2 x `num_shards` equal chunks."""
  multiple = split_length_multiple(num_shards)
  if length % multiple:
    raise ValueError(
        f"sequence length {length} does not split over mesh.sequence={num_shards}: each "
        f"device holds two of {multiple} equal chunks (causal load balance), so the "
        f"length must be a multiple of {multiple}; pad the learner's sequences to a "
        "multiple of it (data.length_buckets, learner.row_length) or change mesh.sequence")


def to_balanced(x: jax.Array, num_shards: int) -> jax.Array:
  """Reorders axis 1 of a natural-order `[B, T, ...]` array into chunks
  (0, 2S-1, 1, 2S-2, ..., S-1, S) of T / 2S positions each: device d's contiguous
  T / S positions are then chunks d and 2S - 1 - d."""
  if num_shards == 1:
    return x
  b, t, rest = x.shape[0], x.shape[1], x.shape[2:]
  check_length(t, num_shards)
  halves = x.reshape(b, 2, num_shards, t // (2 * num_shards), *rest)
  paired = jnp.stack([halves[:, 0], jnp.flip(halves[:, 1], axis=1)], axis=2)
  return paired.reshape(b, t, *rest)


def from_balanced(x: jax.Array, num_shards: int) -> jax.Array:
  """The inverse of `to_balanced`."""
  if num_shards == 1:
    return x
  b, t, rest = x.shape[0], x.shape[1], x.shape[2:]
  check_length(t, num_shards)
  paired = x.reshape(b, num_shards, 2, t // (2 * num_shards), *rest)
  halves = jnp.stack([paired[:, :, 0], jnp.flip(paired[:, :, 1], axis=1)], axis=1)
  return halves.reshape(b, t, *rest)


def shard_indices(num_shards: int) -> jax.Array:
  """`[S]` int32 0..S-1, for a shard_map over `axes()` to split (`PartitionSpec(axes())`):
  each device reads its own index from its `[1]` slice. Not `lax.axis_index`: in a
  shard_map manual over the sequence axes only, XLA's SPMD partitioner refuses the
  PartitionId it lowers to ("the meaning is ambiguous") in some programs (a 4-layer
  model with full remat did, benchmarks/sequence_split.py)."""
  return jnp.arange(num_shards, dtype=jnp.int32)


def device_chunks(num_shards: int, index_1: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Inside a shard_map over `axes()`, given this device's `[1]` slice of
  `shard_indices`: the natural chunk indices it holds in the balanced order, first
  and second half of its positions."""
  d = index_1[0]
  return d, 2 * num_shards - 1 - d
