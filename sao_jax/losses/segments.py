"""Per-trajectory reductions on packed `[B, T]` rows (segment ids: `sao_jax.types`).

A segment (one trajectory) is every token of a row carrying its id; 0 is
padding. Per-segment quantities live in a *segment-indexed* `[B, T]` array:
entry `[b, s]` belongs to the segment whose first token sits at position s of row
b, and is meaningless where no segment starts (`segment_starts` is False). The
reductions are row-local (`jax.ops.segment_*` vmapped over rows, keyed by the
start position), so a batch sharded over its rows stays sharded, and a segment's
sum adds only its own tokens (no prefix-sum differences, no cancellation).

  resolve(segment_ids, shape)  -> seg_BxT int32 (None: each whole row is one segment)
  reduce(x_BxT, seg_BxT, op)   -> segment-indexed [B, T]   (op: jax.ops.segment_sum/min/max)
  spread(per_seg_BxT, seg_BxT) -> per token [B, T]: the value of the token's segment, 0 on padding
  totals(x_BxT, seg_BxT)       -> spread(reduce(x, sum)): a segment's sum at each of its tokens
  span(mask_BxT, seg_BxT)      -> tokens from the first to the last masked token of their segment
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from sao_jax.types import segment_starts


def resolve(segment_ids: jax.Array | None, shape: tuple[int, ...]) -> jax.Array:
  """`segment_ids` as int32; None means one segment per row covering the whole row
  (padding included), the convention of callers that pass unpacked rows."""
  if segment_ids is None:
    return jnp.ones(shape, jnp.int32)
  if segment_ids.shape != shape:
    raise ValueError(f"segment_ids has shape {segment_ids.shape}; expected [B, T]={shape}.")
  return jnp.asarray(segment_ids).astype(jnp.int32)


def per_token(ids: jax.Array, shape: tuple[int, int], name: str) -> jax.Array:
  """Per-trajectory ids as `[B, T]`: given per token, or `[B]` for one trajectory per row."""
  ids = jnp.asarray(ids)
  if ids.shape == shape:
    return ids
  if ids.shape == shape[:1]:
    return jnp.broadcast_to(ids[:, None], shape)
  raise ValueError(f"{name} has shape {ids.shape}; expected [B]={shape[:1]} (one trajectory "
                   f"per row) or per token [B, T]={shape}.")


def _start_index(seg_BxT: jax.Array) -> jax.Array:
  """[B, T] int32: position of the first token of the token's segment; T on padding
  (out of range: dropped by the segment reductions)."""
  length = seg_BxT.shape[1]
  t_1xT = jnp.arange(length, dtype=jnp.int32)[None, :]
  # Starts increase along the row, so the latest one at or before t is t's own.
  index_BxT = jax.lax.cummax(jnp.where(segment_starts(seg_BxT), t_1xT, 0), axis=1)
  return jnp.where(seg_BxT != 0, index_BxT, length)


def reduce(x_BxT: jax.Array, seg_BxT: jax.Array,
           op: Callable = jax.ops.segment_sum) -> jax.Array:
  """Segment-indexed `op` of `x` over each segment's tokens (padding excluded)."""
  length = seg_BxT.shape[1]
  return jax.vmap(lambda x_T, i_T: op(x_T, i_T, num_segments=length))(
      x_BxT, _start_index(seg_BxT))


def spread(per_segment_BxT: jax.Array, seg_BxT: jax.Array) -> jax.Array:
  """Each token gets the entry of its segment; padding gets 0."""
  index_BxT = _start_index(seg_BxT)
  got_BxT = jnp.take_along_axis(per_segment_BxT, jnp.minimum(index_BxT, seg_BxT.shape[1] - 1),
                                axis=1)
  return jnp.where(seg_BxT != 0, got_BxT, jnp.zeros_like(got_BxT))


def totals(x_BxT: jax.Array, seg_BxT: jax.Array) -> jax.Array:
  """The sum of `x` over the token's segment, at every token of it (0 on padding)."""
  return spread(reduce(x_BxT, seg_BxT), seg_BxT)


def span(mask_BxT: jax.Array, seg_BxT: jax.Array) -> jax.Array:
  """[B, T] bool: tokens from the first to the last set token of `mask` in their
  segment (empty for a segment without one)."""
  length = seg_BxT.shape[1]
  mask_BxT = mask_BxT.astype(bool)
  t_BxT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], seg_BxT.shape)
  first_BxT = spread(reduce(jnp.where(mask_BxT, t_BxT, length), seg_BxT, jax.ops.segment_min),
                     seg_BxT)
  last_BxT = spread(reduce(jnp.where(mask_BxT, t_BxT, -1), seg_BxT, jax.ops.segment_max),
                    seg_BxT)
  return (seg_BxT != 0) & (t_BxT >= first_BxT) & (t_BxT <= last_BxT)
