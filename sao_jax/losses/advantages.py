"""Critic-free advantage baselines (SAO.md §5): GRPO groups and running means.

Both take the trajectory's outcome `R = sum_t rewards_t` (the outcome reward on
the last action token plus any per-turn rewards) and broadcast one advantage
onto every action token of the trajectory; 0 elsewhere.

GRPO:          A = (R - mean_group(R)) / (std_group(R) + eps)
  `std_group` is the *unbiased* sample standard deviation (ddof = 1), as
  `torch.std` computes it in the GRPO implementations users compare against
  (TRL, verl). A group of one has no spread and gets A = 0.

Running mean:  A = R - mean(last W outcomes)
  The window holds outcomes *before* the current batch: every trajectory in a
  batch sees the window as it was when the batch arrived, then the batch's
  outcomes are pushed in batch order. `scope="prompt"` keeps one window per
  prompt id (paper: W = 8), `scope="global"` one window for all (paper: W = 128).
  An empty window gives baseline 0.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def _outcomes(rewards_BxT: jax.Array, action_mask_BxT: jax.Array) -> jax.Array:
  return jnp.sum(jnp.where(action_mask_BxT.astype(bool), rewards_BxT.astype(jnp.float32), 0.0),
                 axis=-1)


def _broadcast(advantage_B: jax.Array, action_mask_BxT: jax.Array) -> jax.Array:
  return jnp.where(action_mask_BxT.astype(bool), advantage_B[:, None], 0.0)


def grpo_advantages(rewards: jax.Array, action_mask: jax.Array, group_ids: jax.Array, *,
                    eps: float = 1e-6) -> jax.Array:
  """Group-normalised outcome advantages.

  Args:
    rewards: `[B, T]` per-token rewards.
    action_mask: `[B, T]`.
    group_ids: `[B]` int ids in `[0, B)`; trajectories sharing an id are one
      prompt's group.
    eps: added to the group std.

  Returns:
    `[B, T]` advantages, `(R - mean) / (std + eps)` on action tokens.
  """
  batch = rewards.shape[0]
  outcome_B = _outcomes(rewards, action_mask)
  count_G = jax.ops.segment_sum(jnp.ones_like(outcome_B), group_ids, num_segments=batch)
  mean_G = jax.ops.segment_sum(outcome_B, group_ids, num_segments=batch) / jnp.maximum(count_G, 1)
  centred_B = outcome_B - mean_G[group_ids]
  var_G = (jax.ops.segment_sum(jnp.square(centred_B), group_ids, num_segments=batch)
           / jnp.maximum(count_G - 1.0, 1.0))
  std_B = jnp.sqrt(var_G)[group_ids]
  advantage_B = jnp.where(count_G[group_ids] > 1, centred_B / (std_B + eps), 0.0)
  return _broadcast(advantage_B, action_mask)


class RunningMeanState(NamedTuple):
  """Ring buffers of past outcomes: `window_PxW[p]` holds prompt slot p's last W."""

  window_PxW: jax.Array  # float32 outcomes
  count_P: jax.Array  # int32 outcomes seen per slot (saturates the ring at W)


def init_running_mean(num_slots: int, window: int) -> RunningMeanState:
  """Empty windows: `num_slots` prompts (1 for the global scope), `window` outcomes each."""
  return RunningMeanState(jnp.zeros((num_slots, window), jnp.float32),
                          jnp.zeros((num_slots,), jnp.int32))


def running_mean_advantages(rewards: jax.Array, action_mask: jax.Array, prompt_ids: jax.Array,
                            state: RunningMeanState, *,
                            scope: str = "prompt") -> tuple[jax.Array, RunningMeanState]:
  """`R - mean(window)` advantages and the windows updated with this batch.

  Args:
    rewards, action_mask: `[B, T]`.
    prompt_ids: `[B]` int slot per trajectory in `[0, num_slots)` (ignored for
      `scope="global"`, which uses slot 0). Rows without action tokens (batch
      padding) are ignored.
    state: from `init_running_mean` (num_slots 1 for the global scope).
    scope: "prompt" or "global".

  Returns:
    `([B, T] advantages, new state)`.
  """
  if scope not in ("prompt", "global"):
    raise ValueError(f"running-mean scope={scope!r} is invalid: allowed values are "
                     "'prompt', 'global'.")
  outcome_B = _outcomes(rewards, action_mask)
  # Rows without action tokens (batch padding) neither read nor feed a window.
  has_action_B = jnp.any(action_mask.astype(bool), axis=-1)
  slot_B = jnp.where(has_action_B & (scope == "prompt"), prompt_ids, 0).astype(jnp.int32)
  window = state.window_PxW.shape[1]
  filled_P = jnp.minimum(state.count_P, window)
  mean_P = jnp.sum(state.window_PxW, axis=1) / jnp.maximum(filled_P, 1)
  baseline_B = jnp.where(filled_P[slot_B] > 0, mean_P[slot_B], 0.0)

  # Push in batch order; a scan keeps the order exact when a slot repeats in a batch.
  def push(carry, item):
    window_PxW, count_P = carry
    slot, outcome, has_action = item
    pushed = window_PxW.at[slot, count_P[slot] % window].set(outcome)
    return (jnp.where(has_action, pushed, window_PxW),
            count_P.at[slot].add(has_action.astype(jnp.int32))), None

  (window_PxW, count_P), _ = jax.lax.scan(push, (state.window_PxW, state.count_P),
                                          (slot_B, outcome_B, has_action_B))
  return _broadcast(outcome_B - baseline_B, action_mask), RunningMeanState(window_PxW, count_P)

