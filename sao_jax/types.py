"""The arrays that cross module boundaries, and what a segment id means.

`Batch` is what the learner's step consumes: `[B, T]` token-aligned arrays (index
t of every array belongs to token t, SAO.md §1).

Sequence packing: a row may hold several trajectories. `attention_mask` holds
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
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Batch(NamedTuple):
  """A batch of B rows of length T (host numpy or device arrays), each row holding
  one trajectory or several packed ones (module docstring).

  tokens:           [B, T] int32 token ids.
  attention_mask:   [B, T] int32 segment ids: 0 on padding, k on the row's k-th trajectory.
  action_mask:      [B, T] 1 where the policy sampled the token (inside a segment).
  behavior_logp:    [B, T] float32 sampler log-prob of each action token (0 elsewhere).
  rewards:          [B, T] float32; the outcome on the last action token.
  prompt_ids:       [B, T] int32, per token: the prompt id of the token's trajectory
                    (GRPO group, running-mean window slot); -1 on padding, which
                    belongs to no segment and so never joins a group.
  behavior_version: [B, T] int32, per token: the policy version that sampled the
                    whole trajectory when a single one did (policy_versions[0] ==
                    policy_versions[1]), else -1; -1 on padding. The step compares
                    it with its own version to find lag-0 tokens.
  """

  tokens: jax.Array | np.ndarray
  attention_mask: jax.Array | np.ndarray
  action_mask: jax.Array | np.ndarray
  behavior_logp: jax.Array | np.ndarray
  rewards: jax.Array | np.ndarray
  prompt_ids: jax.Array | np.ndarray
  behavior_version: jax.Array | np.ndarray

  @property
  def shape(self) -> tuple[int, int]:
    return tuple(self.tokens.shape)  # type: ignore[return-value]


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
