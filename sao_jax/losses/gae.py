"""Skip-observation token-level GAE (docs/algorithm.md §3).

GAE over action tokens only, as if observation tokens were absent. With
`t_1 < ... < t_K` the positions where `action_mask == 1`:

    delta_k = r_{t_k} + gamma * V_{t_{k+1}} - V_{t_k}      (V_{t_{K+1}} = 0, terminal)
    A_k     = delta_k + gamma * lam * A_{k+1}               (A_{K+1} = 0)
    G_k     = A_k + V_{t_k}                                 (the value target)

Across an observation gap the bootstrap jumps from the last action token of a
turn to the first action token of the next; the gap costs no discount. On padded
`[B, T]` arrays an observation (or padding) token passes "next value" and
"running advantage" through unchanged, and every output is 0 off the mask. Plain
GAE is the all-ones-mask case, and skip-observation GAE equals plain GAE on the
compacted action-only sequence.

Rewards on tokens outside `action_mask` are not seen (docs/algorithm.md puts the outcome on
the last action token); the trajectory validator rejects such trajectories.

Packed rows (`segment_ids`, `sao_jax.segments`): each segment is its own trajectory.
The last token of a segment is terminal: the recurrence restarts there with
"next value" and "running advantage" 0, so nothing bootstraps or flows across a
segment boundary, and a packed row equals GAE of each segment alone. Padding
between or after segments passes everything through. `lam` may differ per
segment (a per-token `[B, T]` array, constant within a segment).

Two implementations with identical semantics:
- `"scan"`: `lax.scan` over time, O(T) sequential depth; the reference.
- `"associative"`: both reverse recurrences (next action value, advantage) are
  affine, so `lax.associative_scan` evaluates them with O(log T) depth.
- `"auto"` (default) picks per backend: on CPU a sequential loop is the cheapest
  (no parallel hardware to fill; `benchmarks/gae.py` measured scan ~3x faster
  than the associative form at 4 x 65536), on TPU/GPU the O(log T) depth wins.

Split sequences (a mesh whose sequence axis splits T over S devices,
`sao_jax.sharding.sequence`; natural order, device d holding positions
[d T/S, (d + 1) T/S)): whatever the method, each device solves its chunk with the
associative form under one `shard_map`. The scan's element at a chunk's first
position is the chunk's whole affine map x_first = b + c x_in of the value its
successor chunk carries in; devices all-gather these S maps (a few numbers per
row), compose those of the chunks after their own to get their x_in, and finish
with x_t = b_t + c_t x_in, the suffix map of position t applied to it. Both
recurrences are carried so: the next action value (its x_in is also the last
position's "next value") and the advantage.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec

from sao_jax import segments
from sao_jax.config.algorithm import GAE_METHODS
from sao_jax.sharding import sequence


def length_adaptive_lam(action_mask_BxT: jax.Array, alpha: float,
                        segment_ids: jax.Array | None = None) -> jax.Array:
  """Per-trajectory `lam = 1 - 1 / (alpha * l)`, `l` = number of action tokens.

  Without `segment_ids` each row is one trajectory and the result is `[B]`; with
  them (packed rows) it is per token, `[B, T]`: every token carries its
  segment's lam (`l` counts the segment's action tokens), padding 0.
  Trajectories without action tokens get `lam = 0` (their advantages are 0 anyway).
  """
  mask = action_mask_BxT.astype(jnp.float32)
  lam = lambda length: jnp.where(length > 0, 1.0 - 1.0 / (alpha * jnp.maximum(length, 1.0)), 0.0)
  if segment_ids is None:
    return lam(jnp.sum(mask, axis=-1))
  seg_BxT = segments.resolve(segment_ids, mask.shape)
  return jnp.where(seg_BxT != 0, lam(segments.totals(mask, seg_BxT)), 0.0)


def gae(rewards: jax.Array, values: jax.Array, action_mask: jax.Array, *,
        gamma: float | jax.Array, lam: float | jax.Array,
        method: str = "auto",
        segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Skip-observation GAE on `[B, T]` arrays.

  Args:
    rewards: `[B, T]` per-token rewards (read on action tokens only).
    values: `[B, T]` critic estimates V(state before token t).
    action_mask: `[B, T]` 1 where the policy generated the token (bool or number).
    gamma: discount per action token.
    lam: GAE lambda: a scalar, per row `[B]`, or per token `[B, T]` (constant
      within a segment; `length_adaptive_lam` with `segment_ids`).
    method: "associative" (O(log T) depth), "scan" (reference) or "auto"
      (default: scan on CPU, associative on accelerators). Under a mesh that
      splits sequences, the chunk-composed associative form (module docstring).
    segment_ids: `[B, T]` segment ids of packed rows (0 = padding); None: each
      row is one trajectory.

  Returns:
    `(advantages, returns)`, both `[B, T]` float32, 0 off the action mask;
    `returns = advantages + values` on action tokens (the value targets when `lam`
    is the critic's lambda).
  """
  if method not in GAE_METHODS:
    raise ValueError(f"gae method={method!r} is invalid: allowed values are "
                     f"{', '.join(map(repr, GAE_METHODS))}.")
  if rewards.ndim != 2 or rewards.shape != values.shape or rewards.shape != action_mask.shape:
    raise ValueError(
        f"gae expects rewards, values and action_mask of one shape [B, T]; got "
        f"{rewards.shape}, {values.shape}, {action_mask.shape}.")
  shape = rewards.shape
  lam = jnp.asarray(lam, jnp.float32)
  if lam.shape not in ((), shape[:1], shape):
    raise ValueError(f"gae lam has shape {lam.shape}; expected a scalar, [B]=[{shape[0]}] or "
                     f"[B, T]={list(shape)}.")
  lam_BxT = jnp.broadcast_to(lam[:, None] if lam.ndim == 1 else lam, shape)
  # Terminal positions: the last token of every segment, or of every row unpacked
  # (built directly: a cummin over a constant would make XLA constant-fold a
  # [B, T] scan at compile time, seconds at T = 64K).
  if segment_ids is None:
    end_BxT = jnp.broadcast_to(jnp.arange(shape[1]) == shape[1] - 1, shape)
  else:
    end_BxT = segments.segment_ends(segments.resolve(segment_ids, shape))
  gamma = jnp.asarray(gamma, jnp.float32)
  mask = action_mask.astype(bool)
  rewards = jnp.where(mask, rewards.astype(jnp.float32), 0.0)
  values = jnp.where(mask, values.astype(jnp.float32), 0.0)
  if method == "auto":
    method = "scan" if jax.default_backend() == "cpu" else "associative"
  if sequence.axes():
    advantages = _gae_split(rewards, values, mask, end_BxT, gamma, lam_BxT)
  elif method == "scan":
    advantages = _gae_scan(rewards, values, mask, end_BxT, gamma, lam_BxT)
  else:
    advantages = _gae_associative(rewards, values, mask, end_BxT, gamma, lam_BxT)
  returns = jnp.where(mask, advantages + values, 0.0)
  return advantages, returns


def _gae_scan(rewards, values, mask, end, gamma, lam):
  """Reverse `lax.scan`; the carry is (value of next action token, its advantage),
  reset to 0 on a segment's last token (terminal)."""

  def step(carry, inputs):
    reward_B, value_B, mask_B, end_B, lam_B = inputs
    next_value_B, next_adv_B = (jnp.where(end_B, 0.0, c) for c in carry)
    delta_B = reward_B + gamma * next_value_B - value_B
    adv_B = delta_B + gamma * lam_B * next_adv_B
    carry = (jnp.where(mask_B, value_B, next_value_B), jnp.where(mask_B, adv_B, next_adv_B))
    return carry, jnp.where(mask_B, adv_B, 0.0)

  zeros_B = jnp.zeros(rewards.shape[:1], jnp.float32)
  _, adv_TxB = jax.lax.scan(step, (zeros_B, zeros_B),
                            (rewards.T, values.T, mask.T, end.T, lam.T), reverse=True)
  return adv_TxB.T


# Reverse affine recurrences x_t = b_t + c_t x_{t+1}: position t is the map
# f_t(x) = b_t + c_t x, and in reverse scan order `later` is the composition of the
# positions after `earlier`'s; f_earlier o f_later = (c_e c_l, b_e + c_e b_l).


def _compose_exact(later, earlier):
  """Composition of (c, b) maps whose c's are 0 or 1, so their products are exact."""
  c_l, b_l = later
  c_e, b_e = earlier
  return c_e * c_l, b_e + c_e * b_l


def _factor(n, ended, log_a):
  """The c of a span of the advantage recurrence held as (n, ended, log a): 0 if it
  holds a segment end, else a^n for its n action tokens."""
  power = jnp.where(n == 0, 1.0, jnp.exp(n.astype(jnp.float32) * log_a))
  return jnp.where(ended, 0.0, power)


def _compose_counted(later, earlier):
  """Composition of advantage-recurrence maps held as (n, ended, log a, b)."""
  n_l, ended_l, log_a_l, b_l = later
  n_e, ended_e, log_a_e, b_e = earlier
  # A span's log a is that of its action tokens: it matters only while the span
  # holds no end, and then all of them lie in one segment and share one lam. It
  # must not come from a part without action tokens: a padding hole inside a
  # segment carries lam = 0 (log a = -inf), which would cut the recurrence.
  log_a = jnp.where(n_e > 0, log_a_e, log_a_l)
  return n_e + n_l, ended_e | ended_l, log_a, b_e + _factor(n_e, ended_e, log_a_e) * b_l


def _value_maps(values, mask, end):
  """Pass 1's suffix maps (c, b) per position: the value of the first action token at
  or after t within t's segment is b_t + c_t x_in. An action token resets the carried
  value to its own (c = 0, b = V_t), a segment's last token to its own or 0, others
  pass it on (c = 1, b = 0)."""
  return jax.lax.associative_scan(_compose_exact, (jnp.where(mask | end, 0.0, 1.0), values),
                                  reverse=True, axis=1)


def _advantage_maps(mask, end, gamma, lam, delta):
  """Pass 2's suffix maps (n, ended, log a, b) per position: A_t = b_t + factor A_in.

  A_t = delta_t + a A_next with a = gamma * lam on action tokens, the identity
  elsewhere and 0 after a segment's last token, so a span's factor is 0 if it holds
  a segment end, else a^n for its n action tokens (a span without an end lies in one
  segment: one lam). Carry (n, ended, log a) and take a^n = exp(n log a) rather than
  multiplying the factors: a float32 product of ~10^4 factors like 0.99993 (lam near
  1 on long traces) drifts by ~1e-5 relative, which cancellation between the terms
  amplifies.
  """
  log_a_BxT = jnp.log(gamma * lam)  # -inf for a = 0: a^0 = 1 is guarded
  return jax.lax.associative_scan(
      _compose_counted, (mask.astype(jnp.int32), end, log_a_BxT, delta), reverse=True, axis=1)


def _delta(rewards, values, mask, end, gamma, carried, value_in):
  """TD errors from pass 1's carried values; `value_in` [B] is the value carried into
  the position after the last (0 for a whole row)."""
  next_value_BxT = jnp.where(end, 0.0, jnp.concatenate([carried[:, 1:], value_in[:, None]], 1))
  return jnp.where(mask, rewards + gamma * next_value_BxT - values, 0.0)


def _gae_associative(rewards, values, mask, end, gamma, lam):
  """Two reverse affine recurrences `x_t = b_t + c_t x_{t+1}` (`x_T = 0`), each
  solved with `lax.associative_scan` in O(log T) depth; a segment's last token has
  c = 0 (terminal), which cuts every composition across it."""
  zeros_B = jnp.zeros(rewards.shape[:1], jnp.float32)
  _, carried_BxT = _value_maps(values, mask, end)
  delta_BxT = _delta(rewards, values, mask, end, gamma, carried_BxT, zeros_B)
  advantages = _advantage_maps(mask, end, gamma, lam, delta_BxT)[-1]
  return jnp.where(mask, advantages, 0.0)


def _carry_in(compose, first_maps, axes):
  """[B] value carried into this device's chunk: the maps of all chunks (each
  chunk's map is its first position's suffix map, `first_maps`, [B] per component)
  all-gathered, those after this device's composed, applied to 0 (their b)."""
  gathered = jax.lax.all_gather(first_maps, axes, axis=0)  # [S, B] per component
  suffix_b_SxB = jax.lax.associative_scan(compose, gathered, reverse=True, axis=0)[-1]
  after_SxB = jnp.concatenate([suffix_b_SxB[1:], jnp.zeros_like(suffix_b_SxB[:1])])
  return after_SxB[jax.lax.axis_index(axes)]


def _gae_split(rewards, values, mask, end, gamma, lam):
  """`_gae_associative` with T split over the mesh's sequence axes (natural order),
  chunk maps carried between devices (module docstring)."""
  axes = sequence.axes()

  def local(rewards, values, mask, end, lam, gamma):
    c_BxL, b_BxL = _value_maps(values, mask, end)
    value_in_B = _carry_in(_compose_exact, (c_BxL[:, 0], b_BxL[:, 0]), axes)
    carried_BxL = b_BxL + c_BxL * value_in_B[:, None]
    delta_BxL = _delta(rewards, values, mask, end, gamma, carried_BxL, value_in_B)
    n, ended, log_a, b = _advantage_maps(mask, end, gamma, lam, delta_BxL)
    adv_in_B = _carry_in(_compose_counted, (n[:, 0], ended[:, 0], log_a[:, 0], b[:, 0]), axes)
    advantages = b + _factor(n, ended, log_a) * adv_in_B[:, None]
    return jnp.where(mask, advantages, 0.0)

  split = PartitionSpec(None, axes)
  return jax.shard_map(local, mesh=jax.sharding.get_abstract_mesh(),
                       in_specs=(split,) * 5 + (PartitionSpec(),), out_specs=split,
                       axis_names=set(axes))(rewards, values, mask, end, lam, gamma)
