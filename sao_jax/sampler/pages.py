"""The paged engine's page allocator: one free list per pool shard and one page table per slot.

  pool = PagePool(num_pages, page_size, slots, max_seq_len, shards=1)
  pool.shard_of(slot)           -> the shard whose pages the slot's table lists
  pool.shard_order(preferred, occupied_D) -> shards in the order admission tries them
  pool.ensure(slot, n_tokens)   -> bool: the slot's table covers n_tokens (pages taken from
                                   its shard's free list), or False and nothing taken
  pool.trim(slot, n_tokens)     -> frees the slot's pages past the first n_tokens
  pool.release(slot)            -> frees all of the slot's pages
  pool.share(src, dst, n_pages) -> dst's table starts with src's first n_pages pages
  pool.table_NxM                   int32 [slots, ceil(max_seq_len / page_size)], -1 = no page

Token i of a slot lives in page table_NxM[slot, i // page_size] of its shard.

Shards. A pool split over D devices (the sampler mesh's batch axes,
`sao_jax.models.paged_mesh`) is D allocators of num_pages / D pages each, page
ids local to the shard (0 .. num_pages / D - 1), as each device holds its own
block of the pool array. Slots are partitioned the same way: slot s belongs to
shard s // (slots / D) for good, so its table lists pages of that shard only and
the device holding its rows holds its pages. D = 1 is the unsplit pool.

Pages are reference counted: `share` puts the same pages in a second table of
the same shard (a GRPO group's common prompt), and a page returns to its free
list when the last table holding it lets go. Only full pages that no slot
writes again are shared (the engine shares whole pages of a prompt before its
last token), so a shared page is never written and needs no copy.
`extra_entries(shard)` counts the second and later holders of a shard's shared
pages: the decode step lists up to 2 * pages_per_shard table entries per shard,
so `share` refuses to make a shard's extra entries exceed its pages. Free pages
are handed out lowest first, so a run's placement is deterministic.
"""

from __future__ import annotations

import heapq
from typing import Iterable

import numpy as np

from sao_jax.models.paged_mesh import check_shards


class PagePool:
  """Host-side page bookkeeping (module docstring)."""

  def __init__(self, num_pages: int, page_size: int, slots: int, max_seq_len: int,
               shards: int = 1):
    check_shards(slots, num_pages, shards)
    self.page_size, self.shards = page_size, shards
    self.pages_per_slot = -(-max_seq_len // page_size)
    self.pages_per_shard, self.slots_per_shard = num_pages // shards, slots // shards
    if self.pages_per_shard < self.pages_per_slot:
      split = f" per shard ({num_pages} over {shards} shards)" if shards > 1 else ""
      raise ValueError(f"{self.pages_per_shard} pages of {page_size} tokens{split} cannot hold "
                       f"one episode of max_seq_len={max_seq_len} tokens ({self.pages_per_slot} "
                       "pages); raise sampler.kv_pages")
    self.num_pages = num_pages
    self.table_NxM = np.full((slots, self.pages_per_slot), -1, np.int32)
    self._held_N = np.zeros(slots, np.int32)  # pages in each slot's table (a prefix of it)
    self._free = [list(range(self.pages_per_shard)) for _ in range(shards)]  # heaps
    self._refs_DxP = np.zeros((shards, self.pages_per_shard), np.int32)  # tables holding each page

  def shard_of(self, slot: int) -> int:
    return slot // self.slots_per_shard

  def shard_order(self, preferred: Iterable[int], occupied_D: np.ndarray) -> list[int]:
    """Every shard once, as admission tries them for a new slot: `preferred` first (the
    shards holding a new episode's prompt pages), then the least loaded first: most free
    pages, then fewest occupied slots (occupied_D[d] of shard d), then the lowest index."""
    by_load = sorted(range(self.shards), key=lambda d: (-len(self._free[d]), occupied_D[d], d))
    return list(dict.fromkeys([*preferred, *by_load]))

  @property
  def free_pages(self) -> int:
    """Free pages over all shards."""
    return sum(map(len, self._free))

  def free_in(self, shard: int) -> int:
    return len(self._free[shard])

  def extra_entries(self, shard: int) -> int:
    """The shard's table entries beyond its distinct pages in use (shared pages' extra holders)."""
    first = shard * self.slots_per_shard
    held = int(self._held_N[first:first + self.slots_per_shard].sum())
    return held - (self.pages_per_shard - len(self._free[shard]))

  def held(self, slot: int) -> int:
    return int(self._held_N[slot])

  def share(self, src: int, dst: int, n_pages: int) -> bool:
    """Gives the empty slot `dst` the first n_pages pages of `src` (same shard); False (no
    change) if that would exceed the shard's entry budget (module docstring)."""
    shard = self.shard_of(dst)
    if self.shard_of(src) != shard or self._held_N[dst] or n_pages > self._held_N[src]:
      raise ValueError(f"share({src}, {dst}, {n_pages}): src and dst must be slots of one shard "
                       f"(they are in shards {self.shard_of(src)}, {shard}), dst must hold no page "
                       f"and src at least {n_pages} (they hold {self._held_N[dst]}, "
                       f"{self._held_N[src]})")
    if self.extra_entries(shard) + n_pages > self.pages_per_shard:
      return False
    pages = self.table_NxM[src, :n_pages]
    self.table_NxM[dst, :n_pages] = pages
    self._refs_DxP[shard, pages] += 1
    self._held_N[dst] = n_pages
    return True

  def pages_for(self, n_tokens: int) -> int:
    return min(-(-n_tokens // self.page_size), self.pages_per_slot)

  def ensure(self, slot: int, n_tokens: int) -> bool:
    """Extends the slot's table to cover `n_tokens` (capped at max_seq_len) if its shard's
    free pages suffice; False (and no change) if they do not."""
    need = self.pages_for(n_tokens) - self._held_N[slot]
    if need <= 0:
      return True
    shard = self.shard_of(slot)
    free, refs_P = self._free[shard], self._refs_DxP[shard]
    if need > len(free):
      return False
    held = self._held_N[slot]
    for column in range(held, held + need):
      page = heapq.heappop(free)
      self.table_NxM[slot, column], refs_P[page] = page, 1
    self._held_N[slot] = held + need
    return True

  def trim(self, slot: int, n_tokens: int) -> None:
    """Lets go of the slot's pages that hold no token of its first `n_tokens` (a page is
    free once no table holds it)."""
    keep = self.pages_for(n_tokens)
    shard = self.shard_of(slot)
    free, refs_P = self._free[shard], self._refs_DxP[shard]
    for column in range(keep, self._held_N[slot]):
      page = int(self.table_NxM[slot, column])
      refs_P[page] -= 1
      if not refs_P[page]:
        heapq.heappush(free, page)
      self.table_NxM[slot, column] = -1
    self._held_N[slot] = min(keep, self._held_N[slot])

  def release(self, slot: int) -> None:
    self.trim(slot, 0)
