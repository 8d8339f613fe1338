"""Decoder building blocks in flax nnx: RMSNorm, GQA attention with RoPE, gated MLP, MoE.

Every parameter is an `nnx.Param` whose `logical_axes` metadata names its
dimensions; `sao_jax.sharding.rules` turns those names into mesh shardings.
Parameters are stored in `param_dtype` and cast to `compute_dtype` where used;
normalisation, softmax and RoPE run in float32 (as Hugging Face does).

Shape letters: B batch, T query length, S key length, D hidden, N query heads,
K kv heads, G = N // K query heads per kv head, H head_dim, F MLP width,
E experts, M routed (token, expert) pairs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax.config import ModelConfig
from sao_jax.config.families import FAMILIES
from sao_jax.models import attention, moe, paged_attention, rope
from sao_jax.sharding.rules import constrain

BTD = ("activation_batch", "activation_length", "activation_embed")


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], cfg: ModelConfig,
           init: str = "normal") -> nnx.Param:
  """A parameter initialised like HF: N(0, 0.02) kernels, ones for norm scales, zero biases."""
  dtype = jnp.dtype(cfg.param_dtype)
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    value = (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, logical_axes=axes)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2, -1) + eps) * scale, the normalisation in float32.

  Most families multiply in x's dtype by `scale` (initialised to 1); the Gemma 3
  block (`families.Family.gemma`) multiplies by (1 + scale) in float32 before
  casting back (scale initialised to 0), as transformers' Gemma3RMSNorm does.
  """

  def __init__(self, size: int, cfg: ModelConfig, rngs: nnx.Rngs, axis_name: str = "norm"):
    self.unit_offset = FAMILIES[cfg.family].gemma
    self.scale = param(rngs, (size,), (axis_name,), cfg,
                       init="zeros" if self.unit_offset else "ones")
    self.eps = cfg.rms_norm_eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    shape = (1,) * (x.ndim - 1) + (-1,)
    if self.unit_offset:
      return (normed * (1.0 + self.scale[...].astype(jnp.float32).reshape(shape))).astype(x.dtype)
    return self.scale[...].astype(x.dtype).reshape(shape) * normed.astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query attention with RoPE:

    q = x W_q (+ b_q), k = x W_k (+ b_k), v = x W_v (+ b_v)   biases: family.qkv_bias
    q, k = RMSNorm(q), RMSNorm(k) per head                    family.qk_norm
    out = softmax(rope(q) rope(k)^T / sqrt(s) + mask) v W_o,  query head n reads kv head n // G,

  s = cfg.query_pre_attn_scalar, or H when None (the attention cores divide by
  sqrt(H), so q is multiplied by sqrt(H / s) first). Layer `index` is a
  sliding-window layer when `cfg.sliding_layer(index)`: the mask also hides keys
  `sliding_window` or more positions back, in every path (full sequence, dense
  cache, paged cache), and RoPE is `rope.layer_frequencies`.
  """

  def __init__(self, cfg: ModelConfig, index: int, rngs: nnx.Rngs):
    d, n, k, h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    family = FAMILIES[cfg.family]
    self.q_proj = param(rngs, (d, n, h), ("embed", "heads", "head_dim"), cfg)
    self.k_proj = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), cfg)
    self.v_proj = param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), cfg)
    self.o_proj = param(rngs, (n, h, d), ("heads", "head_dim", "embed"), cfg)
    if family.qkv_bias:
      self.q_bias = param(rngs, (n, h), ("heads", "head_dim"), cfg, init="zeros")
      self.k_bias = param(rngs, (k, h), ("kv_heads", "head_dim"), cfg, init="zeros")
      self.v_bias = param(rngs, (k, h), ("kv_heads", "head_dim"), cfg, init="zeros")
    if family.qk_norm:
      self.q_norm = RMSNorm(h, cfg, rngs, axis_name="head_dim")
      self.k_norm = RMSNorm(h, cfg, rngs, axis_name="head_dim")
    self.family = family
    self.cfg = cfg
    self.index = index
    self.window = cfg.sliding_window if cfg.sliding_layer(index) else None

  def __call__(self, x_BxTxD: jax.Array, pos_BxT: jax.Array, visible_BxTxS: jax.Array,
               kv_cache: tuple[jax.Array, jax.Array, jax.Array] | None
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """Attends from the T new positions to S keys.

    Without a cache S == T (the new positions themselves). With
    `kv_cache = (k_BxKxSxH, v_BxKxSxH, slot_BxT)` the new key/value of token t
    of row b is written at cache slot slot_BxT[b, t] first (an index >= S, used
    for padding, writes nothing) and the updated cache is returned.
    `visible_BxTxS[b, t, s]` says whether query t may read key s; it is either
    that [B, T, S] bool array or an `attention.CausalMask` (no cache, S == T).
    A `paged_attention.PagedLayer` cache (the paged engine) writes and reads
    its page pools itself and ignores `visible_BxTxS`.
    """
    cfg, dt = self.cfg, x_BxTxD.dtype
    q_BxTxNxH = jnp.einsum("btd,dnh->btnh", x_BxTxD, self.q_proj[...].astype(dt))
    k_BxTxKxH = jnp.einsum("btd,dkh->btkh", x_BxTxD, self.k_proj[...].astype(dt))
    v_BxTxKxH = jnp.einsum("btd,dkh->btkh", x_BxTxD, self.v_proj[...].astype(dt))
    if self.family.qkv_bias:
      q_BxTxNxH = q_BxTxNxH + self.q_bias[...].astype(dt)[None, None]
      k_BxTxKxH = k_BxTxKxH + self.k_bias[...].astype(dt)[None, None]
      v_BxTxKxH = v_BxTxKxH + self.v_bias[...].astype(dt)[None, None]
    if self.family.qk_norm:
      q_BxTxNxH, k_BxTxKxH = self.q_norm(q_BxTxNxH), self.k_norm(k_BxTxKxH)
    inv_freq_h, scaling = rope.layer_frequencies(cfg, self.index)
    q_BxTxNxH = rope.apply(q_BxTxNxH, pos_BxT, inv_freq_h, scaling)
    k_BxTxKxH = rope.apply(k_BxTxKxH, pos_BxT, inv_freq_h, scaling)
    if cfg.query_pre_attn_scalar is not None:
      q_BxTxNxH = q_BxTxNxH * jnp.asarray((cfg.head_dim / cfg.query_pre_attn_scalar) ** 0.5, dt)
    q_BxTxNxH = constrain(q_BxTxNxH, ("activation_batch", "activation_length",
                                      "activation_heads", "head_dim"))
    if isinstance(kv_cache, paged_attention.PagedLayer):  # the paged engine's pools
      out_BxTxNxH, new_cache = kv_cache.attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, self.window)
    elif kv_cache is not None:
      k_cache, v_cache, slot_BxT = kv_cache
      row_Bx1 = jnp.arange(slot_BxT.shape[0])[:, None]
      # The cache is [B, K, S, H]: (b, k) lead, so both attention contractions read it
      # in place. In [B, S, K, H] XLA re-lays-out the whole cache every decode step.
      k_BxKxSxH = k_cache.at[row_Bx1, :, slot_BxT].set(k_BxTxKxH.astype(k_cache.dtype), mode="drop")
      v_BxKxSxH = v_cache.at[row_Bx1, :, slot_BxT].set(v_BxTxKxH.astype(v_cache.dtype), mode="drop")
      if self.window is not None:  # a dense cache holds token i in slot i: slot = position
        slots_S = jnp.arange(k_BxKxSxH.shape[2], dtype=jnp.int32)
        visible_BxTxS = visible_BxTxS & (pos_BxT[:, :, None] - slots_S[None, None, :] < self.window)
      out_BxTxNxH = attention.cached_attention(q_BxTxNxH, k_BxKxSxH.astype(dt),
                                               v_BxKxSxH.astype(dt), visible_BxTxS)
      new_cache = (k_BxKxSxH, v_BxKxSxH)
    else:
      # A CausalMask runs cfg.attention_impl (sao_jax.models.attention).
      if isinstance(visible_BxTxS, attention.CausalMask):
        visible_BxTxS = visible_BxTxS.windowed(self.window)
      elif self.window is not None:  # keys are the queries' own tokens: same positions
        visible_BxTxS = visible_BxTxS & (pos_BxT[:, :, None] - pos_BxT[:, None, :] < self.window)
      out_BxTxNxH = attention.attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, visible_BxTxS,
                                     cfg.attention_impl, cfg.attention_block)
      new_cache = None
    # One [B, T, N*H] x [N*H, D] matmul (a free reshape of o_proj): contracting (n, h)
    # as two dims made XLA CPU copy-transpose o_proj on every call.
    n, h, d = self.o_proj.shape
    out_BxTxD = jnp.einsum("btf,fd->btd", out_BxTxNxH.reshape(*out_BxTxNxH.shape[:2], n * h),
                           self.o_proj[...].astype(dt).reshape(n * h, d))
    return constrain(out_BxTxD, BTD), new_cache


# Gate activation of the MLP: SwiGLU, or GELU with the tanh approximation (Gemma 3,
# transformers' gelu_pytorch_tanh).
_GATE_ACTIVATIONS = {False: jax.nn.silu, True: lambda x: jax.nn.gelu(x, approximate=True)}


class MLP(nnx.Module):
  """Gated MLP: down(act(x W_gate) * (x W_up)), act = silu (SwiGLU), or tanh-approximated
  GELU for the Gemma 3 block."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = param(rngs, (d, f), ("embed", "mlp"), cfg)
    self.up_proj = param(rngs, (d, f), ("embed", "mlp"), cfg)
    self.down_proj = param(rngs, (f, d), ("mlp", "embed"), cfg)
    self.gemma = FAMILIES[cfg.family].gemma

  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    dt = x_BxTxD.dtype
    gate_BxTxF = x_BxTxD @ self.gate_proj[...].astype(dt)
    up_BxTxF = x_BxTxD @ self.up_proj[...].astype(dt)
    h_BxTxF = constrain(_GATE_ACTIVATIONS[self.gemma](gate_BxTxF) * up_BxTxF,
                        ("activation_batch", "activation_length", "activation_mlp"))
    return constrain(h_BxTxF @ self.down_proj[...].astype(dt), BTD)


class MoE(nnx.Module):
  """Top-k routed SwiGLU experts (Qwen3-MoE), dropless.

  p = softmax(x W_router) over E experts; the k largest p_e are kept and, with
  `norm_topk_prob`, renormalised to sum to one. y = sum_{e in topk} p_e * MLP_e(x).
  Routing is `sao_jax.models.moe.route` (also the sampler's record of the choice and
  the learner's router replay).
  The expert computation is `sao_jax.models.moe.expert_parallel_ffn`: sorted
  `ragged_dot`s (compute proportional to k, not E), expert-parallel under a mesh.
  """

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, f, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    self.router = param(rngs, (d, e), ("embed", "expert"), cfg)
    self.gate_proj = param(rngs, (e, d, f), ("expert", "embed", "mlp"), cfg)
    self.up_proj = param(rngs, (e, d, f), ("expert", "embed", "mlp"), cfg)
    self.down_proj = param(rngs, (e, f, d), ("expert", "mlp", "embed"), cfg)
    self.cfg = cfg

  def __call__(self, x_BxTxD: jax.Array, replay_BxTxK: jax.Array | None = None
               ) -> tuple[jax.Array, jax.Array]:
    """Returns (y_BxTxD, router_logits_BxTxE in float32). `replay_BxTxK`: recorded
    experts to use instead of the top k (router replay, `moe.route`)."""
    cfg, dt = self.cfg, x_BxTxD.dtype
    logits_BxTxE = (x_BxTxD @ self.router[...].astype(dt)).astype(jnp.float32)
    weight_BxTxK, expert_BxTxK = moe.route(logits_BxTxE, cfg.num_experts_per_tok,
                                           cfg.norm_topk_prob, replay_BxTxK)
    y_BxTxD = moe.expert_parallel_ffn(x_BxTxD, expert_BxTxK, weight_BxTxK, self.gate_proj[...],
                                      self.up_proj[...], self.down_proj[...])
    return constrain(y_BxTxD, BTD), logits_BxTxE
