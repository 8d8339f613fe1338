"""The attention core softmax(q k^T / sqrt(H) + mask) v: dense reference and blocked.

  CausalMask(segment_ids_BxS, positions_BxS=None, window=None)
                                                     causal within segments (and a sliding
                                                     window), never materialised
  visible_mask(mask, t)                              -> visible_BxTxS bool (materialised)
  dense_attention(q, k, v, visible_BxTxS)            -> out_BxTxNxH   (reference; decode path)
  blocked_attention(q, k, v, segment_ids_BxS, block) -> out_BxTxNxH   (training path, O(T) memory)
  chunk_attention(q, k, v, seg_q, seg_k, q_start, block)
                                                     -> out_BxCxNxH   (queries: C positions of the
                                                     keys' sequence from q_start; a device's chunk
                                                     under a sequence-split mesh)
  attend(q, k, v, mask, impl, block)                 -> out_BxTxNxH   (dispatch on impl and mask;
                                                     "splash"/"auto": sao_jax.models.splash)

Shapes: q_BxTxNxH, k/v_BxSxKxH with N = K * G (query head n reads kv head n // G).
`CausalMask` says query t may read key s iff s <= t and seg[b, s] == seg[b, t] != 0
(`sao_jax.segments`: 0 is padding, k >= 1 the row's k-th packed trajectory; a 0/1
padding mask is the one-segment case); it requires T == S (a whole sequence
attending to itself). With a `window` W (Gemma 3's local layers) query t also
needs pos[b, t] - pos[b, s] < W, positions counted within the segment
(`sao_jax.models.forward.positions`), as transformers' sliding-window mask
allows key index > query index - W on an unpadded sequence.

`blocked_attention` is flash attention in pure JAX: queries and keys are split
into blocks of `block` positions; for query block i it scans the key blocks j
keeping, per query row, the running max m, normaliser l and unnormalised output
acc (online softmax):

    s_ij = q_i k_j^T / sqrt(H)   (float32; -inf where not visible)
    m'   = max(m, rowmax(s_ij))
    l'   = exp(m - m') l + rowsum(exp(s_ij - m'))
    acc' = exp(m - m') acc + exp(s_ij - m') v_j
    out  = acc / l,  lse = m + log(l)

`chunk_attention` runs the same loops for C queries at positions q_start ..
q_start + C - 1 of an S-key sequence (s_ij's causal mask compares those positions);
`blocked_attention` is its q_start = 0, C = S case. Under a mesh whose sequence
axis splits T (`sao_jax.sharding.sequence`), a `CausalMask` and q, k, v are in
the balanced order there (`sao_jax.models.forward` puts them so) and `attend`
dispatches to `sao_jax.models.sequence_attention`, which runs `chunk_attention`
per device.

A block pair is skipped when it holds no visible pair in any row: entirely above
the causal diagonal, or no segment id in common (per row, the id ranges of the
two blocks do not overlap), which is what packing many short trajectories into
a long row buys in attention FLOPs. A `jax.custom_vjp`
recomputes p_ij = exp(s_ij - lse_i) in the backward pass (FlashAttention-2):

    D_i   = rowsum(dout_i * out_i)
    dv_j += p_ij^T dout_i,  ds_ij = p_ij * (dout_i v_j^T - D_i)
    dq_i += ds_ij k_j / sqrt(H),  dk_j += ds_ij^T q_i / sqrt(H)

so only out and lse ([B, T, N] float32) are saved: memory is O(T * block) per
head instead of the dense O(T * S) float32 scores.

Padding queries (segment id 0) read no key: dense gives a uniform average over
all S keys (a finite mask value, see `_MASKED`), blocked gives 0. Their outputs
only feed padding positions, which every consumer masks.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sao_jax.config.model import ATTENTION_IMPLS
from sao_jax.models import splash
from sao_jax.sharding import sequence

# Finite instead of -inf so that a fully masked query row (a padding position)
# softmaxes to a uniform distribution instead of NaN.
_MASKED = -1e30


class CausalMask(NamedTuple):
  """Query t may read key s iff s <= t and seg[b, s] == seg[b, t] != 0 (requires T == S),
  and, with a `window` W, pos[b, t] - pos[b, s] < W.

  `segment_ids_BxS`: int segment ids, 0 on padding (a bool padding mask works too).
  `positions_BxS`: each token's position in its segment; needed with a window.
  Under a mesh that splits sequences the arrays (and q, k, v) are in the balanced
  order of `sao_jax.sharding.sequence`; T == S and the rule above hold for the
  natural (unsplit) order.
  """

  segment_ids_BxS: jax.Array
  positions_BxS: jax.Array | None = None
  window: int | None = None

  def windowed(self, window: int | None) -> "CausalMask":
    """This mask restricted to a sliding window (None: unchanged)."""
    if window is None:
      return self
    if self.positions_BxS is None:
      raise ValueError(f"CausalMask: a sliding window ({window}) needs positions_BxS")
    return self._replace(window=window)


def _same_segment(seg_q_BxT: jax.Array, seg_k_BxS: jax.Array) -> jax.Array:
  """[B, T, S] bool: query and key carry the same nonzero segment id."""
  return (seg_q_BxT[:, :, None] == seg_k_BxS[:, None, :]) & (seg_q_BxT[:, :, None] != 0)


def _in_window(pos_q_BxT: jax.Array, pos_k_BxS: jax.Array, window: int | None) -> jax.Array:
  """[B, T, S] bool: pos_q - pos_k < window (all True without a window)."""
  if window is None:
    return jnp.ones((pos_q_BxT.shape[0], pos_q_BxT.shape[1], pos_k_BxS.shape[1]), bool)
  return (pos_q_BxT[:, :, None] - pos_k_BxS[:, None, :]) < window


def visible_mask(mask: jax.Array | CausalMask, t: int) -> jax.Array:
  """visible_BxTxS: `mask` itself if already materialised, else causal & same segment
  (& within the window)."""
  if not isinstance(mask, CausalMask):
    return mask
  seg_BxS = mask.segment_ids_BxS.astype(jnp.int32)
  causal_TxS = jnp.tril(jnp.ones((t, seg_BxS.shape[1]), bool))
  visible_BxTxS = causal_TxS[None, :, :] & _same_segment(seg_BxS[:, :t], seg_BxS)
  if mask.window is None:
    return visible_BxTxS
  pos_BxS = mask.positions_BxS.astype(jnp.int32)
  return visible_BxTxS & _in_window(pos_BxS[:, :t], pos_BxS, mask.window)


def dense_attention(q_BxTxNxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
                    visible_BxTxS: jax.Array) -> jax.Array:
  """softmax(q k^T / sqrt(H), masked) v with float32 scores [B, K, G, T, S]."""
  b, t, n, h = q_BxTxNxH.shape
  kv = k_BxSxKxH.shape[2]
  dt = q_BxTxNxH.dtype
  q_BxTxKxGxH = q_BxTxNxH.reshape(b, t, kv, n // kv, h)
  scores_BxKxGxTxS = jnp.einsum("btkgh,bskh->bkgts", q_BxTxKxGxH, k_BxSxKxH.astype(dt),
                                preferred_element_type=jnp.float32) * (h ** -0.5)
  scores_BxKxGxTxS = jnp.where(visible_BxTxS[:, None, None, :, :], scores_BxKxGxTxS, _MASKED)
  probs_BxKxGxTxS = jax.nn.softmax(scores_BxKxGxTxS, axis=-1).astype(dt)
  out_BxTxKxGxH = jnp.einsum("bkgts,bskh->btkgh", probs_BxKxGxTxS, v_BxSxKxH.astype(dt))
  return out_BxTxKxGxH.reshape(b, t, n, h)


def cached_attention(q_BxTxNxH: jax.Array, k_BxKxSxH: jax.Array, v_BxKxSxH: jax.Array,
                     visible_BxTxS: jax.Array) -> jax.Array:
  """`dense_attention` over a KV cache laid out [B, K, S, H] (decoding).

  With the batch dims (b, k) leading and H (scores) or S (values) the contracted
  minor dims, both matmuls read the cache where it lies; no per-step transpose.
  """
  b, t, n, h = q_BxTxNxH.shape
  kv = k_BxKxSxH.shape[1]
  q_BxKxGTxH = (q_BxTxNxH.reshape(b, t, kv, n // kv, h).transpose(0, 2, 3, 1, 4)
                .reshape(b, kv, (n // kv) * t, h))
  scores_BxKxGTxS = jnp.einsum("bkqh,bksh->bkqs", q_BxKxGTxH, k_BxKxSxH,
                               preferred_element_type=jnp.float32) * (h ** -0.5)
  g = n // kv
  visible_BxGTxS = jnp.tile(visible_BxTxS, (1, g, 1))  # row g * t + i is query i of group g
  scores_BxKxGTxS = jnp.where(visible_BxGTxS[:, None], scores_BxKxGTxS, _MASKED)
  probs_BxKxGTxS = jax.nn.softmax(scores_BxKxGTxS, axis=-1).astype(q_BxTxNxH.dtype)
  out_BxKxGTxH = jnp.einsum("bkqs,bksh->bkqh", probs_BxKxGTxS, v_BxKxSxH)
  return (out_BxKxGTxH.reshape(b, kv, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h))


def _blocks(x: jax.Array, nb: int, block: int) -> jax.Array:
  """[B, T, ...] -> [nb, B, block, ...], zero-padding T up to nb * block."""
  pad = nb * block - x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  return x.reshape(x.shape[0], nb, block, *x.shape[2:]).swapaxes(0, 1)


def _unblock(x: jax.Array, t: int) -> jax.Array:
  """[nb, B, block, ...] -> [B, t, ...]."""
  x = x.swapaxes(0, 1)
  return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :t]


def _scores(q_BxCxKxGxH, k_BxCxKxH, seg_q_BxC, seg_k_BxC, i, j, block, pos_q_BxC, pos_k_BxC,
            window, q_start):
  """Masked float32 scores s_ij [B, K, G, C, C] and visibility for blocks (i, j), query
  block i starting at sequence index q_start + i * block; the positions are None
  without a window."""
  h = q_BxCxKxGxH.shape[-1]
  s = jnp.einsum("bqkgh,bskh->bkgqs", q_BxCxKxGxH, k_BxCxKxH,
                 preferred_element_type=jnp.float32) * (h ** -0.5)
  q_pos_C = q_start + i * block + jnp.arange(block)
  k_pos_C = j * block + jnp.arange(block)
  visible_BxCxC = ((k_pos_C[None, :] <= q_pos_C[:, None])[None]
                   & _same_segment(seg_q_BxC, seg_k_BxC))
  if window is not None:
    visible_BxCxC = visible_BxCxC & _in_window(pos_q_BxC, pos_k_BxC, window)
  visible = visible_BxCxC[:, None, None]
  return jnp.where(visible, s, -jnp.inf), visible


def _needed(seg_q_N, seg_k_N, q_start, block):
  """[nq, nk] bool: block pair (i, j) may hold a visible pair in some row: the key
  block does not start after the query block's last index, and in some row the two
  blocks' nonzero id ranges [lo, hi] overlap (equal ids need overlapping ranges)."""
  big = jnp.iinfo(jnp.int32).max
  lo = lambda seg_N: jnp.min(jnp.where(seg_N != 0, seg_N, big), axis=2)  # big: no real token
  hi = lambda seg_N: jnp.max(seg_N, axis=2)  # 0: no real token
  overlap_NxN = jnp.any((lo(seg_q_N)[:, None, :] <= hi(seg_k_N)[None, :, :])
                        & (lo(seg_k_N)[None, :, :] <= hi(seg_q_N)[:, None, :]), axis=2)
  q_last_N = q_start + (jnp.arange(seg_q_N.shape[0]) + 1) * block - 1
  causal_NxN = jnp.arange(seg_k_N.shape[0])[None, :] * block <= q_last_N[:, None]
  return causal_NxN & overlap_NxN


def _forward(q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start, block, window):
  """Blocked forward; returns out [nb, B, C, K, G, H] (q dtype) and lse [nb, B, K, G, C]."""
  # Ties the segment ids to q/k/v. Under `lax.scan` over layers, JAX's partial
  # evaluation hoists computations that depend only on loop constants out of the
  # loop, and the segment ids are the same in every layer: the causal/segment
  # masks of all nb x nb block pairs were materialised up front as [nb, nb, B, K,
  # G, C, C] arrays (8 GiB each for a 32K-token row; the cause of
  # scan_layers' extra TPU memory). Through the barrier they count as per-layer.
  q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start = jax.lax.optimization_barrier(
      (q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start))
  nk = k_N.shape[0]
  dt = q_N.dtype
  needed_NxN = _needed(seg_q_N, seg_k_N, q_start, block)

  def query_block(args):
    q_BxCxKxGxH, seg_q_BxC, pos_q_BxC, i = args
    b, c, kv, g, h = q_BxCxKxGxH.shape
    # `full_like` of q: under a shard_map the carry then varies over the same mesh
    # axes as the blocks' updates (sao_jax.models.sequence_attention).
    like_q = lambda fill, shape: jax.lax.full_like(q_BxCxKxGxH, fill, jnp.float32, shape)
    init = (like_q(-jnp.inf, (b, kv, g, c)), like_q(0.0, (b, kv, g, c)),
            like_q(0.0, (b, kv, g, c, h)))

    def key_block(carry, xs):
      k_BxCxKxH, v_BxCxKxH, seg_k_BxC, pos_k_BxC, j = xs

      def update(carry):
        m, l, acc = carry
        s, _ = _scores(q_BxCxKxGxH, k_BxCxKxH, seg_q_BxC, seg_k_BxC, i, j, block, pos_q_BxC,
                       pos_k_BxC, window, q_start)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        # A row with nothing visible yet keeps m = -inf; shift by 0 there to avoid inf - inf.
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m - m_safe)
        l_new = alpha * l + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bkgqs,bskh->bkgqh", p.astype(dt), v_BxCxKxH,
                        preferred_element_type=jnp.float32)
        return m_new, l_new, alpha[..., None] * acc + pv

      return jax.lax.cond(needed_NxN[i, j], update, lambda c: c, carry), None

    (m, l, acc), _ = jax.lax.scan(key_block, init, (k_N, v_N, seg_k_N, pos_k_N, jnp.arange(nk)))
    has_key = l > 0
    out = acc / jnp.where(has_key, l, 1.0)[..., None]
    lse = jnp.where(has_key, m + jnp.log(jnp.where(has_key, l, 1.0)), 0.0)
    return jnp.einsum("bkgqh->bqkgh", out).astype(dt), lse

  return jax.lax.map(query_block, (q_N, seg_q_N, pos_q_N, jnp.arange(q_N.shape[0])))


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9))
def _flash(q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start, block, window):
  return _forward(q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start, block, window)[0]


def _flash_fwd(q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start, block, window):
  out_N, lse_N = _forward(q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start, block,
                          window)
  return out_N, (q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start, out_N, lse_N)


def _flash_bwd(block, window, residuals, dout_N):
  q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N, q_start, out_N, lse_N = residuals
  h = q_N.shape[-1]
  dt = q_N.dtype
  needed_NxN = _needed(seg_q_N, seg_k_N, q_start, block)
  # D_i = rowsum(dout_i * out_i), laid out like lse: [nb, B, K, G, C].
  delta_N = jnp.einsum("nbqkgh,nbqkgh->nbkgq", dout_N.astype(jnp.float32),
                       out_N.astype(jnp.float32))

  def key_block(dq_N, xs):
    k_BxCxKxH, v_BxCxKxH, seg_k_BxC, pos_k_BxC, j = xs
    zeros_kv = jnp.zeros_like(k_BxCxKxH, jnp.float32)  # `_like`: see _forward's carry

    def query_block(carry, ys):
      q_BxCxKxGxH, dout_BxCxKxGxH, lse, delta, seg_q_BxC, pos_q_BxC, i = ys

      def grads(carry):
        dk, dv = carry
        s, visible = _scores(q_BxCxKxGxH, k_BxCxKxH, seg_q_BxC, seg_k_BxC, i, j, block,
                             pos_q_BxC, pos_k_BxC, window, q_start)
        p = jnp.where(visible, jnp.exp(s - lse[..., None]), 0.0)
        dv = dv + jnp.einsum("bkgqs,bqkgh->bskh", p.astype(dt), dout_BxCxKxGxH,
                             preferred_element_type=jnp.float32)
        dp = jnp.einsum("bqkgh,bskh->bkgqs", dout_BxCxKxGxH, v_BxCxKxH,
                        preferred_element_type=jnp.float32)
        ds = (p * (dp - delta[..., None]) * (h ** -0.5)).astype(dt)
        dq = jnp.einsum("bkgqs,bskh->bqkgh", ds, k_BxCxKxH, preferred_element_type=jnp.float32)
        dk = dk + jnp.einsum("bkgqs,bqkgh->bskh", ds, q_BxCxKxGxH,
                             preferred_element_type=jnp.float32)
        return (dk, dv), dq

      def skip(carry):
        return carry, jnp.zeros_like(q_BxCxKxGxH, jnp.float32)

      return jax.lax.cond(needed_NxN[i, j], grads, skip, carry)

    (dk, dv), dq_parts_N = jax.lax.scan(
        query_block, (zeros_kv, zeros_kv),
        (q_N, dout_N, lse_N, delta_N, seg_q_N, pos_q_N, jnp.arange(q_N.shape[0])))
    return dq_N + dq_parts_N, (dk, dv)

  dq_N, (dk_N, dv_N) = jax.lax.scan(key_block, jnp.zeros_like(q_N, jnp.float32),
                                    (k_N, v_N, seg_k_N, pos_k_N, jnp.arange(k_N.shape[0])))
  return (dq_N.astype(dt), dk_N.astype(k_N.dtype), dv_N.astype(v_N.dtype), None, None, None,
          None, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def blocked_attention(q_BxTxNxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
                      segment_ids_BxS: jax.Array, block: int,
                      positions_BxS: jax.Array | None = None,
                      window: int | None = None) -> jax.Array:
  """Causal flash attention within segments (module docstring); T == S, any T
  (padded to blocks with id 0). With `window`, keys at least `window` positions
  (`positions_BxS`) before the query are masked too; such block pairs are still
  visited, since a hole of padding inside a segment makes index and position
  distances differ."""
  t = q_BxTxNxH.shape[1]
  if k_BxSxKxH.shape[1] != t:
    raise ValueError(f"blocked_attention: key length {k_BxSxKxH.shape[1]} != query length {t}; "
                     "the causal mask needs a sequence attending to itself (use dense_attention)")
  return chunk_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, segment_ids_BxS, segment_ids_BxS, 0,
                         block, positions_BxS, positions_BxS, window)


def chunk_attention(q_BxCxNxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
                    seg_q_BxC: jax.Array, seg_k_BxS: jax.Array, q_start: int | jax.Array,
                    block: int, pos_q_BxC: jax.Array | None = None,
                    pos_k_BxS: jax.Array | None = None, window: int | None = None) -> jax.Array:
  """Causal flash attention within segments of the C queries at sequence indices
  q_start .. q_start + C - 1 over all S keys of that sequence (module docstring);
  `q_start` may be traced (a device's chunk). Query c reads key s iff s <= q_start + c,
  the segment ids agree and are nonzero, and within a `window` of positions."""
  b, c, n, h = q_BxCxNxH.shape
  s = k_BxSxKxH.shape[1]
  if block <= 0:
    raise ValueError(f"blocked_attention: block={block} must be a positive number of positions")
  if window is not None and (pos_q_BxC is None or pos_k_BxS is None):
    raise ValueError(f"blocked_attention: a sliding window ({window}) needs positions_BxS")
  kv = k_BxSxKxH.shape[2]
  dt = q_BxCxNxH.dtype
  block = min(block, c)
  nq, nk = -(-c // block), -(-s // block)
  q_N = _blocks(q_BxCxNxH.reshape(b, c, kv, n // kv, h), nq, block)
  k_N = _blocks(k_BxSxKxH.astype(dt), nk, block)
  v_N = _blocks(v_BxSxKxH.astype(dt), nk, block)
  seg_q_N = _blocks(seg_q_BxC.astype(jnp.int32), nq, block)
  seg_k_N = _blocks(seg_k_BxS.astype(jnp.int32), nk, block)
  pos_q_N = None if window is None else _blocks(pos_q_BxC.astype(jnp.int32), nq, block)
  pos_k_N = None if window is None else _blocks(pos_k_BxS.astype(jnp.int32), nk, block)
  out_N = _flash(q_N, k_N, v_N, seg_q_N, seg_k_N, pos_q_N, pos_k_N,
                 jnp.asarray(q_start, jnp.int32), block, window)
  return _unblock(out_N, c).reshape(b, c, n, h)


def attend(q_BxTxNxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
           mask: jax.Array | CausalMask, impl: str, block: int) -> jax.Array:
  """For a `CausalMask`: `blocked_attention` when impl == "blocked", the Pallas splash
  kernel when impl is "splash" or "auto" and `splash.traced_choice` takes it (else
  blocked); otherwise the dense reference on the materialised mask (always for an
  explicit [B, T, S] mask: decode). Under a mesh that splits sequences a `CausalMask`
  runs `sequence_attention.attend` whatever the impl (the dense path would hold
  [T / S, T] scores per head on each device; splash refuses a split sequence)."""
  if impl not in ATTENTION_IMPLS:
    raise ValueError(f"attention impl={impl!r} is invalid: allowed values are {ATTENTION_IMPLS}")
  # Decided by the mesh, not a mask field: the mask is a pytree whose leaves are
  # traced under remat.
  if isinstance(mask, CausalMask) and sequence.shards() > 1:
    # Imported here: sequence_attention builds on this module's chunk_attention.
    from sao_jax.models import sequence_attention
    return sequence_attention.attend(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask, block)
  if impl in ("splash", "auto") and isinstance(mask, CausalMask):
    choice = splash.traced_choice(impl, block, q_BxTxNxH, k_BxSxKxH)
    if choice.impl == "splash":
      return splash.splash_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask.segment_ids_BxS,
                                     mask.window, choice.blocks)
    impl = choice.impl
  if impl == "blocked" and isinstance(mask, CausalMask):
    return blocked_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask.segment_ids_BxS, block,
                             mask.positions_BxS, mask.window)
  return dense_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, visible_mask(mask, q_BxTxNxH.shape[1]))
