"""Paged attention (prefill and decode) through jax's Pallas TPU ragged paged attention kernel.

  kernel_attention(q_BxTxNxH, kv_pages, query_BxT, kv_len_B, table_BxM, window, blocks)
                                                                               -> out_BxTxNxH
  record_blocks()                                          -> the KernelBlocks traced inside
  kernel_unsupported(num_heads, num_kv_heads, head_dim, dtype)
                                     -> why libtpu cannot compile the kernel for them, or None

`jax.experimental.pallas.ops.tpu.ragged_paged_attention` streams each
sequence's pages from HBM into VMEM by DMA, a block of pages at a time, and
keeps an online softmax (m, l, acc) per query: it holds a few blocks, where
the pure-JAX `paged_attention` paths gather every listed page into
temporaries (for the 8B config on a v5p host, decode 2.0 vs 6.8 GiB per chip;
prefill of 4 x 8192 tokens 0.8 vs 110 GiB, `benchmarks/paged_prefill.py`:
docs/explanation/paged-engine.md). It reads the pool in the layout
`sao_jax.models.paged` keeps, [P, page, 2K, H] with k at even and v at odd
combined heads.

Row b holds kv_len_B[b] keys, position i at page table_BxM[b, i // page],
offset i % page; its n_b queries are the chunk tokens t with query_BxT[b, t],
in order, and the r-th of them sits at position p = kv_len_B[b] - n_b + r (a
decode row: n_b = 1, p = kv_len_B[b] - 1). It attends to the row's positions
[0, p] (with a sliding `window` W, those above p - W): for each head n with
KV head k = n // (N / K), float32 scores

    s_i = q_n . k_{k,i} * H**-0.5,   out_n = sum_i softmax(s)_i v_{k,i},

the reference path's softmax up to float summation order. Tokens that are not
queries (padding) and rows with no query get 0, as in the reference.

The kernel takes queries as one ragged list, sequence s owning
q[cu_q_lens[s]:cu_q_lens[s + 1]] as the last positions of its kv_lens[s]
keys: the query tokens are packed to the front in row-major order and rows
with queries are moved to the front as its `num_seqs` sequences, in the same
order; the rest are past `num_seqs` and not computed. It wants every sequence
it is given to hold a query and a key (block 0 of a sequence is prefetched
before its length is read), so a call without queries gives it one dead
sequence of one query and one key, whose output is set to 0. `kernel_attention`
is the per-device call: on a mesh `paged_attention.PagedLayer.attend` runs it
under `shard_map` on each device's rows, heads and block of the pool, page ids
local to that block (`sao_jax.models.paged_mesh`).

Block sizes (KV pages and queries per block, VMEM limit) are
`paged_blocks.kernel_blocks` for the generation and per-device shapes being
traced, never jax's own choice, so that `sao-plan` compiles what a TPU runs;
`blocks` overrides them (tests: blocks smaller than a row). Inside
`record_blocks()` every traced call appends the sizes it used.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

from sao_jax.models.paged_blocks import KernelBlocks, KernelShapes, kernel_blocks, trace_generation

_recorded: list[list[KernelBlocks]] = []  # one list per open record_blocks()


@contextlib.contextmanager
def record_blocks():
  """Yields a list of the `KernelBlocks` of every kernel call traced inside. jax's
  caches are cleared first: a program whose trace is cached is not traced again."""
  jax.clear_caches()
  blocks: list[KernelBlocks] = []
  _recorded.append(blocks)
  try:
    yield blocks
  finally:
    _recorded.remove(blocks)


def kernel_unsupported(num_heads: int, num_kv_heads: int, head_dim: int, dtype) -> str | None:
  """Why libtpu cannot compile the kernel for these per-device attention shapes (None: it
  can; `tests/models/test_paged_kernel_shapes_tpu.py` compiles both answers on v5e, v5p
  and v6e).

  - head_dim must be a multiple of 128: the online-softmax update broadcasts
    [rows, 128] statistics over head_dim lanes.
  - The combined KV head axis (2 x num_kv_heads) must tile (`rpa.get_min_heads_per_blk`).
  - A head_dim other than 128 needs an unstrided KV read. The kernel views its VMEM
    block of C combined heads per block as [tokens x C, head_dim] rows of 32-bit
    words (p values each: p = 2 for bfloat16, 1 for float32) and reads one KV head's
    keys and values as every (C / p)-th row. Mosaic compiles a strided load only from
    rows of exactly 128 lanes ("The last dim size is not 128 in original base
    memref"), so head_dim 256 compiles only where C / p = 1: one KV head per device
    in bfloat16, none in float32.
  """
  if head_dim % 128:
    return f"head_dim={head_dim} is not a multiple of 128"
  try:
    _, combined = rpa.get_min_heads_per_blk(num_heads, 2 * num_kv_heads, dtype, dtype)
  except ValueError as err:  # the combined head axis does not tile
    return f"{2 * num_kv_heads} combined kv heads: {err}"
  stride = combined // rpa.get_dtype_packing(dtype)
  if head_dim != 128 and stride > 1:
    return (f"head_dim={head_dim} with {num_kv_heads} KV head(s) per device in "
            f"{jnp.dtype(dtype).name}: the kernel reads each KV head as every {stride}th row "
            f"of its [tokens, head_dim] block, and Mosaic compiles a strided read only from "
            f"rows of 128 lanes (head_dim {head_dim} compiles with one KV head per device "
            "in bfloat16)")
  return None


def kernel_attention(q_BxTxNxH: jax.Array, kv_pages: jax.Array, query_BxT: jax.Array,
                     kv_len_B: jax.Array, table_BxM: jax.Array,
                     window: int | None = None, blocks: KernelBlocks | None = None
                     ) -> jax.Array:
  """Each row's query tokens, causal over its first kv_len_B[b] positions (module docstring)."""
  b, t, n, h = q_BxTxNxH.shape
  query_BxT = query_BxT.astype(bool)
  q_len_B = jnp.sum(query_BxT, axis=1, dtype=jnp.int32)
  live_B = q_len_B > 0
  order_B = jnp.argsort(~live_B, stable=True)  # rows with queries first, in row order
  # Query tokens first, row-major: row order_B[s]'s queries are then q[cu[s]:cu[s + 1]].
  order_T = jnp.argsort(~query_BxT.reshape(-1), stable=True)
  # A call without queries still lists one sequence (query 0, one key), so that the
  # kernel's first prefetch is waited on; its output is zeroed below.
  q_len_S = q_len_B[order_B].at[0].max(1)
  cu_q_lens = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(q_len_S, dtype=jnp.int32)])
  num_seqs = jnp.maximum(jnp.sum(live_B, dtype=jnp.int32), 1)[None]
  if blocks is None:
    blocks = kernel_blocks(trace_generation(), KernelShapes(
        page_size=kv_pages.shape[1], pages_per_seq=table_BxM.shape[1], num_q_tokens=b * t,
        num_q_heads=n, num_kv_heads=kv_pages.shape[2] // 2, head_dim=h,
        q_dtype=q_BxTxNxH.dtype, kv_dtype=kv_pages.dtype))
  for recorded in _recorded:
    recorded.append(blocks)
  out = rpa.ragged_paged_attention(
      q_BxTxNxH.reshape(b * t, n, h)[order_T], kv_pages,
      jnp.maximum(kv_len_B, 1)[order_B].astype(jnp.int32),
      jnp.maximum(table_BxM, 0)[order_B].astype(jnp.int32), cu_q_lens, num_seqs,
      sm_scale=h ** -0.5, sliding_window=window,
      num_kv_pages_per_block=blocks.num_kv_pages_per_block,
      num_queries_per_block=blocks.num_queries_per_block,
      vmem_limit_bytes=blocks.vmem_limit_bytes)
  out_BxTxNxH = jnp.zeros_like(out).at[order_T].set(out).reshape(b, t, n, h)
  return jnp.where(query_BxT[:, :, None, None], out_BxTxNxH, 0).astype(q_BxTxNxH.dtype)
