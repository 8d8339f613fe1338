"""The rollout engine over a paged KV cache (`sampler.kv_layout = "paged"`).

Same API, sampling and results as `sao_jax.sampler.engine.Engine` (its
docstring), with a different memory model:

Pages. The KV cache is one pool of `sampler.num_kv_pages()` pages of
`kv_page_size` tokens (`sao_jax.models.paged`); a slot holds a page table
(`sao_jax.sampler.pages`) and only as many pages as its episode has tokens, so
a pool the size of the dense cache holds many more short episodes than
`max_seq_len`-token rows. `slots` is the decode batch width: set it above
kv_pages / pages-per-episode to let short episodes share the pool.

Admission: a queued turn starts when it gets a slot (empty, its own parked
one, or an evicted parked one, as in the dense engine) and the pages for its
tokens plus one decode call (`steps_per_call` tokens); parked slots (turns
waiting for their environment, not queued) give up their pages first. A turn
that cannot get pages waits.

Preemption: before each decode call every active slot gets the pages its next
`steps_per_call` tokens need, oldest admission first. When none are free and no
parked slot is left to evict, the most recently admitted active episode is
preempted: its pages and slot are freed and it goes to the front of the queue;
when admitted again it re-prefills every token but its last sampled one and
decodes on from there (the same keys, so the same tokens up to float rounding
of the recomputed prefix). `stats["preemptions"]` counts them. Nothing is
dropped and nothing fails: one episode at max_seq_len always fits (validated).

Prefix sharing (`kv_prefix_sharing`): a new episode whose prompt's full pages
before its last token (shared = page * floor((len - 1) / page) tokens) equal
those of an episode holding them in the pool takes the same pages
(reference-counted, `sao_jax.sampler.pages`) and prefills only the rest: its
first divergent page is its own from the start, since a shared page is never
written again. Where the holder was admitted in the same step, the followers'
prefill runs after the holder's. A GRPO group's n episodes thus prefill and
hold its prompt once. `stats["shared_pages"]` counts pages taken this way.

Batched prefill: the turns admitted in one `step` prefill together, up to the
largest of `prefill_row_buckets` rows per call (per page shard), each row one
chunk of at most the largest prefill bucket; shapes are padded to a (rows,
chunk) bucket pair, all compiled by `warmup`, so nothing compiles afterwards.

Page shards. On a mesh whose batch axes (data, fsdp) span D devices the pool
is split into D shards (`sao_jax.models.paged_mesh`): each device holds
kv_pages / D pages and the rows of slots / D slots, and one allocator per shard
hands out page ids local to it (`sao_jax.sampler.pages`). Slot s belongs to
shard s // (slots / D) for good, so an episode stays in its slot's shard for
as long as it holds the slot. Admission picks the shard: a turn without a slot
takes an empty slot, else evicts a parked one, in the first shard of
`PagePool.shard_order` that has one: for a new episode whose prompt pages a
slot holds, that slot's shard (to share them), then the least loaded (most free
pages, then fewest occupied slots, then the lowest index). Eviction of
parked slots, preemption and prefix sharing all stay within a shard: a slot
short of pages takes them from its own shard only. A prefill call's rows are D
blocks, block d holding shard d's turns. D = 1 is the unsplit pool.
"""

from __future__ import annotations

from typing import Hashable

import jax
import numpy as np

from sao_jax.config import ModelConfig
from sao_jax.models.paged_mesh import page_shards
from sao_jax.sampler import paged_steps
from sao_jax.sampler.engine import Engine, Generation, Turn, _Episode
from sao_jax.sampler.pages import PagePool


class PagedEngine(Engine):
  """Continuous batching over a paged KV cache (module docstring)."""

  kv_layout = "paged"
  programs = paged_steps

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._resume: set[Hashable] = set()  # preempted mid-turn: re-prefill, then decode on
    self._admitted_at: dict[int, int] = {}  # slot -> admission counter (preempt the youngest)
    self._admissions = 0
    self._holders: dict[tuple, dict[int, None]] = {}  # shared prompt prefix -> slots holding it
    self._prefix_of: dict[int, tuple] = {}
    self.stats.update(preemptions=0, prefill_rows=0, shared_pages=0)

  def _init_device(self, model_cfg: ModelConfig, mesh: jax.sharding.Mesh | None) -> None:
    super()._init_device(model_cfg, mesh)
    cfg = self.cfg
    shards = 1 if mesh is None else page_shards(dict(mesh.shape))
    self._pool = PagePool(cfg.num_kv_pages(), cfg.kv_page_size, cfg.slots, cfg.max_seq_len,
                          shards)

  @property
  def free_pages(self) -> int:
    return self._pool.free_pages

  def finish(self, episode_id: Hashable) -> Generation:
    generation = super().finish(episode_id)
    self._resume.discard(episode_id)
    return generation

  def warmup(self) -> None:
    """Compiles every (rows, chunk) prefill bucket and the decode step."""
    if self._episodes:
      raise ValueError("warmup() must run before any episode is submitted")
    n, shards = self.cfg.slots, self._pool.shards
    for chunk in self.cfg.prefill_buckets:
      for rows in self.cfg.prefill_row_buckets:  # padding rows only: nothing changes
        rows *= shards
        zeros_BxC = np.zeros((rows, chunk), np.int32)
        self._cache, token, _ = self._steps.prefill(
            self._params, self._cache, self._pool.table_NxM, np.full(rows, n, np.int32),
            zeros_BxC, zeros_BxC, np.zeros(rows, np.int32), np.zeros(rows, np.uint32))
    outs = []
    for entries in self._entry_buckets():
      self._cache, *out = self._decode_call(entries)
      outs.append(out)
    jax.block_until_ready((token, outs))

  def _entry_buckets(self) -> tuple[int, ...]:
    """Decode entry counts per shard: its pages, and twice that with prefix sharing."""
    pages = self._pool.pages_per_shard
    return (pages, 2 * pages) if self.cfg.kv_prefix_sharing else (pages,)

  # ---- slots and pages ----

  def _release(self, slot: int) -> None:
    super()._release(slot)
    self._pool.release(slot)
    self._admitted_at.pop(slot, None)
    prefix = self._prefix_of.pop(slot, None)
    if prefix is not None:
      del self._holders[prefix][slot]
      if not self._holders[prefix]:
        del self._holders[prefix]

  def _prefix(self, episode: _Episode) -> tuple | None:
    """The prompt's full pages before its last token, if a new episode may share them."""
    size = self.cfg.kv_page_size
    shared = (len(episode.tokens) - 1) // size * size
    if not self.cfg.kv_prefix_sharing or episode.num_turns or shared == 0:
      return None
    return tuple(episode.tokens[:shared])

  def _share_prefix(self, episode: _Episode, slot: int, placed: list[_Episode]) -> bool:
    """Gives a new episode's empty slot the pages of its prompt's full pages before the
    last token from a slot of its shard holding them; True if the holder was placed this
    step."""
    prefix = self._prefix(episode)
    if prefix is None:
      return False
    shard, shared = self._pool.shard_of(slot), len(prefix)
    holder = next((h for h in self._holders.get(prefix, ()) if self._pool.shard_of(h) == shard),
                  None)
    if holder is not None and self._pool.share(holder, slot, shared // self.cfg.kv_page_size):
      episode.cache_len = shared
      same_step = any(other.slot == holder for other in placed)
    else:
      same_step = False
    self._holders.setdefault(prefix, {})[slot] = None
    self._prefix_of[slot] = prefix
    return same_step

  def _evict_parked(self, shard: int, keep: int | None = None) -> bool:
    """Evicts the shard's longest-parked slot whose episode is not queued (not `keep`)."""
    for slot in self._parked:
      if (slot != keep and self._pool.shard_of(slot) == shard
          and self._episodes[self._owner[slot]].state != "queued"):
        self._evict(slot)
        return True
    return False

  def _get_pages(self, slot: int, n_tokens: int) -> bool:
    while not self._pool.ensure(slot, n_tokens):
      if not self._evict_parked(self._pool.shard_of(slot), keep=slot):
        return False
    return True

  def _claim_slot_for(self, episode: _Episode) -> int | None:
    """A slot for a turn without one (module docstring, page shards): an empty slot, else
    the longest-parked one whose episode is not queued (evicted), each looked for in the
    shards holding the episode's prompt pages first, then in all by load."""
    pool = self._pool
    holders = self._holders.get(self._prefix(episode), ())
    occupied_D = np.bincount([pool.shard_of(slot) for slot, owner in enumerate(self._owner)
                              if owner is not None], minlength=pool.shards)
    order = {shard: rank for rank, shard in
             enumerate(pool.shard_order(map(pool.shard_of, holders), occupied_D))}
    empty = [slot for slot, owner in enumerate(self._owner) if owner is None]
    if empty:
      return min(empty, key=lambda slot: order[pool.shard_of(slot)])
    parked = [slot for slot in self._parked if self._episodes[self._owner[slot]].state != "queued"]
    if not parked:
      return None
    slot = min(parked, key=lambda slot: order[pool.shard_of(slot)])  # stable: longest parked
    self._evict(slot)
    return slot

  def _preempt(self, slot: int) -> None:
    episode = self._episodes[self._owner[slot]]
    self._release(slot)
    episode.slot, episode.cache_len, episode.state = None, 0, "queued"
    self._resume.add(episode.id)
    self._queue.insert(0, episode.id)
    self.stats["preemptions"] += 1

  # ---- scheduling ----

  def _admit(self, turns: list[Turn]) -> None:
    admitted, followers = self._place_queued()
    if not admitted and self._queue and not self._active_N.any():
      # Nothing runs and nothing fits: the pages sit in parked slots of queued
      # episodes. Drop those caches (they re-prefill) so the queue's head fits.
      for slot in list(self._parked):
        self._evict(slot)
      admitted, followers = self._place_queued()
    if admitted:
      # Followers read pages their holders write in the first pass.
      first = [episode for episode in admitted if episode not in followers]
      sampled = {**self._prefill(first), **self._prefill(followers)}
      for episode in admitted:
        if episode.id in self._resume:  # the turn goes on from its last sampled token
          self._resume.discard(episode.id)
          episode.state = "generating"
          self._arm(episode)
        else:
          self._begin_turn(episode, *sampled[episode.id], turns)

  def _place_queued(self) -> tuple[list[_Episode], list[_Episode]]:
    """Gives queued turns slots and pages, in queue order; returns those placed, and
    those among them whose shared prompt pages a slot placed with them fills."""
    placed, followers = [], []
    for episode_id in list(self._queue):
      episode = self._episodes[episode_id]
      slot = episode.slot if episode.slot is not None else self._claim_slot_for(episode)
      if slot is None:
        continue
      resume = episode_id in self._resume
      fresh = episode.slot is None and not resume and episode.cache_len == 0
      follows = fresh and self._share_prefix(episode, slot, placed)
      if not self._get_pages(slot, len(episode.tokens) - resume + self.cfg.steps_per_call):
        if episode.slot is None:
          episode.cache_len = 0
          self._release(slot)  # claimed for nothing: leave it empty (drops shared pages)
        continue
      if fresh and episode.cache_len:
        self.stats["shared_pages"] += episode.cache_len // self.cfg.kv_page_size
      if follows:
        followers.append(episode)
      self._queue.remove(episode_id)
      self._parked.pop(slot, None)
      episode.slot, self._owner[slot] = slot, episode_id
      self._admitted_at[slot], self._admissions = self._admissions, self._admissions + 1
      placed.append(episode)
    return placed, followers

  def _prefill(self, admitted: list[_Episode]) -> dict[Hashable, tuple]:
    """Prefills the episodes' missing tokens, several rows per call (in each shard's block
    of rows); -> {id: (token, behavior_logp)} sampled after each one's last token."""
    chunk_max, rows_max = self.cfg.prefill_buckets[-1], self.cfg.prefill_row_buckets[-1]
    pending = [episode.tokens[episode.cache_len:len(episode.tokens) - (episode.id in self._resume)]
               for episode in admitted]
    done = [0] * len(admitted)
    sampled: dict[int, tuple] = {}
    shards = self._pool.shards
    while len(sampled) < len(admitted):
      live = [[i for i in range(len(admitted)) if i not in sampled
               and self._pool.shard_of(admitted[i].slot) == shard] for shard in range(shards)]
      calls = max(-(-len(block) // rows_max) for block in live)
      for call in range(calls):
        # blocks[d]: the episodes shard d prefills in this call (row block d).
        blocks = [block[call * rows_max:(call + 1) * rows_max] for block in live]
        group = [(d, j, i) for d, block in enumerate(blocks) for j, i in enumerate(block)]
        pieces = {i: pending[i][done[i]:done[i] + chunk_max] for _, _, i in group}
        chunk = next(b for b in self.cfg.prefill_buckets if b >= max(map(len, pieces.values())))
        rows = next(b for b in self.cfg.prefill_row_buckets if b >= max(map(len, blocks)))
        rows_B = np.full(shards * rows, self.cfg.slots, np.int32)
        tokens_BxC = np.zeros((shards * rows, chunk), np.int32)
        mask_BxC = np.zeros((shards * rows, chunk), np.int32)
        start_B, seed_B = np.zeros(shards * rows, np.int32), np.zeros(shards * rows, np.uint32)
        for d, j, i in group:
          episode, piece, b = admitted[i], pieces[i], d * rows + j
          rows_B[b], start_B[b], seed_B[b] = episode.slot, episode.cache_len + done[i], episode.seed
          tokens_BxC[b, :len(piece)], mask_BxC[b, :len(piece)] = piece, 1
        self._cache, token_B, logp_B = self._steps.prefill(
            self._params, self._cache, self._pool.table_NxM, rows_B, tokens_BxC, mask_BxC,
            start_B, seed_B)
        self.stats["prefill_calls"] += 1
        self.stats["prefill_rows"] += len(group)
        for d, j, i in group:
          done[i] += len(pieces[i])
          if done[i] == len(pending[i]):
            sampled[i] = (token_B, logp_B, d * rows + j)
    for i, episode in enumerate(admitted):
      episode.cache_len += len(pending[i])
    return {admitted[i].id: (np.asarray(token_B)[b], np.asarray(logp_B)[b])
            for i, (token_B, logp_B, b) in sampled.items()}

  def _dispatch_decode(self) -> tuple | None:
    self._reserve_decode_pages()
    return super()._dispatch_decode()

  def _reserve_decode_pages(self) -> None:
    """Pages for every active slot's next decode call, oldest first; preempts the
    youngest active episode while they do not suffice."""
    for slot in sorted(np.flatnonzero(self._active_N), key=self._admitted_at.__getitem__):
      if not self._active_N[slot]:
        continue  # preempted for an older one in this loop
      episode = self._episodes[self._owner[slot]]
      need = min(len(episode.tokens) - 1 + self.cfg.steps_per_call, self.cfg.max_seq_len)
      shard = self._pool.shard_of(slot)
      while not self._get_pages(slot, need):
        youngest = max((s for s in np.flatnonzero(self._active_N)
                        if self._pool.shard_of(s) == shard), key=self._admitted_at.__getitem__)
        self._preempt(youngest)
        if youngest == slot:
          break

  def _decode_call(self, entries: int | None = None):
    # Only active slots' pages are listed, so parked caches cost no attention reads.
    table_NxM = np.where(self._active_N[:, None], self._pool.table_NxM, -1)
    if entries is None:
      listed = int((table_NxM >= 0).reshape(self._pool.shards, -1).sum(axis=1).max())
      entries = next(e for e in self._entry_buckets() if e >= listed)
    # table_NxM is a fresh array already; the slot inputs are copied (Engine._slot_inputs).
    return self._steps.decode(self._params, self._cache, table_NxM, *self._slot_inputs(),
                              entries=entries)

  def _extend_turn(self, episode: _Episode, tokens: np.ndarray, logps: np.ndarray,
                   turns: list[Turn], experts: np.ndarray | None = None) -> None:
    super()._extend_turn(episode, tokens, logps, turns, experts)
    if episode.state == "waiting":  # parked: keep only the pages its cache still uses
      self._pool.trim(episode.slot, episode.cache_len)
