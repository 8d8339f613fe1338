"""The paged engine's page allocator: a free list and one page table per slot.

  pool = PagePool(num_pages, page_size, slots, max_seq_len)
  pool.ensure(slot, n_tokens)   -> bool: the slot's table covers n_tokens (pages taken from
                                   the free list), or False and nothing taken
  pool.trim(slot, n_tokens)     -> frees the slot's pages past the first n_tokens
  pool.release(slot)            -> frees all of the slot's pages
  pool.table_NxM                   int32 [slots, ceil(max_seq_len / page_size)], -1 = no page

Token i of a slot lives in page table_NxM[slot, i // page_size]. A page belongs
to at most one slot, so the pages in all tables never exceed `num_pages` (the
decode step's entry count, `sao_jax.models.paged`). Free pages are handed out
lowest first, so a run's placement is deterministic.
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

  @property
  def free_pages(self) -> int:
    return len(self._free)

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
      self.table_NxM[slot, column] = heapq.heappop(self._free)
    self._held_N[slot] = held + need
    return True

  def trim(self, slot: int, n_tokens: int) -> None:
    """Frees the slot's pages that hold no token of its first `n_tokens`."""
    keep = self.pages_for(n_tokens)
    for column in range(keep, self._held_N[slot]):
      heapq.heappush(self._free, int(self.table_NxM[slot, column]))
      self.table_NxM[slot, column] = -1
    self._held_N[slot] = min(keep, self._held_N[slot])

  def release(self, slot: int) -> None:
    self.trim(slot, 0)
