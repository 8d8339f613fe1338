"""Critic loss and diagnostics (docs/algorithm.md §4).

    loss_t = 0.5 * max((V_t - G_t)^2, (clip(V_t, V_old_t - eps_v, V_old_t + eps_v) - G_t)^2)

over action tokens; `clip_eps=None` gives the unclipped `0.5 * (V - G)^2`.
`V_old` is the critic's estimate when the batch's advantages were computed (the
same values the GAE used), so repeated value updates on one batch (K = 2) are
kept near it.

Explained variance `1 - Var(G - V) / Var(G)` over action tokens: 1 is perfect,
0 is no better than a constant, negative is worse. `critic_moments` gives the
batch's means and variances of G and of G - V, from which explained variance and
bias over several batches pool exactly (`sao_jax.run.critic_window`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sao_jax.losses import aggregate as agg


# Returns (rewards in [0, 1] here) with a smaller variance carry no signal.
MIN_RETURN_VARIANCE = 1e-8


def explained_variance(values: jax.Array, returns: jax.Array, action_mask: jax.Array) -> jax.Array:
  """`1 - Var(G - V) / Var(G)` over masked tokens; NaN when the returns do not vary.

  "Do not vary" means Var(G) <= `MIN_RETURN_VARIANCE` (std 1e-4): below that the
  ratio divides float32 rounding noise (a batch with every reward 0 gave -7e8),
  and there is nothing for the critic to explain. NaN, not 0, so the metric says
  "undefined" rather than "explains nothing"; the metrics writer skips it in
  TensorBoard and keeps it in the JSONL.
  """
  mask = action_mask.astype(bool)

  def var(x):
    mean = agg.masked_mean(x, mask)
    return agg.masked_mean(jnp.square(x - mean), mask)

  var_returns = var(returns.astype(jnp.float32))
  var_residual = var(returns.astype(jnp.float32) - values.astype(jnp.float32))
  defined = var_returns > MIN_RETURN_VARIANCE
  return jnp.where(defined, 1.0 - var_residual / jnp.where(defined, var_returns, 1.0), jnp.nan)


def critic_moments(values: jax.Array, returns: jax.Array,
                   action_mask: jax.Array) -> dict[str, jax.Array]:
  """Over masked tokens: `return_mean` (mean G), `return_var` (Var G) and
  `residual_var` (Var(G - V)), population variances (divided by the token count);
  the residual's mean is minus the bias, mean(V - G). With the token count these are
  sufficient to pool explained variance and bias over batches: the pooled variance is
  `sum_i n_i (var_i + (mean_i - mean)^2) / sum_i n_i`."""
  mask = action_mask.astype(bool)
  returns = returns.astype(jnp.float32)
  residual = returns - values.astype(jnp.float32)
  return_mean = agg.masked_mean(returns, mask)
  return {"return_mean": return_mean,
          "return_var": agg.masked_mean(jnp.square(returns - return_mean), mask),
          "residual_var": agg.masked_mean(
              jnp.square(residual - agg.masked_mean(residual, mask)), mask)}


def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array,
               action_mask: jax.Array, *, clip_eps: float | None = 0.2,
               loss_agg: str = "token_mean",
               denominator: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> tuple[jax.Array, dict]:
  """Clipped value regression on `[B, T]` arrays.

  Args:
    values: `[B, T]` current critic outputs (differentiable).
    old_values: `[B, T]` critic outputs when the targets were computed.
    returns: `[B, T]` value targets G (constants).
    action_mask: `[B, T]` 1 on the tokens the critic trains on (the action tokens;
      the response span for plain GAE, `gae_span="response"`).
    clip_eps: `eps_v`, or None for the unclipped loss.
    loss_agg, denominator, segment_ids: as in `aggregate.aggregate`.

  Returns:
    `(loss, metrics)` with `value_clip_frac`, `value_mean`, `return_mean`,
    `explained_variance`.
  """
  mask = action_mask.astype(bool)
  values = values.astype(jnp.float32)
  returns = jax.lax.stop_gradient(returns.astype(jnp.float32))
  error = jnp.square(values - returns)
  if clip_eps is None:
    per_token = 0.5 * error
    clipped_used = jnp.zeros_like(mask)
  else:
    old = jax.lax.stop_gradient(old_values.astype(jnp.float32))
    clipped_error = jnp.square(jnp.clip(values, old - clip_eps, old + clip_eps) - returns)
    per_token = 0.5 * jnp.maximum(error, clipped_error)
    clipped_used = mask & (clipped_error > error)
  per_token = jnp.where(mask, per_token, 0.0)
  loss = agg.aggregate(per_token, mask, loss_agg, denominator=denominator,
                       segment_ids=segment_ids)
  metrics = {
      "value_clip_frac": agg.masked_mean(clipped_used.astype(jnp.float32), mask),
      "value_mean": agg.masked_mean(values, mask),
      "return_mean": agg.masked_mean(returns, mask),
      "explained_variance": explained_variance(jax.lax.stop_gradient(values), returns, mask),
  }
  return loss, metrics
