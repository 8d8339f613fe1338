"""The arrays that cross module boundaries.

`Trajectory` is one finished rollout on the host: what the sampler records, the
channel carries (`sao_jax.channel.records` encodes it) and the pipeline pads.
`Batch` is what the learner's step consumes: `[B, T]` token-aligned arrays (index
t of every array belongs to token t, docs/algorithm.md §1). Its `segment_ids` say which
trajectory each token belongs to when rows are packed (`sao_jax.segments`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

# A GRPO group's prompt id is `worker_id << COUNTER_BITS | k` (`sao_jax.sampler.prompt_ids`
# says why): sampler worker ids lie in [0, MAX_WORKERS), so that ids stay in [0, 2**31),
# the batch's int32. Here, below every reader of a trajectory's worker id.
COUNTER_BITS = 21
MAX_WORKERS = 2 ** (31 - COUNTER_BITS)


class Batch(NamedTuple):
  """A batch of B rows of length T (host numpy or device arrays), each row holding
  one trajectory or several packed ones (`sao_jax.segments`).

  tokens:           [B, T] int32 token ids.
  segment_ids:      [B, T] int32: 0 on padding, k on the tokens of the row's k-th trajectory.
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
  routed_experts:   MoE only: [B, T, L, k] int8/int16, the experts each of the L MoE
                    layers routed the token to in the sampler
                    (`Trajectory.routed_experts`), -1 where none was recorded
                    (padding included); None when no trajectory of the batch
                    carries a record (dense models).
  """

  tokens: jax.Array | np.ndarray
  segment_ids: jax.Array | np.ndarray
  action_mask: jax.Array | np.ndarray
  behavior_logp: jax.Array | np.ndarray
  rewards: jax.Array | np.ndarray
  prompt_ids: jax.Array | np.ndarray
  behavior_version: jax.Array | np.ndarray
  routed_experts: jax.Array | np.ndarray | None = None

  @property
  def shape(self) -> tuple[int, int]:
    return tuple(self.tokens.shape)  # type: ignore[return-value]


@dataclasses.dataclass
class Trajectory:
  tokens: np.ndarray  # [T] int32
  action_mask: np.ndarray  # [T] int8, 1 on sampled tokens
  behavior_logp: np.ndarray  # [T] float32, 0 off the action mask
  rewards: np.ndarray  # [T] float32, the outcome on the last action token
  prompt_id: int  # GRPO group / running-mean slot
  policy_versions: tuple[int, int]  # first and last learner version that sampled it
  env_failure: str | None = None  # the environment failed: train on none of it
  info: dict = dataclasses.field(default_factory=dict)  # JSON-able extras (task id, turns)
  # MoE: [T, L, k] experts per MoE layer the sampler routed each token to, -1 where it
  # recorded none (`sao_jax.sampler.engine`, Routing); None for a dense model.
  routed_experts: np.ndarray | None = None

  @property
  def length(self) -> int:
    return int(self.tokens.shape[0])

  @property
  def outcome(self) -> float:
    return float(np.sum(self.rewards[self.action_mask.astype(bool)]))
