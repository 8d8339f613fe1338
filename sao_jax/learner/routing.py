"""MoE routing-mismatch metrics of the train step: how often the learner's router picks
other experts than the sampler recorded, and what that does to the DIS band.

Over action tokens with a record (`batch.routed_experts`, docs/explanation/moe-routing.md),
`routing/changed_frac` is the share whose top-k expert set differs, in any MoE
layer, between the step's router (before its update) and the sampler's record, and
`routing/changed_frac/layer_<l>` the same for MoE layer l alone. Token t's
log-prob is computed at position t - 1, so the DIS band (`losses.dis_band`,
whatever the variant's loss) is split by the routing change there:
`routing/dis_masked_frac_changed` and `_unchanged` are the shares of action tokens
outside the band among those whose predecessor (in their segment) has a record and
changed, or did not (`routing/changed_scored_tokens`, `routing/unchanged_scored_tokens`).
`counts` gives one micro-batch's counts (the step sums them over micro-batches);
`shares` divides them, NaN where nothing is counted. With router replay the
comparison still uses the step's own router, so the split shows what replay removed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sao_jax import losses
from sao_jax.config import AlgorithmConfig, ModelConfig
from sao_jax.models import moe
from sao_jax.models.forward import PolicyOutput
from sao_jax.types import Batch

# The counts that become shares: count -> (share, the count it divides by); a count's
# per-layer keys (`<count>/layer_<l>`) become `<share>/layer_<l>`.
SHARES = {
    "routing/changed": ("routing/changed_frac", "routing/recorded_tokens"),
    "routing/dis_masked_changed": ("routing/dis_masked_frac_changed",
                                   "routing/changed_scored_tokens"),
    "routing/dis_masked_unchanged": ("routing/dis_masked_frac_unchanged",
                                     "routing/unchanged_scored_tokens"),
}


def counts(out: PolicyOutput, batch: Batch, model: ModelConfig,
           algorithm: AlgorithmConfig) -> dict[str, jax.Array]:
  """The routing counts (float32 scalars) of `batch` under the forward `out`."""
  want = (len(out.router_logits), model.num_experts_per_tok)
  if tuple(batch.routed_experts.shape[2:]) != want:
    raise ValueError(f"the batch's routing records are {tuple(batch.routed_experts.shape[2:])} "
                     f"(MoE layers, top-k) per token; this model routes {want}: the samplers "
                     "must serve the learner's model")
  seg = batch.segment_ids
  action = batch.action_mask.astype(bool)
  changed_BxTxL, recorded_BxT = moe.routing_changes(out.router_logits, batch.routed_experts,
                                                    model.num_experts_per_tok)
  changed_BxT = jnp.any(changed_BxTxL, axis=-1)
  counted_BxT = action & recorded_BxT
  # Position t - 1 of the same segment, where token t's log-prob is computed.
  same_seg = seg[:, 1:] == seg[:, :-1]
  before = lambda x_BxT: jnp.pad(x_BxT[:, :-1] & same_seg, ((0, 0), (1, 0)))
  scored_BxT = action & before(recorded_BxT)
  flipped_BxT = scored_BxT & before(changed_BxT)
  steady_BxT = scored_BxT & ~before(changed_BxT)
  below, above = losses.dis_band(out.logp_BxT, batch.behavior_logp, action,
                                 eps_low=algorithm.eps_low, eps_high=algorithm.eps_high)
  masked_BxT = below | above
  count = lambda x: jnp.sum(x.astype(jnp.float32))
  found = {"routing/recorded_tokens": count(counted_BxT),
           "routing/changed": count(counted_BxT & changed_BxT),
           "routing/changed_scored_tokens": count(flipped_BxT),
           "routing/unchanged_scored_tokens": count(steady_BxT),
           "routing/dis_masked_changed": count(flipped_BxT & masked_BxT),
           "routing/dis_masked_unchanged": count(steady_BxT & masked_BxT)}
  for layer in range(changed_BxTxL.shape[-1]):
    found[f"routing/changed/layer_{layer}"] = count(counted_BxT & changed_BxTxL[..., layer])
  return found


def shares(metrics: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """`metrics` with each count of `SHARES` replaced by its share (NaN without tokens)."""
  out = dict(metrics)
  for count, (share, over) in SHARES.items():
    for key in [k for k in metrics if k == count or k.startswith(count + "/")]:
      denominator = metrics[over]
      out[share + key[len(count):]] = jnp.where(
          denominator > 0, out.pop(key) / jnp.maximum(denominator, 1.0), jnp.nan)
  return out
