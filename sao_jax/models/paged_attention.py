"""Ragged paged attention in pure JAX: queries of B rows against the pages they own.

  PagedLayer(kv_pages, write_BxC, pos_BxC, row_L, page_L, first_L).attend(q, k, v, window)
      -> (out_BxTxNxH, PagedLayer with the chunk's keys/values written)
  ragged_attention(q_BxTxNxH, kv_pages, pos_BxT, row_L, page_L, first_L, window)
      -> out_BxTxNxH
  gathered_attention(q_BxTxNxH, kv_pages, pos_BxT, table_BxM, window)
      -> out_BxTxNxH

A pool is [P, page, 2K, H], key head k at combined head 2k and value head k at
2k + 1 (`sao_jax.models.paged`). The call lists L entries e = (row_L[e],
page_L[e], first_L[e]): row row_L[e] may read pool page page_L[e], whose token
at offset j sits at position first_L[e] + j of that row's sequence (row_L[e] == B marks an
unused entry). With s_e = q k^T / sqrt(H) for the row's queries against the
entry's keys (float32), masked where the key position exceeds the query's
position (or, with a sliding `window` W, is not above query position - W),
the softmax over a row's keys is assembled across its entries exactly by
segment reductions over the row id:

    m_b   = max_{e in b} max_j s_e[j]
    l_b   = sum_{e in b} sum_j exp(s_e[j] - m_b)
    out_b = (sum_{e in b} sum_j exp(s_e[j] - m_b) v_e[j]) / l_b

Cost is that of the listed pages, and the result equals the dense softmax of
`sao_jax.models.attention` up to float summation order. A query with no
visible key (padding) gets 0.

`gathered_attention` is the same softmax when the entries are whole page
tables (prefill: each row's M columns): the pages are gathered into
[B, M * page] keys and one plain masked softmax runs per row, no segment
reductions (which lower to scatters, slow on CPU). `PagedLayer` uses it when
given `table_BxM` alone. Given `table_BxM`, `kv_len_B` and `query_BxC`
(prefill or decode) it runs jax's Pallas TPU kernel instead
(`sao_jax.models.paged_kernel`), which streams the pages rather than gathering
them. On a mesh `PagedLayer.attend` runs the write and whichever path per
device on its page shard (`sao_jax.models.paged_mesh`): entries, tables and
write positions then hold page ids local to the shard. Kept free of model
imports so that `sao_jax.models.layers` can dispatch to it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sao_jax.models.paged_kernel import kernel_attention
from sao_jax.models.paged_mesh import on_page_shards

_MASKED = -1e30  # finite, as in sao_jax.models.attention: exp(_MASKED - m) underflows to 0


class PagedLayer(NamedTuple):
  """One layer's pools plus the call's write and read plan; `attend` is what
  `sao_jax.models.layers.Attention` runs in place of the dense cache update."""

  kv_pages: jax.Array   # [P, page, 2K, H]: k at even, v at odd combined heads
  write_BxC: jax.Array  # pool position page * size + offset per new token; P * size drops
  pos_BxC: jax.Array    # query positions
  row_L: jax.Array      # entry -> row in [0, B]; B marks an unused entry
  page_L: jax.Array     # entry -> pool page (0 where unused; masked)
  first_L: jax.Array    # entry -> position of the page's first token
  table_BxM: jax.Array | None = None  # whole page tables: attend with gathered_attention
  kv_len_B: jax.Array | None = None   # with table_BxM: the Pallas kernel over kv_len_B keys,
  query_BxC: jax.Array | None = None  # for the tokens query_BxC marks (paged_kernel)

  def attend(self, q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, window: int | None = None):
    """Writes the chunk's keys/values, then ragged attention over the entries (a
    sliding-window layer passes its `window`; its pages stay allocated). On a mesh
    each device does both for its page shard's rows with its block of the pool
    (`paged_mesh.on_page_shards`)."""
    local = lambda rows, heads, kv_pages: rows._replace(kv_pages=kv_pages)._attend_here(
        *heads, window)
    out, kv_pages = on_page_shards(local, self._replace(kv_pages=None),
                                   (q_BxTxNxH, k_BxTxKxH, v_BxTxKxH), self.kv_pages)
    return out, self._replace(kv_pages=kv_pages)

  def _attend_here(self, q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, window):
    """`attend` on whole arrays (one device, or one device's blocks)."""
    _, size, kv2, h = self.kv_pages.shape
    write = self.write_BxC.reshape(-1)
    page, offset = write // size, write % size  # pages past the pool (padding) are dropped
    # [B*T, K, 2, H] -> [B*T, 2K, H]: k_k at combined head 2k, v_k at 2k + 1.
    kv_new = jnp.stack([k_BxTxKxH, v_BxTxKxH], axis=-2).reshape(-1, kv2, h)
    kv_pages = self.kv_pages.at[page, offset].set(kv_new.astype(self.kv_pages.dtype), mode="drop")
    if self.kv_len_B is not None:
      out = kernel_attention(q_BxTxNxH, kv_pages, self.query_BxC, self.kv_len_B, self.table_BxM,
                             window)
    elif self.table_BxM is not None:
      out = gathered_attention(q_BxTxNxH, kv_pages, self.pos_BxC, self.table_BxM, window)
    else:
      out = ragged_attention(q_BxTxNxH, kv_pages, self.pos_BxC, self.row_L, self.page_L,
                             self.first_L, window)
    return out, kv_pages


def ragged_attention(q_BxTxNxH: jax.Array, kv_pages: jax.Array, pos_BxT: jax.Array,
                     row_L: jax.Array, page_L: jax.Array, first_L: jax.Array,
                     window: int | None = None) -> jax.Array:
  """softmax over each row's listed pages (module docstring), float32 scores."""
  b, t, n, h = q_BxTxNxH.shape
  size, kv = kv_pages.shape[1], kv_pages.shape[2] // 2
  g = n // kv
  dt = q_BxTxNxH.dtype
  valid_L = row_L < b
  q_LxTxKxGxH = q_BxTxNxH.reshape(b, t, kv, g, h).at[row_L].get(mode="fill", fill_value=0)
  kv_LxSx2KxH = kv_pages[page_L].astype(dt)
  k_LxSxKxH, v_LxSxKxH = kv_LxSx2KxH[:, :, 0::2], kv_LxSx2KxH[:, :, 1::2]
  s_LxKxGxTxS = jnp.einsum("ltkgh,lskh->lkgts", q_LxTxKxGxH, k_LxSxKxH,
                           preferred_element_type=jnp.float32) * (h ** -0.5)
  key_pos_LxS = first_L[:, None] + jnp.arange(size, dtype=jnp.int32)[None, :]
  qpos_LxT = pos_BxT.at[row_L].get(mode="fill", fill_value=-1)
  visible_LxTxS = valid_L[:, None, None] & (key_pos_LxS[:, None, :] <= qpos_LxT[:, :, None])
  if window is not None:
    visible_LxTxS = visible_LxTxS & (qpos_LxT[:, :, None] - key_pos_LxS[:, None, :] < window)
  s_LxKxGxTxS = jnp.where(visible_LxTxS[:, None, None], s_LxKxGxTxS, _MASKED)
  m_BxKxGxT = jax.ops.segment_max(jnp.max(s_LxKxGxTxS, axis=-1), row_L, num_segments=b)
  m_LxKxGxT = m_BxKxGxT.at[row_L].get(mode="fill", fill_value=0.0)
  p_LxKxGxTxS = jnp.where(visible_LxTxS[:, None, None],
                          jnp.exp(s_LxKxGxTxS - m_LxKxGxT[..., None]), 0.0)
  l_BxKxGxT = jax.ops.segment_sum(jnp.sum(p_LxKxGxTxS, axis=-1), row_L, num_segments=b)
  o_LxKxGxTxH = jnp.einsum("lkgts,lskh->lkgth", p_LxKxGxTxS.astype(dt), v_LxSxKxH,
                           preferred_element_type=jnp.float32)
  o_BxKxGxTxH = jax.ops.segment_sum(o_LxKxGxTxH, row_L, num_segments=b)
  out = o_BxKxGxTxH / jnp.where(l_BxKxGxT > 0, l_BxKxGxT, 1.0)[..., None]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(dt)


def gathered_attention(q_BxTxNxH: jax.Array, kv_pages: jax.Array, pos_BxT: jax.Array,
                       table_BxM: jax.Array, window: int | None = None) -> jax.Array:
  """softmax over each row's page table, gathered to [B, M * page] keys (-1: no page)."""
  b, t, n, h = q_BxTxNxH.shape
  size, kv = kv_pages.shape[1], kv_pages.shape[2] // 2
  m = table_BxM.shape[1]
  g = n // kv
  dt = q_BxTxNxH.dtype
  # [B, M, page, 2K, H] -> [B, M * page, 2K, H]: one row's keys and values in position order.
  kv_BxSx2KxH = kv_pages[jnp.maximum(table_BxM, 0)].reshape(b, m * size, 2 * kv, h).astype(dt)
  k_BxSxKxH, v_BxSxKxH = kv_BxSx2KxH[:, :, 0::2], kv_BxSx2KxH[:, :, 1::2]
  s_BxKxGxTxS = jnp.einsum("btkgh,bskh->bkgts", q_BxTxNxH.reshape(b, t, kv, g, h), k_BxSxKxH,
                           preferred_element_type=jnp.float32) * (h ** -0.5)
  allocated_BxS = jnp.repeat(table_BxM >= 0, size, axis=1)
  key_pos_S = jnp.arange(m * size, dtype=jnp.int32)
  visible_BxTxS = allocated_BxS[:, None, :] & (key_pos_S[None, None, :] <= pos_BxT[:, :, None])
  if window is not None:
    visible_BxTxS = visible_BxTxS & (pos_BxT[:, :, None] - key_pos_S[None, None, :] < window)
  s_BxKxGxTxS = jnp.where(visible_BxTxS[:, None, None], s_BxKxGxTxS, _MASKED)
  p_BxKxGxTxS = jnp.where(visible_BxTxS[:, None, None], jax.nn.softmax(s_BxKxGxTxS, axis=-1), 0.0)
  out_BxKxGxTxH = jnp.einsum("bkgts,bskh->bkgth", p_BxKxGxTxS.astype(dt), v_BxSxKxH,
                             preferred_element_type=jnp.float32)
  return out_BxKxGxTxH.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(dt)
