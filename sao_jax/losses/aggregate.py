"""Reducing per-token losses to a scalar (`loss_agg`, docs/algorithm.md §2).

Every loss is `numerator / denominator` over the batch:

- `token_mean`: sum over action tokens / number of action tokens in the batch
  (tokens masked out by DIS still count in the denominator). The default.
- `token_mean_kept`: sum over kept tokens / number of kept tokens.
- `seq_mean_token_mean`: per trajectory, mean over its action tokens; then the
  mean over trajectories that have at least one action token. A trajectory is
  a row, or with `segment_ids` (packed rows, `sao_jax.segments`) a segment.

Micro-batching: a batch's loss is not the mean of its micro-batches' losses
when they hold different numbers of tokens, so callers that split a batch
compute the full batch's `loss_denominator` once and pass it as `denominator=`;
the micro-batch losses then add up exactly to the full-batch loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sao_jax import segments
from sao_jax.config.algorithm import LOSS_AGGS


def _check(loss_agg: str) -> None:
  if loss_agg not in LOSS_AGGS:
    raise ValueError(f"loss_agg={loss_agg!r} is invalid: allowed values are "
                     f"{', '.join(map(repr, LOSS_AGGS))}.")


def loss_denominator(action_mask_BxT: jax.Array, loss_agg: str,
                     keep_BxT: jax.Array | None = None,
                     segment_ids: jax.Array | None = None) -> jax.Array:
  """The normaliser of `loss_agg` for a (full) batch, as float32 scalar."""
  _check(loss_agg)
  mask = action_mask_BxT.astype(jnp.float32)
  if loss_agg == "token_mean":
    return jnp.sum(mask)
  if loss_agg == "token_mean_kept":
    return jnp.sum(mask if keep_BxT is None else keep_BxT.astype(jnp.float32))
  count = segments.reduce(mask, segments.resolve(segment_ids, mask.shape))
  return jnp.sum((count > 0).astype(jnp.float32))


def aggregate(per_token_BxT: jax.Array, action_mask_BxT: jax.Array, loss_agg: str, *,
              keep_BxT: jax.Array | None = None,
              denominator: jax.Array | None = None,
              segment_ids: jax.Array | None = None) -> jax.Array:
  """`numerator / denominator` of `per_token_BxT` under `loss_agg` (0 if empty).

  `per_token_BxT` must already be 0 wherever it should not contribute.
  `segment_ids`: `[B, T]` of packed rows (`seq_mean_token_mean` averages per
  segment); None: one trajectory per row.
  """
  _check(loss_agg)
  if loss_agg == "seq_mean_token_mean":
    seg_BxT = segments.resolve(segment_ids, action_mask_BxT.shape)
    count = segments.reduce(action_mask_BxT.astype(jnp.float32), seg_BxT)
    numerator = jnp.sum(segments.reduce(per_token_BxT, seg_BxT) / jnp.maximum(count, 1.0))
  else:
    numerator = jnp.sum(per_token_BxT)
  if denominator is None:
    denominator = loss_denominator(action_mask_BxT, loss_agg, keep_BxT, segment_ids)
  return jnp.where(denominator > 0, numerator / jnp.maximum(denominator, 1e-8), 0.0)


def masked_mean(x_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
  """Mean of `x` over the positions where `mask` is set (0 if none)."""
  mask = mask_BxT.astype(jnp.float32)
  return jnp.sum(jnp.where(mask > 0, x_BxT, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)


def masked_max(x_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
  """Max of `x` over the masked positions (0 if none)."""
  mask = mask_BxT.astype(bool)
  return jnp.where(jnp.any(mask), jnp.max(jnp.where(mask, x_BxT, -jnp.inf)), 0.0)
