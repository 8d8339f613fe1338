"""Decode attention through jax's Pallas TPU ragged paged attention kernel.

  kernel_attention(q_BxNxH, kv_pages, kv_len_B, table_BxM, window) -> out_BxNxH
  kernel_unsupported(num_heads, num_kv_heads, head_dim, dtype)    -> reason or None
  pool_head_axis(mesh_shape, num_kv_heads)                        -> mesh axis or None

`jax.experimental.pallas.ops.tpu.ragged_paged_attention` streams each
sequence's pages from HBM into VMEM by DMA, a block of pages at a time, and
keeps an online softmax (m, l, acc) per query: it holds a few blocks, where
the pure-JAX `paged_attention.ragged_attention` gathers every listed page into
temporaries (for the 8B config on a v5p host, 2.0 vs 6.8 GiB per chip: README,
paged KV cache). It reads the pool in the layout
`sao_jax.models.paged` keeps, [P, page, 2K, H] with k at even and v at odd
combined heads.

Row b (one query, at position kv_len_B[b] - 1 of its slot) attends to its
slot's positions [0, kv_len_B[b]) (with a sliding `window` W, those above
kv_len_B[b] - 1 - W), position i at page table_BxM[b, i // page], offset
i % page: for each head n with KV head k = n // (N / K), float32 scores

    s_i = q_n . k_{k,i} * H**-0.5,   out_n = sum_i softmax(s)_i v_{k,i},

the reference path's softmax up to float summation order. A row with
kv_len_B[b] == 0 (an inactive slot, padding) gets 0, as in the reference.

The kernel wants every sequence it is given to hold a key (block 0 of a
sequence is prefetched before its length is read), so rows with keys are
moved to the front and passed as its `num_seqs` sequences; the rest are past
`num_seqs`, not computed, and set to 0. On a mesh the kernel runs per device
under `shard_map`, heads split over `tensor` as the pool is
(`pool_head_axis`); rows, pages and positions are whole on
every device (the pool is not split over the batch axes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
from jax.sharding import PartitionSpec

from sao_jax.sharding.rules import logical_to_spec

# Off a TPU (interpret mode on CPU, sao-plan compiling for a TPU topology) the
# kernel's tuned block sizes are not reachable (it reads jax.devices()[0]);
# these sit in the range its v5/v6 tables choose for 16-token pages.
_PAGES_PER_BLOCK = 16
_QUERIES_PER_BLOCK = 32


def pool_head_axis(mesh_shape: dict[str, int], num_kv_heads: int):
  """The mesh axis a pool's combined-head axis splits over: that of the KV heads
  (`tensor`) where it divides K, so that each device holds whole (k, v) pairs and
  the query heads that read them; else None (whole)."""
  (axis,) = logical_to_spec(("activation_kv_heads",), (num_kv_heads,), mesh_shape, strict=False)
  return axis


def kernel_unsupported(num_heads: int, num_kv_heads: int, head_dim: int, dtype) -> str | None:
  """Why the kernel cannot run these attention shapes (None: it can)."""
  if head_dim % 128:
    # Its online-softmax update broadcasts [rows, 128] statistics over head_dim lanes.
    return f"head_dim={head_dim} is not a multiple of 128"
  try:
    rpa.get_min_heads_per_blk(num_heads, 2 * num_kv_heads, dtype, dtype)
  except ValueError as err:  # the combined head axis does not tile
    return f"{2 * num_kv_heads} combined kv heads: {err}"
  return None


def kernel_attention(q_BxNxH: jax.Array, kv_pages: jax.Array, kv_len_B: jax.Array,
                     table_BxM: jax.Array, window: int | None = None) -> jax.Array:
  """softmax over each row's first kv_len_B[b] positions (module docstring)."""
  mesh = jax.sharding.get_abstract_mesh()
  local = functools.partial(_kernel_rows, window=window)
  if mesh.empty:
    return local(q_BxNxH, kv_pages, kv_len_B, table_BxM)
  heads = pool_head_axis(dict(mesh.shape), kv_pages.shape[2] // 2)
  q_spec, pool_spec = PartitionSpec(None, heads, None), PartitionSpec(None, None, heads, None)
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(q_spec, pool_spec, PartitionSpec(), PartitionSpec()),
                       out_specs=q_spec, check_vma=False)(q_BxNxH, kv_pages, kv_len_B, table_BxM)


def _kernel_rows(q_BxNxH, kv_pages, kv_len_B, table_BxM, *, window):
  b, _, h = q_BxNxH.shape
  live_B = kv_len_B > 0
  order_B = jnp.argsort(~live_B, stable=True)  # rows with keys first
  # At least one sequence, so that the kernel's first prefetch is waited on; a
  # dead row listed this way reads page 0 and is zeroed below.
  num_seqs = jnp.maximum(jnp.sum(live_B, dtype=jnp.int32), 1)[None]
  pages_per_seq = table_BxM.shape[1]
  tuned = jax.default_backend() == "tpu"
  out = rpa.ragged_paged_attention(
      q_BxNxH[order_B], kv_pages, jnp.maximum(kv_len_B, 1)[order_B].astype(jnp.int32),
      jnp.maximum(table_BxM, 0)[order_B].astype(jnp.int32), jnp.arange(b + 1, dtype=jnp.int32),
      num_seqs, sm_scale=h ** -0.5, sliding_window=window,
      num_kv_pages_per_block=None if tuned else min(pages_per_seq, _PAGES_PER_BLOCK),
      num_queries_per_block=None if tuned else min(b, _QUERIES_PER_BLOCK))
  out_BxNxH = jnp.zeros_like(out).at[order_B].set(out)
  return jnp.where(live_B[:, None, None], out_BxNxH, 0).astype(q_BxNxH.dtype)
