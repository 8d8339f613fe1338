"""The paged engine's page allocator: a free list and one page table per slot.

  pool = PagePool(num_pages, page_size, slots, max_seq_len)
  pool.ensure(slot, n_tokens)   -> bool: the slot's table covers n_tokens (pages taken from
                                   the free list), or False and nothing taken
  pool.trim(slot, n_tokens)     -> frees the slot's pages past the first n_tokens
  pool.release(slot)            -> frees all of the slot's pages
  pool.share(src, dst, n_pages) -> dst's table starts with src's first n_pages pages
  pool.table_NxM                   int32 [slots, ceil(max_seq_len / page_size)], -1 = no page

Token i of a slot lives in page table_NxM[slot, i // page_size]. Pages are
reference counted: `share` puts the same pages in a second table (a GRPO
group's common prompt), and a page returns to the free list when the last
table holding it lets go. Only full pages that no slot writes again are shared
(the engine shares whole pages of a prompt before its last token), so a shared
page is never written and needs no copy. `entries` counts table entries
(pages in use plus `extra_entries`, the second and later holders of shared
pages): the decode step lists up to 2 * num_pages of them, so `share` refuses
to make extra_entries exceed num_pages. Free pages are handed out lowest
first, so a run's placement is deterministic.
"""

from __future__ import annotations

import heapq

import numpy as np


class PagePool:
  """Host-side page bookkeeping (module docstring)."""

  def __init__(self, num_pages: int, page_size: int, slots: int, max_seq_len: int):
    self.page_size = page_size
    self.pages_per_slot = -(-max_seq_len // page_size)
    if num_pages < self.pages_per_slot:
      raise ValueError(f"{num_pages} pages of {page_size} tokens cannot hold one episode of "
                       f"max_seq_len={max_seq_len} tokens ({self.pages_per_slot} pages); raise "
                       "sampler.kv_pages")
    self.num_pages = num_pages
    self.table_NxM = np.full((slots, self.pages_per_slot), -1, np.int32)
    self._held_N = np.zeros(slots, np.int32)  # pages in each slot's table (a prefix of it)
    self._free = list(range(num_pages))  # a heap
    self._refs_P = np.zeros(num_pages, np.int32)  # tables holding each page

  @property
  def free_pages(self) -> int:
    return len(self._free)

  @property
  def extra_entries(self) -> int:
    """Table entries beyond the distinct pages in use (shared pages' extra holders)."""
    return int(self._held_N.sum()) - (self.num_pages - len(self._free))

  def held(self, slot: int) -> int:
    return int(self._held_N[slot])

  def share(self, src: int, dst: int, n_pages: int) -> bool:
    """Gives the empty slot `dst` the first n_pages pages of `src`; False (no change)
    if that would exceed the entry budget (module docstring)."""
    if self._held_N[dst] or n_pages > self._held_N[src]:
      raise ValueError(f"share({src}, {dst}, {n_pages}): dst must hold no page and src at "
                       f"least {n_pages} (they hold {self._held_N[dst]}, {self._held_N[src]})")
    if self.extra_entries + n_pages > self.num_pages:
      return False
    pages = self.table_NxM[src, :n_pages]
    self.table_NxM[dst, :n_pages] = pages
    self._refs_P[pages] += 1
    self._held_N[dst] = n_pages
    return True

  def pages_for(self, n_tokens: int) -> int:
    return min(-(-n_tokens // self.page_size), self.pages_per_slot)

  def ensure(self, slot: int, n_tokens: int) -> bool:
    """Extends the slot's table to cover `n_tokens` (capped at max_seq_len) if the free
    pages suffice; False (and no change) if they do not."""
    need = self.pages_for(n_tokens) - self._held_N[slot]
    if need <= 0:
      return True
    if need > len(self._free):
      return False
    held = self._held_N[slot]
    for column in range(held, held + need):
      page = heapq.heappop(self._free)
      self.table_NxM[slot, column], self._refs_P[page] = page, 1
    self._held_N[slot] = held + need
    return True

  def trim(self, slot: int, n_tokens: int) -> None:
    """Lets go of the slot's pages that hold no token of its first `n_tokens` (a page is
    free once no table holds it)."""
    keep = self.pages_for(n_tokens)
    for column in range(keep, self._held_N[slot]):
      page = int(self.table_NxM[slot, column])
      self._refs_P[page] -= 1
      if not self._refs_P[page]:
        heapq.heappush(self._free, page)
      self.table_NxM[slot, column] = -1
    self._held_N[slot] = min(keep, self._held_N[slot])

  def release(self, slot: int) -> None:
    self.trim(slot, 0)
