"""How a paged KV pool lies on a mesh: pages over the batch axes, KV heads over `tensor`.

  page_axes(mesh_shape)                  -> the mesh axes pages and slots split over
  page_shards(mesh_shape)                -> D, the product of their sizes (1: not split)
  check_split(slots, pages, mesh_shape)  -> ValueError unless both are multiples of D
  page_entry(mesh_shape)                 -> those axes as a PartitionSpec entry
  traced_page_shards()                   -> D of the abstract mesh being traced (1: none)
  pool_head_axis(mesh_shape, K)          -> the mesh axis KV heads split over, or None
  pool_spec(mesh_shape, K)               -> PartitionSpec of a pool [P, page, 2K, H]
  on_page_shards(fn, rows, heads, pool)  -> fn run per device under shard_map

A pool [P, page, 2K, H] on a mesh is split like the serving engines split it:
its pages over the mesh's `kv_pages` axes (`sao_jax.sharding.rules`: data and
fsdp), its combined heads over `tensor` where tensor divides K (each device then
holds whole (k, v) pairs and the query heads that read them). With D page shards,
device shard d holds pages [d P/D, (d + 1) P/D) of the array, which it knows as
0 .. P/D - 1: page ids in page tables are local to the shard
(`sao_jax.sampler.pages`). Slots, and every per-row array of a call (queries,
page tables, lengths, write positions), split over the same axes in D contiguous
blocks: block d is shard d's rows. `on_page_shards` runs attention and the KV
write on each device's block with its local ids, so no device gathers another's
pages; a device of the other axes (tensor, expert) holds a copy of its block's
rows. D = 1 (a tensor-only mesh) is the pool split over heads alone.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
from jax.sharding import PartitionSpec

from sao_jax.sharding.rules import RULES, logical_to_spec


def page_axes(mesh_shape: dict[str, int]) -> tuple[str, ...]:
  """The mesh axes (of size > 1) that pages and slots split over."""
  return tuple(axis for axis in RULES["kv_pages"] if mesh_shape.get(axis, 1) > 1)


def page_shards(mesh_shape: dict[str, int]) -> int:
  """D: how many shards the pool's pages split into."""
  return math.prod(mesh_shape[axis] for axis in page_axes(mesh_shape))


def check_split(slots: int, pages: int, mesh_shape: dict[str, int]) -> None:
  """ValueError unless `slots` and `pages` both split evenly over the D page shards
  of a mesh of `mesh_shape` (`check_shards`)."""
  check_shards(slots, pages, page_shards(mesh_shape), f"mesh axes {page_axes(mesh_shape)}")


def check_shards(slots: int, pages: int, shards: int,
                 axes: str = "the sampler mesh's data and fsdp axes") -> None:
  """ValueError unless `slots` and `pages` are multiples of `shards` (each shard holds
  slots / D slots and their pages / D pages). The one refusal of a pool that does not
  split: the engine's cache, its page allocator and the start-up check
  (`sao_jax.jobs.startup`) all ask here. `axes` names the axes the shards lie on."""
  for count, what in ((slots, "slots"), (pages, "pages")):
    if count % shards:
      raise ValueError(f"a paged cache of {count} {what} does not split over the {shards} page "
                       f"shards of {axes}: set sampler.slots and sampler.kv_pages to multiples "
                       f"of {shards}, or set sampler.mesh with fewer data x fsdp devices")


def page_entry(mesh_shape: dict[str, int]):
  """`page_axes` as a PartitionSpec entry: None, one axis name, or a tuple of them."""
  axes = page_axes(mesh_shape)
  return None if not axes else axes[0] if len(axes) == 1 else axes


def traced_page_shards() -> int:
  """D on the abstract mesh being traced for (1 without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty else page_shards(dict(mesh.shape))


def pool_head_axis(mesh_shape: dict[str, int], num_kv_heads: int):
  """The mesh axis a pool's combined-head axis splits over: that of the KV heads
  (`tensor`) where it divides K, so that each device holds whole (k, v) pairs and
  the query heads that read them; else None (whole)."""
  (axis,) = logical_to_spec(("activation_kv_heads",), (num_kv_heads,), mesh_shape, strict=False)
  return axis


def pool_spec(mesh_shape: dict[str, int], num_kv_heads: int) -> PartitionSpec:
  """[P, page, 2K, H]: pages over `page_axes`, combined heads over `pool_head_axis`."""
  return PartitionSpec(page_entry(mesh_shape), None, pool_head_axis(mesh_shape, num_kv_heads),
                       None)


def on_page_shards(fn: Callable, rows, heads, pool: jax.Array):
  """fn(rows, heads, pool) -> (heads_out, pool_out), per device on the abstract mesh
  being traced (directly without one).

  `rows` is a pytree of per-row arrays (leading axis: rows or entries, in D blocks,
  ids in them local to the block's shard), `heads` a tuple of [B, T, heads, H]
  arrays (query heads and KV heads split as the pool's), `pool` a [P, page, 2K, H]
  pool; fn sees its device's blocks and returns [B, T, heads, H] outputs and the
  device's pool block."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return fn(rows, heads, pool)
  mesh_shape = dict(mesh.shape)
  pool_in = pool_spec(mesh_shape, pool.shape[2] // 2)
  head_spec = PartitionSpec(pool_in[0], None, pool_in[2], None)
  row_spec = jax.tree.map(lambda _: PartitionSpec(pool_in[0]), rows)
  return jax.shard_map(fn, mesh=mesh, in_specs=(row_spec, tuple(head_spec for _ in heads), pool_in),
                       out_specs=(head_spec, pool_in), check_vma=False)(rows, heads, pool)
