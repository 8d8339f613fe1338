"""Incremental decoding with a paged KV cache: a pool of fixed-size pages per layer.

  init_paged_cache(cfg, num_pages, page_size, slots)        -> PagedKVCache (empty)
  extend_paged(params, cfg, cache, pages_NxM, rows_B, tokens_BxC, mask_BxC, entries, kernel)
                                                            -> (logits_BxV, cache)
  extend_paged_routed(...same)               -> (logits_BxV, cache, experts_BxCxLxK)
  set_lengths(cache, rows_B, length_B)                      -> cache whose rows hold length_B

Layout. Layer l keeps one pool kv [P, page, 2K, H]: P pages of `page` token
positions each, key head k at combined head 2k and value head k at 2k + 1, the
layout of jax's Pallas TPU kernel (`jax.experimental.pallas.ops.tpu.
ragged_paged_attention`), which streams a page's keys and values in one DMA.
Slot n owns the pages listed in its page table pages_NxM[n]
(the host's, `sao_jax.sampler.pages`; -1 = no page): token i of slot n lives in
page pages_NxM[n, i // page] at offset i % page, and its RoPE position is i.
`length_N[n]` is the number of real tokens slot n holds, as in `decode.KVCache`.

`extend_paged` appends a chunk of C tokens to each of B rows, row b being slot
rows_B[b] (a row id >= N is padding: it reads nothing and writes nothing).
On a mesh whose batch axes split the pool into D page shards
(`sao_jax.models.paged_mesh`) page ids in pages_NxM are local to the slot's
shard, and the B rows are D blocks of B / D, block d holding slots of shard d
(or padding) only: each device attends and writes for its block. The
j-th real token of row b is written at position length + j and attends to
positions [0, length + j] of its slot, exactly as `decode.extend` does for a
dense row; padding tokens are written nowhere.

Attention reads only pages some row owns (`sao_jax.models.paged_attention`).
With `entries=None` (prefill) each row reads its whole page table
(`gathered_attention`, like a dense row); otherwise the (row, page-table
column) pairs in use are its L = `entries` entries, the first allocated
columns of the table in row-major order (decode over all N slots; the host
guarantees at most `entries` are allocated, e.g. the pool size P when no page
is shared), so a decode step reads the pages in use, not N x max_seq_len
positions. With D page shards `entries` counts per shard (each block of rows
lists its own, row ids local to the block; e.g. P / D). With `kernel`
(prefill or decode) the Pallas TPU kernel reads them instead
(`sao_jax.models.paged_kernel`), `entries` unused: row b's first length + n_b
positions (n_b real chunk tokens) through its page table, its real tokens the
queries, where every one of them has a page (the host allocates a chunk's
pages before the call; a row that lacks one gets 0).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sao_jax.config import ModelConfig
from sao_jax.models import moe
from sao_jax.models.paged_attention import PagedLayer
from sao_jax.models.paged_mesh import traced_page_shards
from sao_jax.models.transformer import Params, model


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
  kv: tuple[jax.Array, ...]  # per layer [P, page, 2K, H], compute dtype; k even, v odd heads
  length_N: jax.Array        # int32: real tokens held by each slot


def init_paged_cache(cfg: ModelConfig, num_pages: int, page_size: int, slots: int) -> PagedKVCache:
  """An empty pool of `num_pages` pages of `page_size` positions, lengths for `slots` slots."""
  if min(num_pages, page_size, slots) <= 0:
    raise ValueError(f"init_paged_cache: num_pages={num_pages}, page_size={page_size}, "
                     f"slots={slots}; all must be positive")
  shape = (num_pages, page_size, 2 * cfg.num_key_value_heads, cfg.head_dim)
  kv = tuple(jnp.zeros(shape, cfg.compute_dtype) for _ in range(cfg.num_hidden_layers))
  return PagedKVCache(kv=kv, length_N=jnp.zeros((slots,), jnp.int32))


def set_lengths(cache: PagedKVCache, rows_B: jax.Array, length_B: jax.Array) -> PagedKVCache:
  """Slot rows_B[b] holds its first length_B[b] tokens (rows >= N ignored). Unlike the
  dense `decode.truncate` this may lengthen: a slot that takes shared prompt pages
  (`sao_jax.sampler.pages`) holds their tokens without having written them."""
  return dataclasses.replace(
      cache, length_N=cache.length_N.at[rows_B].set(length_B.astype(jnp.int32), mode="drop"))


def _entry_columns(table_BxM: jax.Array, count: int, shards: int):
  """`_block_entries` of each of the table's `shards` row blocks: [shards * count] each,
  row ids local to their block."""
  b, m = table_BxM.shape
  blocks = jax.vmap(lambda table: _block_entries(table, count))(
      table_BxM.reshape(shards, b // shards, m))
  return tuple(x.reshape(-1) for x in blocks)


def _block_entries(table_BxM: jax.Array, count: int):
  """(row_L, page_L, column_L): the table's first `count` allocated columns, row-major;
  unused entries get row B, page 0."""
  b, m = table_BxM.shape
  allocated = (table_BxM >= 0).reshape(-1)
  (index_L,) = jnp.nonzero(allocated, size=count, fill_value=b * m)
  index_L = index_L.astype(jnp.int32)
  page_L = table_BxM.reshape(-1).at[index_L].get(mode="fill", fill_value=0)
  return index_L // m, jnp.maximum(page_L, 0), index_L % m


def extend_paged(params: Params, cfg: ModelConfig, cache: PagedKVCache, pages_NxM: jax.Array,
                 rows_B: jax.Array, tokens_BxC: jax.Array, mask_BxC: jax.Array,
                 entries: int | None = None, kernel: bool = False
                 ) -> tuple[jax.Array, PagedKVCache]:
  """Appends each row's real chunk tokens; returns next-token logits_BxV (float32) and the cache."""
  return extend_paged_routed(params, cfg, cache, pages_NxM, rows_B, tokens_BxC, mask_BxC,
                             entries, kernel)[:2]


def extend_paged_routed(params: Params, cfg: ModelConfig, cache: PagedKVCache,
                        pages_NxM: jax.Array, rows_B: jax.Array, tokens_BxC: jax.Array,
                        mask_BxC: jax.Array, entries: int | None = None, kernel: bool = False
                        ) -> tuple[jax.Array, PagedKVCache, jax.Array | None]:
  """`extend_paged`, plus the experts each chunk token was routed to in each MoE layer
  ([B, C, L, k], `moe.routed_experts`; None for a dense model)."""
  p, size, _, _ = cache.kv[0].shape
  m = pages_NxM.shape[1]
  shards = traced_page_shards()
  if rows_B.shape[0] % shards:
    raise ValueError(f"extend_paged: {rows_B.shape[0]} rows do not split into the {shards} page "
                     "shards of the mesh's batch axes; pass a multiple of them (D blocks of rows)")
  mask_BxC = mask_BxC.astype(bool)
  c = tokens_BxC.shape[1]
  table_BxM = pages_NxM.at[rows_B].get(mode="fill", fill_value=-1)
  length_B = cache.length_N.at[rows_B].get(mode="fill", fill_value=0)
  rank_BxC = jnp.cumsum(mask_BxC, axis=1, dtype=jnp.int32) - 1
  pos_BxC = length_B[:, None] + jnp.maximum(rank_BxC, 0)
  column_BxC = jnp.minimum(pos_BxC // size, m - 1)
  page_BxC = jnp.take_along_axis(table_BxM, column_BxC, axis=1)
  writable_BxC = mask_BxC & (page_BxC >= 0) & (pos_BxC < m * size)
  # Past every page of the pool, local (a shard's) or whole: dropped.
  write_BxC = jnp.where(writable_BxC, page_BxC * size + pos_BxC % size, p * size)
  added_B = jnp.sum(mask_BxC, axis=1, dtype=jnp.int32)
  if kernel:
    # The kernel reads positions [0, length + added) through the table: a row some of
    # whose real tokens have no page (never sent by the host) gets 0, as a padding row.
    whole_B = jnp.all(writable_BxC == mask_BxC, axis=1)
    plan = dict(row_L=None, page_L=None, first_L=None, table_BxM=table_BxM,
                kv_len_B=jnp.where(whole_B, length_B + added_B, 0),
                query_BxC=mask_BxC & whole_B[:, None])
  elif entries is None:  # whole tables: gathered attention, no entry list
    plan = dict(row_L=None, page_L=None, first_L=None, table_BxM=table_BxM)
  else:
    row_L, page_L, column_L = _entry_columns(table_BxM, entries, shards)
    plan = dict(row_L=row_L, page_L=page_L, first_L=column_L * size)
  layer_caches = [PagedLayer(kv, write_BxC, pos_BxC, **plan) for kv in cache.kv]
  net = model(params, cfg, "lm")
  h_BxCxD, new_layers, router_logits = net.trunk(tokens_BxC, pos_BxC, None, layer_caches)
  last_B = jnp.maximum(c - 1 - jnp.argmax(mask_BxC[:, ::-1], axis=1), 0)
  h_BxD = jnp.take_along_axis(h_BxCxD, last_B[:, None, None], axis=1)[:, 0]
  logits_BxV = jnp.einsum("bd,dv->bv", h_BxD, net.lm_kernel_DxV(), preferred_element_type=jnp.float32)
  new_cache = PagedKVCache(kv=tuple(layer.kv_pages for layer in new_layers),
                           length_N=cache.length_N.at[rows_B].add(added_B, mode="drop"))
  experts = moe.routed_experts(router_logits, cfg.num_experts_per_tok, cfg.num_experts)
  return logits_BxV, new_cache, experts
