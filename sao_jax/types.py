"""The arrays that cross module boundaries.

`Batch` is what the learner's step consumes: `[B, T]` token-aligned arrays (index
t of every array belongs to token t, SAO.md §1) plus per-trajectory ids.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np


class Batch(NamedTuple):
  """A padded batch of B trajectories of length T (host numpy or device arrays).

  tokens:         [B, T] int32 token ids.
  attention_mask: [B, T] 1 on real tokens, 0 on padding.
  action_mask:    [B, T] 1 where the policy sampled the token (subset of attention_mask).
  behavior_logp:  [B, T] float32 sampler log-prob of each action token (0 elsewhere).
  rewards:        [B, T] float32; the outcome on the last action token.
  prompt_ids:     [B] int32; trajectories of one prompt share an id (GRPO group,
                  running-mean window slot).
  """

  tokens: jax.Array | np.ndarray
  attention_mask: jax.Array | np.ndarray
  action_mask: jax.Array | np.ndarray
  behavior_logp: jax.Array | np.ndarray
  rewards: jax.Array | np.ndarray
  prompt_ids: jax.Array | np.ndarray

  @property
  def shape(self) -> tuple[int, int]:
    return tuple(self.tokens.shape)  # type: ignore[return-value]
