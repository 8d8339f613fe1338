"""Token sampling from next-token logits: temperature, top-k, top-p, per-row keys.

  token_keys(seed_N, index_N)                           -> keys, one per row
  sample(logits_NxV, keys, temperature, top_k, top_p)   -> (token_N, behavior_logp_N)

With z = logits / temperature and p = softmax(z), the sampler draws from

    q(v) proportional to p(v) * [v in top_k(p)] * [v in nucleus_{top_p}(p)]

where top_k(p) is the k most likely tokens (all when k = 0; ties at the k-th
value are all kept) and the nucleus is the smallest prefix of the tokens sorted
by p whose mass reaches top_p (the token that crosses top_p is kept, so the most
likely token always is). The draw is by inverse CDF: with u ~ U(0, 1] from the
row's key, token = min{v : C(v) >= u * C(V-1)}, C the cumulative sum of the
(unnormalised) q over the vocabulary, so a token with q(v) = 0 is never drawn.
One uniform per row makes a row's draw a function of its logits and its key
only, never of the other rows.

`behavior_logp` is log p(token) = log_softmax(z)[token]: the full
temperature-scaled distribution, NOT q renormalised after truncation. The
learner scores tokens with `policy_forward(..., temperature=T)`, which computes
exactly p, so the DIS ratio exp(logp_theta - behavior_logp) is correct only when
q = p: with truncation the token came from q, which neither the recorded log-prob
nor the learner knows. Training configs therefore refuse top-k / top-p
(`sao_jax.config.sampler.check_untruncated`, docs/algorithm.md §2); truncation is for
evaluation (greedy: top_k = 1), where no ratio is taken.

Keys: token_keys folds the trajectory position of the token into the episode's
seed, key = fold_in(key(seed), index), so a sequence's tokens do not depend on
which slot it ran in or which other sequences ran beside it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_keys(seed_N: jax.Array, index_N: jax.Array) -> jax.Array:
  """Typed PRNG keys fold_in(key(seed), index), one per row."""
  return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seed_N, index_N)


def truncation_mask(z_NxV: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """bool [N, V]: tokens kept by top-k and top-p (module docstring); all True when off."""
  if top_k == 0 and top_p >= 1.0:
    return jnp.ones(z_NxV.shape, bool)
  v = z_NxV.shape[-1]
  sorted_NxV = -jnp.sort(-z_NxV, axis=-1)  # descending
  keep_count_N = jnp.full(z_NxV.shape[:1], v, jnp.int32)
  if top_k:
    keep_count_N = jnp.minimum(keep_count_N, top_k)
  if top_p < 1.0:
    probs_NxV = jax.nn.softmax(sorted_NxV, axis=-1)
    mass_before_NxV = jnp.cumsum(probs_NxV, axis=-1) - probs_NxV
    keep_count_N = jnp.minimum(keep_count_N, jnp.sum(mass_before_NxV < top_p, axis=-1, dtype=jnp.int32))
  threshold_N = jnp.take_along_axis(sorted_NxV, (keep_count_N - 1)[:, None], axis=-1)
  return z_NxV >= threshold_N


def sample(logits_NxV: jax.Array, keys_N: jax.Array, temperature: float, top_k: int,
           top_p: float) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row; returns (token_N int32, behavior_logp_N float32)."""
  z_NxV = logits_NxV.astype(jnp.float32) / temperature
  logp_NxV = jax.nn.log_softmax(z_NxV, axis=-1)
  keep_NxV = truncation_mask(z_NxV, top_k, top_p)
  weight_NxV = jnp.where(keep_NxV, jnp.exp(logp_NxV), 0.0)
  cdf_NxV = jnp.cumsum(weight_NxV, axis=-1)
  u_N = 1.0 - jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(keys_N)  # (0, 1]
  target_Nx1 = (u_N * cdf_NxV[:, -1])[:, None]
  # First token of positive weight whose C reaches the target; requiring the weight
  # guards against a rounding wobble of the parallel cumsum landing on a zero-weight token.
  positive_NxV = weight_NxV > 0
  hit_NxV = (cdf_NxV >= target_Nx1) & positive_NxV
  last_positive_N = z_NxV.shape[-1] - 1 - jnp.argmax(positive_NxV[:, ::-1], axis=-1)
  token_N = jnp.where(jnp.any(hit_NxV, axis=-1), jnp.argmax(hit_NxV, axis=-1), last_positive_N)
  token_N = token_N.astype(jnp.int32)
  behavior_logp_N = jnp.take_along_axis(logp_NxV, token_N[:, None], axis=-1)[:, 0]
  return token_N, behavior_logp_N
