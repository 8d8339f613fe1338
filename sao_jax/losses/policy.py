"""Policy losses: direct double-sided IS (DIS, docs/algorithm.md §2) and PPO clip (§5).

Both are "direct": the importance ratio is taken against the sampler's recorded
`behavior_logp`, with no old-policy forward pass.

    ratio_t = exp(logp_t - behavior_logp_t)

DIS keeps a token only if its ratio lies strictly inside the band,

    keep_t = action_mask_t * [1 - eps_low < ratio_t < 1 + eps_high]
    loss   = - sum_t keep_t * stop_gradient(ratio_t) * A_t * logp_t / denom

so the gradient of a kept token is `-ratio_t * A_t * grad logp_t` and a token
outside the band on *either* side contributes exactly zero, whatever the sign of
its advantage. Neither the mask nor the ratio factor is differentiated (the
literal product would add a spurious `(logp + 1)` factor).

PPO clip (the `grpo` / `ppo` baselines):

    loss_t = - min(ratio_t * A_t, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_t)

Metrics (means over action tokens): `mask_low_frac` / `mask_high_frac` (DIS:
ratio at or beyond the lower / upper edge), `clip_frac` (PPO: tokens whose
gradient the clip stopped), `ratio_mean`, `ratio_max`, and the KL of the current
policy from the behavior policy estimated on behavior samples,
`kl_k1 = E[log b - log p]` and `kl_k3 = E[r - 1 - log r]` with `r = p / b`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sao_jax.losses import aggregate as agg


def _ratio_metrics(log_ratio_BxT: jax.Array, mask_BxT: jax.Array) -> dict[str, jax.Array]:
  ratio_BxT = jnp.exp(log_ratio_BxT)
  return {
      "ratio_mean": agg.masked_mean(ratio_BxT, mask_BxT),
      "ratio_max": agg.masked_max(ratio_BxT, mask_BxT),
      "kl_k1": agg.masked_mean(-log_ratio_BxT, mask_BxT),
      "kl_k3": agg.masked_mean(jnp.expm1(log_ratio_BxT) - log_ratio_BxT, mask_BxT),
  }


def _log_ratio(logp, behavior_logp, mask):
  # Off the mask behavior_logp is 0 by convention and logp is arbitrary: zero the
  # log-ratio there so no inf/nan can leak into sums or gradients.
  return jnp.where(mask, logp.astype(jnp.float32) - jax.lax.stop_gradient(
      behavior_logp.astype(jnp.float32)), 0.0)


def dis_band(logp: jax.Array, behavior_logp: jax.Array, action_mask: jax.Array, *,
             eps_low: float, eps_high: float) -> tuple[jax.Array, jax.Array]:
  """(below, above): `[B, T]` bool, the action tokens DIS masks because
  ratio = exp(logp - behavior_logp) <= 1 - eps_low, or >= 1 + eps_high (no gradient)."""
  mask = action_mask.astype(bool)
  ratio = jax.lax.stop_gradient(jnp.exp(_log_ratio(logp, behavior_logp, mask)))
  return mask & (ratio <= 1.0 - eps_low), mask & (ratio >= 1.0 + eps_high)


def dis_policy_loss(logp: jax.Array, behavior_logp: jax.Array, advantages: jax.Array,
                    action_mask: jax.Array, *, eps_low: float, eps_high: float,
                    loss_agg: str = "token_mean",
                    denominator: jax.Array | None = None,
                    segment_ids: jax.Array | None = None) -> tuple[jax.Array, dict]:
  """Direct double-sided IS loss on `[B, T]` arrays (see module docstring).

  Args:
    logp: `[B, T]` log-probs of the tokens under the current policy (differentiable).
    behavior_logp: `[B, T]` log-probs recorded by the sampler.
    advantages: `[B, T]` advantages (treated as constants).
    action_mask: `[B, T]` 1 on sampled tokens.
    eps_low, eps_high: band `(1 - eps_low, 1 + eps_high)`, strict on both sides.
    loss_agg: one of `token_mean`, `token_mean_kept`, `seq_mean_token_mean`.
    denominator: full-batch normaliser when this is a micro-batch
      (`aggregate.loss_denominator`); None normalises over this batch.
    segment_ids: `[B, T]` segment ids of packed rows (`seq_mean_token_mean`
      averages per segment); None: one trajectory per row.

  Returns:
    `(loss, metrics)`.
  """
  mask = action_mask.astype(bool)
  log_ratio = _log_ratio(logp, behavior_logp, mask)
  ratio = jax.lax.stop_gradient(jnp.exp(log_ratio))
  below, above = dis_band(logp, behavior_logp, mask, eps_low=eps_low, eps_high=eps_high)
  keep = mask & ~below & ~above
  # Zero ratio and advantage where not kept *before* multiplying: an overflowed
  # ratio times a zero mask would be nan, in the value and in the gradient.
  weight = jnp.where(keep, ratio * jax.lax.stop_gradient(advantages.astype(jnp.float32)), 0.0)
  per_token = -weight * jnp.where(keep, logp.astype(jnp.float32), 0.0)
  loss = agg.aggregate(per_token, mask, loss_agg, keep_BxT=keep, denominator=denominator,
                       segment_ids=segment_ids)
  metrics = {
      "mask_low_frac": agg.masked_mean(below.astype(jnp.float32), mask),
      "mask_high_frac": agg.masked_mean(above.astype(jnp.float32), mask),
      "kept_frac": agg.masked_mean(keep.astype(jnp.float32), mask),
      **_ratio_metrics(jax.lax.stop_gradient(log_ratio), mask),
  }
  return loss, metrics


def ppo_clip_loss(logp: jax.Array, behavior_logp: jax.Array, advantages: jax.Array,
                  action_mask: jax.Array, *, eps_low: float, eps_high: float,
                  loss_agg: str = "token_mean",
                  denominator: jax.Array | None = None,
                  segment_ids: jax.Array | None = None) -> tuple[jax.Array, dict]:
  """PPO clipped surrogate with asymmetric clip `(1 - eps_low, 1 + eps_high)`.

  `-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)` per action token, with
  `r = exp(logp - behavior_logp)`. Arguments as in `dis_policy_loss`;
  `token_mean_kept` counts the tokens whose gradient was not clipped.
  """
  mask = action_mask.astype(bool)
  log_ratio = _log_ratio(logp, behavior_logp, mask)
  ratio = jnp.exp(log_ratio)
  adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
  # The min picks the clipped branch (zero gradient) exactly when it is smaller.
  is_clipped = mask & (clipped < unclipped)
  per_token = jnp.where(mask, -jnp.minimum(unclipped, clipped), 0.0)
  loss = agg.aggregate(per_token, mask, loss_agg, keep_BxT=mask & ~is_clipped,
                       denominator=denominator, segment_ids=segment_ids)
  metrics = {
      "clip_frac": agg.masked_mean(is_clipped.astype(jnp.float32), mask),
      **_ratio_metrics(jax.lax.stop_gradient(log_ratio), mask),
  }
  return loss, metrics


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Entropy `-sum_v p_v log p_v` of the softmax over the last axis, in float32."""
  logits = logits.astype(jnp.float32)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


# The policy losses a variant can name (`sao_jax.config.algorithm.VARIANTS`' policy_loss
# column): name -> function. The one list of them; a job checks its variant's against
# it at start-up (`sao_jax.learner.step.check_variant`).
POLICY_LOSSES = {"dis": dis_policy_loss, "ppo_clip": ppo_clip_loss}
