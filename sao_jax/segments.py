"""Segments: which trajectory each token of a packed `[B, T]` row belongs to.

Sequence packing: a row may hold several trajectories. `Batch.segment_ids` holds
*segment ids*: 0 on padding, k >= 1 on the tokens of the row's k-th trajectory
(its segment). An unpacked row (one trajectory, 1 on its tokens) is the
one-segment case, so a plain 0/1 mask is a valid segment-id array. A segment is
every token of the row carrying its id; the nonzero ids of a row must be
non-decreasing from left to right (the pipeline writes 1, 2, ...; padding may sit
anywhere, so left padding and holes behave as before). Across the tree a segment
is one trajectory:
  attention   query t reads key s iff s <= t and seg[s] == seg[t] != 0
  positions   index of a token among the tokens of its segment (RoPE restarts)
  scoring     token t is scored iff seg[t] == seg[t - 1] != 0
  GAE, lambda, GRPO, running mean, `seq_mean_token_mean`: per segment.

Segment boundaries and per-trajectory reductions on packed rows: a segment-indexed
`[B, T]` array holds at entry `[b, s]` the value of the segment whose first token
sits at position s of row b, and is meaningless where no segment starts. The
reductions are row-local (`jax.ops.segment_*` vmapped over rows, keyed by the
start position), so a batch sharded over its rows stays sharded, and a segment's
sum adds only its own tokens (no prefix-sum differences, no cancellation).

  segment_starts(seg_BxT)      -> [B, T] bool: first token of each segment
  segment_ends(seg_BxT)        -> [B, T] bool: last token of each segment
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


def segment_starts(segment_ids_BxT: jax.Array) -> jax.Array:
  """[B, T] bool: the first token of each segment, i.e. seg[t] > max(seg[:t]).

  Ids are non-decreasing, so an id larger than every earlier one is new; a run
  that resumes after padding with the same id is not a new segment.
  """
  seg_BxT = jnp.asarray(segment_ids_BxT).astype(jnp.int32)
  earlier_BxT = jnp.pad(jax.lax.cummax(seg_BxT, axis=1)[:, :-1], ((0, 0), (1, 0)))
  return seg_BxT > earlier_BxT


def segment_ends(segment_ids_BxT: jax.Array) -> jax.Array:
  """[B, T] bool: the last token of each segment, i.e. seg[t] != 0 and every later
  nonzero id is larger (the nearest later one is the smallest, ids being sorted)."""
  seg_BxT = jnp.asarray(segment_ids_BxT).astype(jnp.int32)
  big = jnp.iinfo(jnp.int32).max
  later_BxT = jax.lax.cummin(jnp.where(seg_BxT != 0, seg_BxT, big), axis=1, reverse=True)
  after_BxT = jnp.pad(later_BxT[:, 1:], ((0, 0), (0, 1)), constant_values=big)
  return (seg_BxT != 0) & (after_BxT > seg_BxT)


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
