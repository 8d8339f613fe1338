"""Incremental decoding with a per-row KV cache.

  init_cache(cfg, batch, max_len)                    -> KVCache (empty)
  extend(params, cfg, cache, tokens_BxC, mask_BxC)   -> (logits_BxV, cache)
  extend_routed(...same)                             -> (logits_BxV, cache, experts_BxCxLxK)
  decode_step(params, cfg, cache, tokens_B)          -> (logits_BxV, cache)
  truncate(cache, length_B)                          -> KVCache with rows cut back

Layout: each row is compact. Row b holds its first `length_B[b]` real tokens in
slots [0, length_B[b]), token i in slot i, so a token's slot is also its RoPE
position and a row's write index, valid range and position counter are the one
number `length_B[b]`. Rows are independent: every row has its own length, and
a row is reset (or rolled back after sampling past a stop) by lowering its
length with `truncate`; slots at or beyond the length are never read, so they
need no clearing.

`extend` appends a chunk of C tokens to every row: a prompt prefill, an
observation appended mid-sequence in a multi-turn episode (chunked prefill), or
one sampled token (`decode_step`, C = 1). `mask_BxC` marks the real tokens of
each row's chunk; padding may sit anywhere in the chunk (rows whose chunks differ
in length are left- or right-padded, and a row with no real token is left
untouched). The j-th real token of row b goes to slot length_B[b] + j and attends
to slots [0, length_B[b] + j], so the cache reproduces the full forward of the
unpadded sequence exactly. Padding tokens are written nowhere (their scatter
index is out of range and dropped).

The returned logits (float32) are those after each row's last real token of the
chunk, i.e. the distribution of the row's next token; for a row with no real
token in the chunk they are meaningless. Callers jit these functions with `cfg`
static and must keep length_B + (real tokens) <= max_len: writes past the end
are dropped, so the excess tokens would be silently missing from the context.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sao_jax.config import ModelConfig
from sao_jax.models import moe
from sao_jax.models.transformer import Params, model


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  k: tuple[jax.Array, ...]   # per layer [B, K, S, H], compute dtype
  v: tuple[jax.Array, ...]   # per layer [B, K, S, H]
  length_B: jax.Array        # int32: real tokens held by each row (= next write slot and position)


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> KVCache:
  """An empty cache for `batch` rows of up to `max_len` slots each."""
  if batch <= 0 or max_len <= 0:
    raise ValueError(f"init_cache: batch={batch}, max_len={max_len}; both must be positive")
  shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
  zeros = lambda: tuple(jnp.zeros(shape, cfg.compute_dtype) for _ in range(cfg.num_hidden_layers))
  return KVCache(k=zeros(), v=zeros(), length_B=jnp.zeros((batch,), jnp.int32))


def truncate(cache: KVCache, length_B: jax.Array) -> KVCache:
  """Keeps the first length_B[b] tokens of row b (0 resets the row); never lengthens."""
  return dataclasses.replace(cache, length_B=jnp.minimum(cache.length_B, length_B.astype(jnp.int32)))


def extend(params: Params, cfg: ModelConfig, cache: KVCache, tokens_BxC: jax.Array,
           mask_BxC: jax.Array) -> tuple[jax.Array, KVCache]:
  """Appends each row's real chunk tokens; returns next-token logits_BxV and the new cache."""
  return extend_routed(params, cfg, cache, tokens_BxC, mask_BxC)[:2]


def extend_routed(params: Params, cfg: ModelConfig, cache: KVCache, tokens_BxC: jax.Array,
                  mask_BxC: jax.Array) -> tuple[jax.Array, KVCache, jax.Array | None]:
  """`extend`, plus the experts each chunk token was routed to in each MoE layer
  ([B, C, L, k], `moe.routed_experts`; None for a dense model)."""
  mask_BxC = mask_BxC.astype(bool)
  c = tokens_BxC.shape[1]
  s = cache.k[0].shape[2]
  rank_BxC = jnp.cumsum(mask_BxC, axis=1, dtype=jnp.int32) - 1  # index among the chunk's real tokens
  # Query slot (= position) of each chunk token; a padding token borrows its predecessor's.
  pos_BxC = cache.length_B[:, None] + jnp.maximum(rank_BxC, 0)
  slot_BxC = jnp.where(mask_BxC, cache.length_B[:, None] + rank_BxC, s)  # s: dropped
  visible_BxCxS = (jnp.arange(s, dtype=jnp.int32)[None, None, :]
                   <= (cache.length_B[:, None] + rank_BxC)[:, :, None])
  kv = [(k, v, slot_BxC) for k, v in zip(cache.k, cache.v)]
  net = model(params, cfg, "lm")
  h_BxCxD, new_kv, router_logits = net.trunk(tokens_BxC, pos_BxC, visible_BxCxS, kv)
  last_B = jnp.maximum(c - 1 - jnp.argmax(mask_BxC[:, ::-1], axis=1), 0)
  h_BxD = jnp.take_along_axis(h_BxCxD, last_B[:, None, None], axis=1)[:, 0]
  logits_BxV = jnp.einsum("bd,dv->bv", h_BxD, net.lm_kernel_DxV(), preferred_element_type=jnp.float32)
  new_cache = KVCache(k=tuple(k for k, _ in new_kv), v=tuple(v for _, v in new_kv),
                      length_B=cache.length_B + jnp.sum(mask_BxC, axis=1, dtype=jnp.int32))
  experts = moe.routed_experts(router_logits, cfg.num_experts_per_tok, cfg.num_experts)
  return logits_BxV, new_cache, experts


def decode_step(params: Params, cfg: ModelConfig, cache: KVCache,
                tokens_B: jax.Array) -> tuple[jax.Array, KVCache]:
  """Appends one real token per row; returns the next-token logits_BxV."""
  tokens_Bx1 = tokens_B[:, None]
  return extend(params, cfg, cache, tokens_Bx1, jnp.ones(tokens_Bx1.shape, bool))
