"""The forward pass: the only bridge from params to what the losses need.

  policy_forward(params, cfg, tokens_BxT, seg_BxT, temperature=1.0, replay_BxTxLxK=None)
                                      -> PolicyOutput(logp_BxT, entropy_BxT, router_logits)
  value_forward(params, cfg, tokens_BxT, seg_BxT)  -> values_BxT
  logits_forward(params, cfg, tokens_BxT, seg_BxT) -> logits_BxTxV (float32; tests, evaluation)
  router_balance(router_logits, seg_BxT, cfg)      -> Switch-style load-balance metric

`seg_BxT` holds segment ids (`sao_jax.segments`): 0 on padding, k >= 1 on the k-th
trajectory packed into the row; a 0/1 padding mask is the one-segment case.
Each segment is scored as if it were alone in its row.

Alignment (all [B, T] outputs). Token t is scored by the distribution the model
produced after reading the tokens of its segment before it, x[:t]:
  logp_BxT[b, t]    = log p(tokens[b, t] | x[:t])
  entropy_BxT[b, t] = H(p(. | x[:t]))
  values_BxT[b, t]  = V(x[:t]), the critic's estimate of the state before
                      token t is emitted (docs/algorithm.md §1)
With `temperature` T the policy distribution is p = softmax(logits / T), the
full distribution the sampler records `behavior_logp` from
(`sao_jax.sampler.sampling`); logp and entropy are both of that p.
So index t of every output belongs to token t, exactly like `action_mask`,
`behavior_logp` and `rewards`. Entries are 0 where the score is undefined: t = 0
(no prefix), and wherever seg[t] == 0 or seg[t - 1] != seg[t] (padding, or the
first token of a segment, whose "prefix" is padding or another trajectory).

Padding and packing: rows may be left- or right-padded and hold several
segments; the position (RoPE) of a token is its index among the tokens of its
segment, and attention stays inside the segment, so a padded or packed row
gives the same scores as each trajectory alone.

Split sequences: under a mesh whose sequence axis splits T over S devices
(`sao_jax.sharding.sequence`), positions are computed in natural order, the
tokens, segment ids and positions are reordered into the balanced layout for the
trunk (attention: `sao_jax.models.sequence_attention`), each device runs the LM
head over its own positions (one `shard_map`), and the `[B, T]` outputs (and the
router logits) come back in natural order: the same values as unsplit.

Memory: the LM head runs over T in chunks of `cfg.logits_chunk` positions with
`lax.map`, each chunk under `jax.checkpoint`, so only one chunk's float32
[B, chunk, V] logits (and their softmax) are live at a time, in the forward
pass and again in the backward pass (recomputed from the chunk's hidden states
instead of stored); [B, T, V] is never materialised.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from sao_jax import segments
from sao_jax.config import ModelConfig
from sao_jax.models.attention import CausalMask
from sao_jax.models.transformer import Params, model
from sao_jax.sharding import sequence


class PolicyOutput(NamedTuple):
  logp_BxT: jax.Array
  entropy_BxT: jax.Array
  router_logits: tuple[jax.Array, ...]  # one [B, T, E] float32 per MoE layer; () if dense


def positions(seg_BxT: jax.Array) -> jax.Array:
  """Index of each token among the tokens of its segment (0 on padding).

  Real tokens up to t (inclusive count - 1) minus real tokens before the
  segment's first token; the latter is non-decreasing along the row, so a
  running max over the segment starts carries it to every token of the segment.
  """
  seg_BxT = seg_BxT.astype(jnp.int32)
  real_BxT = (seg_BxT != 0).astype(jnp.int32)
  count_BxT = jnp.cumsum(real_BxT, axis=1)
  before_start_BxT = jax.lax.cummax(
      jnp.where(segments.segment_starts(seg_BxT), count_BxT - real_BxT, 0), axis=1)
  return jnp.where(real_BxT > 0, count_BxT - 1 - before_start_BxT, 0)


def _trunk(params, cfg, head, tokens_BxT, seg_BxT, shards, replay_BxTxLxK=None):
  """Hidden states and router logits, in the balanced order when `shards` > 1 (the
  replayed experts, `replay_BxTxLxK`, reordered alike)."""
  # Causal structure within segments, never a [B, T, T] array unless attention is dense.
  seg_BxT = seg_BxT.astype(jnp.int32)
  pos_BxT = positions(seg_BxT)
  tokens_BxT, seg_BxT, pos_BxT = (sequence.to_balanced(x, shards)
                                  for x in (tokens_BxT, seg_BxT, pos_BxT))
  if replay_BxTxLxK is not None:
    replay_BxTxLxK = sequence.to_balanced(replay_BxTxLxK, shards)
  h_BxTxD, _, router_logits = model(params, cfg, head).trunk(
      tokens_BxT, pos_BxT, CausalMask(seg_BxT, pos_BxT), replay_BxTxLxK=replay_BxTxLxK)
  return h_BxTxD, router_logits


def _scored(seg_BxT: jax.Array) -> jax.Array:
  """[B, T-1] bool: token t+1 is real and its predecessor belongs to its segment."""
  seg_BxT = seg_BxT.astype(jnp.int32)
  return (seg_BxT[:, 1:] == seg_BxT[:, :-1]) & (seg_BxT[:, 1:] != 0)


def _shift_in(pred_BxT1: jax.Array, seg_BxT: jax.Array) -> jax.Array:
  """Places predictions for tokens 1..T-1 at their token's index, zeros elsewhere."""
  pred_BxT1 = jnp.where(_scored(seg_BxT), pred_BxT1, 0.0)
  return jnp.concatenate([jnp.zeros_like(pred_BxT1[:, :1]), pred_BxT1], axis=1)


def _chunked_logp_entropy(h_BxLxD, targets_BxL, kernel_DxV, chunk, temperature):
  """log p(target) and entropy of p = softmax(logits / temperature) per position,
  chunk positions at a time (float32)."""
  b, length, d = h_BxLxD.shape
  chunk = min(chunk, length)
  n = -(-length // chunk)
  pad = n * chunk - length
  h_NxBxCxD = jnp.pad(h_BxLxD, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, d).swapaxes(0, 1)
  tgt_NxBxC = jnp.pad(targets_BxL, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def one_chunk(args):
    h_BxCxD, tgt_BxC = args
    logits_BxCxV = jnp.einsum("bcd,dv->bcv", h_BxCxD, kernel_DxV,
                              preferred_element_type=jnp.float32) / temperature
    lse_BxC = jax.nn.logsumexp(logits_BxCxV, axis=-1)
    picked_BxC = jnp.take_along_axis(logits_BxCxV, tgt_BxC[:, :, None], axis=-1)[:, :, 0]
    probs_BxCxV = jnp.exp(logits_BxCxV - lse_BxC[:, :, None])
    entropy_BxC = lse_BxC - jnp.sum(probs_BxCxV * logits_BxCxV, axis=-1)
    return picked_BxC - lse_BxC, entropy_BxC

  logp_NxBxC, entropy_NxBxC = jax.lax.map(one_chunk, (h_NxBxCxD, tgt_NxBxC))
  unchunk = lambda x: x.swapaxes(0, 1).reshape(b, n * chunk)[:, :length]
  return unchunk(logp_NxBxC), unchunk(entropy_NxBxC)


def policy_forward(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array,
                   seg_BxT: jax.Array, temperature: float = 1.0,
                   replay_BxTxLxK: jax.Array | None = None) -> PolicyOutput:
  """Per-token log-probs and entropies of softmax(logits / temperature) at
  `tokens_BxT` (alignment: module docstring).

  `replay_BxTxLxK` (MoE router replay): each MoE layer l routes token t to the
  recorded experts replay[b, t, l] where they are recorded (>= 0), gated by this
  forward's router (`sao_jax.models.moe.route`); `router_logits` stay this forward's own.
  """
  shards = sequence.shards()
  h_BxTxD, router_logits = _trunk(params, cfg, "lm", tokens_BxT, seg_BxT, shards,
                                  replay_BxTxLxK)
  if tokens_BxT.shape[1] < 2:
    zeros_BxT = jnp.zeros(tokens_BxT.shape, jnp.float32)
    return PolicyOutput(zeros_BxT, zeros_BxT, router_logits)
  kernel_DxV = model(params, cfg, "lm").lm_kernel_DxV()
  if shards == 1:
    logp_BxT1, entropy_BxT1 = _chunked_logp_entropy(
        h_BxTxD[:, :-1], tokens_BxT[:, 1:], kernel_DxV, cfg.logits_chunk, temperature)
  else:
    logp_BxT1, entropy_BxT1 = _split_logp_entropy(h_BxTxD, tokens_BxT, kernel_DxV, cfg,
                                                  temperature, shards)
    router_logits = tuple(sequence.from_balanced(r, shards) for r in router_logits)
  return PolicyOutput(_shift_in(logp_BxT1, seg_BxT), _shift_in(entropy_BxT1, seg_BxT),
                      router_logits)


def _split_logp_entropy(h_BxTxD, tokens_BxT, kernel_DxV, cfg, temperature, shards):
  """`_chunked_logp_entropy` of balanced-order hidden states, each device over its
  own positions: position t scores the natural-order token t + 1 (a 0 target past
  the end, dropped), and the results return in natural order, [B, T - 1]."""
  next_BxT = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, 1)))
  axes = sequence.axes()
  split, split3 = PartitionSpec(None, axes), PartitionSpec(None, axes, None)
  logp_BxT, entropy_BxT = jax.shard_map(
      lambda h, tgt, kernel: _chunked_logp_entropy(h, tgt, kernel, cfg.logits_chunk,
                                                   temperature),
      mesh=jax.sharding.get_abstract_mesh(), in_specs=(split3, split, PartitionSpec()),
      out_specs=(split, split), axis_names=set(axes))(
          h_BxTxD, sequence.to_balanced(next_BxT, shards), kernel_DxV)
  return (sequence.from_balanced(logp_BxT, shards)[:, :-1],
          sequence.from_balanced(entropy_BxT, shards)[:, :-1])


def value_forward(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array,
                  seg_BxT: jax.Array) -> jax.Array:
  """values_BxT[b, t] = V(x[:t]) in float32 (alignment: module docstring)."""
  shards = sequence.shards()
  h_BxTxD, _ = _trunk(params, cfg, "value", tokens_BxT, seg_BxT, shards)
  head = params["value_head"]
  values_BxT = (jnp.einsum("btd,d->bt", h_BxTxD, head["kernel"].astype(h_BxTxD.dtype),
                           preferred_element_type=jnp.float32)
                + head["bias"].astype(jnp.float32))
  return _shift_in(sequence.from_balanced(values_BxT, shards)[:, :-1], seg_BxT)


def logits_forward(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array,
                   seg_BxT: jax.Array) -> jax.Array:
  """Full float32 logits_BxTxV at every position (logits[:, t] predicts token t+1
  of the same segment).

  Materialises [B, T, V]: for tests and evaluation, not for training.
  """
  shards = sequence.shards()
  h_BxTxD, _ = _trunk(params, cfg, "lm", tokens_BxT, seg_BxT, shards)
  kernel_DxV = model(params, cfg, "lm").lm_kernel_DxV()
  return sequence.from_balanced(
      jnp.einsum("btd,dv->btv", h_BxTxD, kernel_DxV, preferred_element_type=jnp.float32), shards)


def router_balance(router_logits: tuple[jax.Array, ...], seg_BxT: jax.Array,
                   cfg: ModelConfig) -> jax.Array:
  """Mean over MoE layers of E * sum_e f_e * P_e (1.0 when perfectly balanced).

  f_e: fraction of real tokens' top-k slots routed to expert e; P_e: mean router
  probability of expert e over real tokens. 0.0 for a dense model.
  """
  if not router_logits:
    return jnp.zeros((), jnp.float32)
  w_BxT = (seg_BxT != 0).astype(jnp.float32)
  n = jnp.maximum(jnp.sum(w_BxT), 1.0)
  e, k = cfg.num_experts, cfg.num_experts_per_tok
  per_layer = []
  for logits_BxTxE in router_logits:
    probs_BxTxE = jax.nn.softmax(logits_BxTxE, axis=-1)
    _, expert_BxTxk = jax.lax.top_k(probs_BxTxE, k)
    counts_BxTxE = jnp.sum(jax.nn.one_hot(expert_BxTxk, e), axis=2)
    f_E = jnp.einsum("bte,bt->e", counts_BxTxE, w_BxT) / (n * k)
    p_E = jnp.einsum("bte,bt->e", probs_BxTxE, w_BxT) / n
    per_layer.append(e * jnp.sum(f_E * p_E))
  return jnp.mean(jnp.stack(per_layer))
