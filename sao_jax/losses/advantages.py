"""Critic-free advantage baselines (docs/algorithm.md §5): GRPO groups and running means.

Both take each trajectory's outcome `R = sum_t rewards_t` over its action tokens
(the outcome reward on the last action token plus any per-turn rewards) and
broadcast one advantage onto every action token of the trajectory; 0 elsewhere.
A trajectory is a row, or with `segment_ids` (packed rows, `sao_jax.segments`) a
segment; ids (`group_ids`, `prompt_ids`) are per row `[B]` or per token `[B, T]`
(read on the trajectory's tokens).

GRPO:          A = (R - mean_group(R)) / (std_group(R) + eps)
  `std_group` is the *unbiased* sample standard deviation (ddof = 1), as
  `torch.std` computes it in the GRPO implementations users compare against
  (TRL, verl). A group of one has no spread and gets A = 0.

Running mean:  A = R - mean(last W outcomes)
  The window holds outcomes *before* the current batch: every trajectory in a
  batch sees the window as it was when the batch arrived, then the batch's
  outcomes are pushed in batch order (row by row, left to right within a packed
  row). `scope="prompt"` keeps one window per prompt id (paper: W = 8),
  `scope="global"` one window for all (paper: W = 128). An empty window gives
  baseline 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sao_jax import segments


class _Trajectories(NamedTuple):
  """The batch's trajectories flattened to N = B * T segment-indexed slots, in batch order."""

  exists_N: jax.Array  # bool: a segment starts at this slot
  outcome_N: jax.Array  # float32 R
  has_action_N: jax.Array  # bool
  id_N: jax.Array  # int32 group / prompt id


def _trajectories(rewards, action_mask, ids, segment_ids, name) -> _Trajectories:
  shape = rewards.shape
  seg_BxT = segments.resolve(segment_ids, shape)
  action_BxT = action_mask.astype(bool)
  ids_BxT = segments.per_token(ids, shape, name).astype(jnp.int32)
  outcome = segments.reduce(jnp.where(action_BxT, rewards.astype(jnp.float32), 0.0), seg_BxT)
  count = segments.reduce(action_BxT.astype(jnp.int32), seg_BxT)
  # A trajectory's tokens share its id; the max reads it without assuming where it starts.
  id_ = segments.reduce(ids_BxT, seg_BxT, jax.ops.segment_max)
  flat = lambda x: x.reshape(-1)
  return _Trajectories(flat(segments.segment_starts(seg_BxT)), flat(outcome), flat(count > 0), flat(id_))


def _broadcast(advantage_N: jax.Array, action_mask: jax.Array,
               segment_ids: jax.Array | None) -> jax.Array:
  seg_BxT = segments.resolve(segment_ids, action_mask.shape)
  per_token = segments.spread(advantage_N.reshape(action_mask.shape), seg_BxT)
  return jnp.where(action_mask.astype(bool), per_token, 0.0)


def grpo_advantages(rewards: jax.Array, action_mask: jax.Array, group_ids: jax.Array, *,
                    eps: float = 1e-6, segment_ids: jax.Array | None = None) -> jax.Array:
  """Group-normalised outcome advantages.

  Args:
    rewards: `[B, T]` per-token rewards.
    action_mask: `[B, T]`.
    group_ids: int ids, `[B]` per row or `[B, T]` per token; trajectories sharing
      an id are one prompt's group (any int values).
    eps: added to the group std.
    segment_ids: `[B, T]` segment ids of packed rows; None: one trajectory per row.

  Returns:
    `[B, T]` advantages, `(R - mean) / (std + eps)` on action tokens.
  """
  traj = _trajectories(rewards, action_mask, group_ids, segment_ids, "group_ids")
  n = traj.outcome_N.shape[0]
  # Dense group ids in [0, N) for the segment sums; slots without a trajectory weigh 0.
  _, group_N = jnp.unique(traj.id_N, return_inverse=True, size=n)
  group_N = group_N.reshape(-1)
  weight_N = traj.exists_N.astype(jnp.float32)
  count_G = jax.ops.segment_sum(weight_N, group_N, num_segments=n)
  mean_G = jax.ops.segment_sum(weight_N * traj.outcome_N, group_N, num_segments=n) / jnp.maximum(
      count_G, 1)
  centred_N = traj.outcome_N - mean_G[group_N]
  var_G = (jax.ops.segment_sum(weight_N * jnp.square(centred_N), group_N, num_segments=n)
           / jnp.maximum(count_G - 1.0, 1.0))
  std_N = jnp.sqrt(var_G)[group_N]
  advantage_N = jnp.where(count_G[group_N] > 1, centred_N / (std_N + eps), 0.0)
  return _broadcast(advantage_N, action_mask, segment_ids)


class RunningMeanState(NamedTuple):
  """Ring buffers of past outcomes: `window_PxW[p]` holds prompt slot p's last W."""

  window_PxW: jax.Array  # float32 outcomes
  count_P: jax.Array  # int32 outcomes seen per slot (saturates the ring at W)


def init_running_mean(num_slots: int, window: int) -> RunningMeanState:
  """Empty windows: `num_slots` prompts (1 for the global scope), `window` outcomes each."""
  return RunningMeanState(jnp.zeros((num_slots, window), jnp.float32),
                          jnp.zeros((num_slots,), jnp.int32))


def running_mean_advantages(rewards: jax.Array, action_mask: jax.Array, prompt_ids: jax.Array,
                            state: RunningMeanState, *, scope: str = "prompt",
                            segment_ids: jax.Array | None = None
                            ) -> tuple[jax.Array, RunningMeanState]:
  """`R - mean(window)` advantages and the windows updated with this batch.

  Args:
    rewards, action_mask: `[B, T]`.
    prompt_ids: int slot per trajectory in `[0, num_slots)`, `[B]` per row or
      `[B, T]` per token (ignored for `scope="global"`, which uses slot 0).
      Trajectories without action tokens (batch padding) are ignored.
    state: from `init_running_mean` (num_slots 1 for the global scope).
    scope: "prompt" or "global".
    segment_ids: `[B, T]` segment ids of packed rows; None: one trajectory per row.

  Returns:
    `([B, T] advantages, new state)`.
  """
  if scope not in ("prompt", "global"):
    raise ValueError(f"running-mean scope={scope!r} is invalid: allowed values are "
                     "'prompt', 'global'.")
  traj = _trajectories(rewards, action_mask, prompt_ids, segment_ids, "prompt_ids")
  # Trajectories without action tokens (batch padding) neither read nor feed a window.
  used_N = traj.exists_N & traj.has_action_N
  num_slots, window = state.window_PxW.shape
  slot_N = jnp.where(used_N & (scope == "prompt"), traj.id_N, 0)
  filled_P = jnp.minimum(state.count_P, window)
  mean_P = jnp.sum(state.window_PxW, axis=1) / jnp.maximum(filled_P, 1)
  baseline_N = jnp.where(filled_P[slot_N] > 0, mean_P[slot_N], 0.0)

  # Push in batch order, all at once: the r-th outcome of slot p in this batch
  # goes to ring position (count_p + r) % W, and only the last W pushed per slot
  # survive, exactly as one push after another would leave the ring.
  n = slot_N.shape[0]
  key_N = jnp.where(used_N, slot_N, num_slots)  # unused slots sort last
  order_N = jnp.argsort(key_N, stable=True)
  pushed_P = jax.ops.segment_sum(used_N.astype(jnp.int32), slot_N, num_segments=num_slots)
  first_P = jnp.cumsum(pushed_P) - pushed_P  # sorted index of each slot's first push
  sorted_slot_N = key_N[order_N]
  rank_sorted_N = jnp.arange(n) - first_P[jnp.minimum(sorted_slot_N, num_slots - 1)]
  rank_N = jnp.zeros(n, jnp.int32).at[order_N].set(rank_sorted_N.astype(jnp.int32))
  survives_N = used_N & (rank_N >= pushed_P[slot_N] - window)
  position_N = (state.count_P[slot_N] + rank_N) % window
  window_PxW = state.window_PxW.at[jnp.where(survives_N, slot_N, num_slots), position_N].set(
      traj.outcome_N, mode="drop")
  advantage_N = traj.outcome_N - baseline_N
  return (_broadcast(advantage_N, action_mask, segment_ids),
          RunningMeanState(window_PxW, state.count_P + pushed_P))
