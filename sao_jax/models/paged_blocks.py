"""Block sizes of the Pallas ragged paged attention kernel: one function for the run and the plan.

  kernel_blocks(generation, shapes)  -> KernelBlocks(num_kv_pages_per_block,
                                                     num_queries_per_block, vmem_limit_bytes)
  vmem_need(shapes, kv_pages, queries) -> bytes of VMEM the kernel takes at those sizes
  generation_of(device_kind)           -> "v5p", "v5e", ... or None (not a TPU)
  trace_generation()                   -> the TPU generation being traced for, or None

`sao_jax.models.paged_kernel` calls the kernel with `kernel_blocks(trace_generation(),
...)`, and the generation comes from the devices the program is traced for (the
abstract mesh's, else the default device's): a sampler on a v5p host and `sao-plan`
compiling for a v5p topology on a CPU machine pass the same generation and the
same per-device shapes, so the plan compiles exactly the sizes the run uses
(`paged_kernel.record_blocks` lists them). jax's own choice (sizes None) read the
device kind of `jax.devices()[0]`, so a CPU-hosted plan compiled other sizes than a
TPU run, and its off-table default, 128 pages x 32 queries, does not fit VMEM at
the pod configs' shapes (pages of 256: a 32K-token KV block, 64 MiB double buffered).

VMEM model. At kv_pages = P pages of S tokens and queries = Q per block, with
heads per block h_q and 2 h_kv combined KV heads (`rpa.get_min_heads_per_blk`),
G = query heads per KV head, head_dim H, T = P * S keys per block:

    buffers = 2 * T * 2 h_kv * H * kv_bytes      double-buffered KV block (DMA target)
            + 2 * 2 * Q * h_q * H * q_bytes      query and output blocks, double-buffered
            + Q * h_q * H * 4                    float32 accumulator
            + 2 * h_kv * Q * G * 128 * 4         m and l, lane-padded to 128
    working = h_kv * (2 * Q * G * T * 4          per KV head (the kernel unrolls that loop):
                      + T * H * 4)               scores and exp(scores - m) in float32, the
            + 2 MiB                              block's keys/values unpacked; Mosaic's own

an upper bound of what libtpu 0.0.42.1 reports for the shapes that
`tests/models/test_paged_blocks_tpu.py` compiles at exactly this limit.

Budget: 3/4 of a TensorCore's VMEM (`VMEM_BYTES`, jax's `pallas.mosaic.tpu_info`),
the rest left to Mosaic's spills and to the model's error; `vmem_limit_bytes` is
that budget. Sizes: Q = min(tokens, 32), the kernel's own default; P = the
largest of min(pages per sequence, MAX_KEYS_PER_BLOCK / S) and its halvings whose
need fits the budget. Every block moves all its P pages from HBM (pages past a
sequence's end re-read its first page), so keys per block are capped at 4096, the
largest jax's tuned table picks. Where that table
(`ragged_paged_attention.tuned_block_sizes`, v5 and v6 entries) has the shapes,
its sizes tighten ours (the smaller of each). Off a TPU (interpret mode) there is
no VMEM: P = min(pages per sequence, 16), Q = min(tokens, 32), no limit.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as tuned

MiB = 2**20
# VMEM per TensorCore by TPU generation (jax._src.pallas.mosaic.tpu_info, jax 0.10.2).
VMEM_BYTES = {"v4": 16 * MiB, "v5e": 128 * MiB, "v5p": 64 * MiB, "v6e": 128 * MiB}
VMEM_BUDGET_FRACTION = 0.75
MAX_KEYS_PER_BLOCK = 4096
QUERIES_PER_BLOCK = 32
# Off a TPU: blocks in the range the tuned tables pick for 16-token pages.
INTERPRET_PAGES_PER_BLOCK = 16
_MOSAIC_RESERVE = 2 * MiB
# The `device_kind` TPU chips report -> generation (as jax's tpu_info reads them).
_DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
                 "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}
# The tuned table's device names (`tuned.get_device_name`: the kind's first two words).
_TUNED_TABLE = {"v5e": "TPU v5", "v5p": "TPU v5", "v6e": "TPU v6"}


class KernelBlocks(NamedTuple):
  num_kv_pages_per_block: int
  num_queries_per_block: int
  vmem_limit_bytes: int | None  # None: the compiler's default (off a TPU: none applies)

  def describe(self) -> str:
    limit = ("no VMEM limit" if self.vmem_limit_bytes is None
             else f"VMEM limit {self.vmem_limit_bytes / MiB:g} MiB")
    return (f"{self.num_kv_pages_per_block} KV pages x {self.num_queries_per_block} queries "
            f"per block, {limit}")


class KernelShapes(NamedTuple):
  """One device's kernel call: what the block sizes depend on."""
  page_size: int
  pages_per_seq: int
  num_q_tokens: int
  num_q_heads: int
  num_kv_heads: int
  head_dim: int
  q_dtype: object
  kv_dtype: object


def generation_of(device_kind: str) -> str | None:
  """The TPU generation of a device kind ("TPU v5" -> "v5p"); None for other devices."""
  return _DEVICE_KINDS.get(device_kind)


def trace_generation() -> str | None:
  """The TPU generation of the devices being traced for: the abstract mesh's (a
  sampler's mesh, or sao-plan's compile-only topology), else the default device's."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  if device is None:
    default = jax.config.jax_default_device  # `with jax.default_device(d)`, as Pallas reads it
    device = default if isinstance(default, jax.Device) else jax.devices(default)[0]
  kind = device.device_kind
  if kind.startswith("TPU") and generation_of(kind) is None:
    raise ValueError(f"TPU device kind {kind!r} has no VMEM budget: add its generation to "
                     "sao_jax.models.paged_blocks.VMEM_BYTES and _DEVICE_KINDS")
  return generation_of(kind)


def _heads_per_block(shapes: KernelShapes) -> tuple[int, int]:
  """(query heads, combined KV heads) per kernel block, as the kernel picks them."""
  return rpa.get_min_heads_per_blk(shapes.num_q_heads, 2 * shapes.num_kv_heads, shapes.q_dtype,
                                   shapes.kv_dtype)


def vmem_need(shapes: KernelShapes, kv_pages: int, queries: int) -> int:
  """Bytes of VMEM the kernel takes with these block sizes (module docstring)."""
  q_heads, kv2 = _heads_per_block(shapes)
  kv_heads, h = kv2 // 2, shapes.head_dim
  group = shapes.num_q_heads // shapes.num_kv_heads
  keys = kv_pages * shapes.page_size
  q_bytes, kv_bytes = jnp.dtype(shapes.q_dtype).itemsize, jnp.dtype(shapes.kv_dtype).itemsize
  buffers = (2 * keys * kv2 * h * kv_bytes + 4 * queries * q_heads * h * q_bytes
             + queries * q_heads * h * 4 + 2 * kv_heads * queries * group * 128 * 4)
  working = kv_heads * (2 * queries * group * keys * 4 + keys * h * 4) + _MOSAIC_RESERVE
  return buffers + working


def _tuned(generation: str, shapes: KernelShapes) -> tuple[int, int] | None:
  table = tuned.TUNED_BLOCK_SIZES.get(_TUNED_TABLE.get(generation, ""), {})
  q_heads, kv2 = _heads_per_block(shapes)
  key = tuned.simplify_key((shapes.q_dtype, shapes.kv_dtype, q_heads, kv2 // 2, shapes.head_dim,
                            shapes.page_size, shapes.num_q_tokens, shapes.pages_per_seq))
  return table.get(key)


def kernel_blocks(generation: str | None, shapes: KernelShapes) -> KernelBlocks:
  """The kernel's block sizes and VMEM limit on `generation` (None: off a TPU)."""
  queries = min(shapes.num_q_tokens, QUERIES_PER_BLOCK)
  if generation is None:
    return KernelBlocks(min(shapes.pages_per_seq, INTERPRET_PAGES_PER_BLOCK), queries, None)
  if generation not in VMEM_BYTES:
    raise ValueError(f"TPU generation {generation!r} has no VMEM budget: known generations are "
                     f"{', '.join(VMEM_BYTES)}")
  budget = int(VMEM_BYTES[generation] * VMEM_BUDGET_FRACTION)
  pages = max(1, min(shapes.pages_per_seq, MAX_KEYS_PER_BLOCK // shapes.page_size))
  tuned_sizes = _tuned(generation, shapes)
  if tuned_sizes is not None:
    pages, queries = min(pages, tuned_sizes[0]), min(queries, tuned_sizes[1])
  while vmem_need(shapes, pages, queries) > budget and (pages > 1 or queries > 8):
    if pages > 1:
      pages //= 2
    else:
      queries //= 2
  need = vmem_need(shapes, pages, queries)
  if need > budget:
    raise ValueError(f"the Pallas ragged paged attention kernel needs {need / MiB:.1f} MiB of "
                     f"VMEM for one page of {shapes.page_size} tokens ({shapes.num_q_heads} "
                     f"query heads per device), over the {budget / MiB:.0f} MiB budget of a "
                     f"{generation} core; use a smaller sampler.kv_page_size or "
                     "sampler.paged_attention='reference'")
  return KernelBlocks(pages, queries, budget)
