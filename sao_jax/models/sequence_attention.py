"""Causal attention over sequences split across the mesh's sequence axis.

  attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask, block) -> out_BxTxNxH

All arrays are global `[B, T, ...]` arrays in the balanced order of
`sao_jax.sharding.sequence` (device d holds natural chunks d and 2S - 1 - d of
C = T / 2S positions each), `mask` a `CausalMask` of that order. Under a
`shard_map` manual over the sequence axes only (batch, heads and the other axes
stay with the compiler), each device:

  1. all-gathers the keys, values, segment ids and positions of the whole
     sequence (`jax.lax.all_gather`, tiled) and puts them back in natural order;
  2. runs `attention.chunk_attention` for each of its two query chunks, at
     sequence index chunk * C, over all T keys: the flash loops skip key blocks
     after the chunk, so device d reads (d + 1) C + (2S - d) C keys in all, the
     same on every device.

The backward pass is jax's transpose of the same program: the gathered keys'
and values' gradients are reduce-scattered back to their devices.

All-gather, not a ring: it is the simplest correct form and needs no hand-written
schedule; with grouped-query attention the gathered K and V are
2 * T * K * H elements per layer, small beside the [T / S, D] activations of the
query heads. A ring would hold two chunks of keys at a time and overlap passing
them with compute; whether that pays is what a TPU profile of the all-gather
against the attention compute at 64K-128K tokens has to show.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from sao_jax.models import attention
from sao_jax.sharding import sequence


def attend(q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array, v_BxTxKxH: jax.Array,
           mask: attention.CausalMask, block: int) -> jax.Array:
  """Causal attention within segments (and the mask's window) of balanced-order
  arrays split over the active mesh's sequence axes (module docstring)."""
  axes = sequence.axes()
  shards = sequence.shards()
  if not axes:
    raise ValueError("sequence_attention.attend needs an active mesh with a sequence axis "
                     "> 1 (trace under jax.sharding.use_abstract_mesh)")
  window = mask.window
  pos_BxT = mask.positions_BxS if window is not None else jnp.zeros_like(mask.segment_ids_BxS)
  length = q_BxTxNxH.shape[1]
  sequence.check_length(length, shards)
  chunk = length // (2 * shards)

  def local(q_BxLxNxH, k_BxLxKxH, v_BxLxKxH, seg_BxL, pos_BxL, index_1):
    gather = lambda x: sequence.from_balanced(
        jax.lax.all_gather(x, axes, axis=1, tiled=True), shards)
    k_BxTxKxH, v_BxTxKxH, seg_BxT, pos_all_BxT = map(
        gather, (k_BxLxKxH, v_BxLxKxH, seg_BxL, pos_BxL))
    outs = []
    for half, index in enumerate(sequence.device_chunks(shards, index_1)):
      part = slice(half * chunk, (half + 1) * chunk)
      outs.append(attention.chunk_attention(
          q_BxLxNxH[:, part], k_BxTxKxH, v_BxTxKxH, seg_BxL[:, part], seg_BxT, index * chunk,
          block, pos_BxL[:, part], pos_all_BxT, window))
    return jnp.concatenate(outs, axis=1)

  split = PartitionSpec(None, axes)
  split4 = PartitionSpec(None, axes, None, None)
  return jax.shard_map(local, mesh=jax.sharding.get_abstract_mesh(),
                       in_specs=(split4, split4, split4, split, split, PartitionSpec(axes)),
                       out_specs=split4,
                       axis_names=set(axes))(
      q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask.segment_ids_BxS.astype(jnp.int32),
      pos_BxT.astype(jnp.int32), sequence.shard_indices(shards))
