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
largest of `prefill_row_buckets` rows per call, each row one chunk of at most
the largest prefill bucket; shapes are padded to a (rows, chunk) bucket pair,
all compiled by `warmup`, so nothing compiles afterwards.
"""

from __future__ import annotations

from typing import Hashable

import jax
import numpy as np

from sao_jax.config import ModelConfig
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
    self._pool = PagePool(cfg.num_kv_pages(), cfg.kv_page_size, cfg.slots, cfg.max_seq_len)

  @property
  def free_pages(self) -> int:
    return self._pool.free_pages

  def finish(self, episode_id: Hashable) -> Generation:
    self._resume.discard(episode_id)
    return super().finish(episode_id)

  def warmup(self) -> None:
    """Compiles every (rows, chunk) prefill bucket and the decode step."""
    if self._episodes:
      raise ValueError("warmup() must run before any episode is submitted")
    n = self.cfg.slots
    for chunk in self.cfg.prefill_buckets:
      for rows in self.cfg.prefill_row_buckets:  # padding rows only: nothing changes
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
    """Decode entry counts: the pool's pages, and twice that with prefix sharing."""
    pages = self._pool.num_pages
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

  def _share_prefix(self, episode: _Episode, slot: int, placed: list[_Episode]) -> bool:
    """Gives a new episode's empty slot the pages of its prompt's full pages before the
    last token from a slot holding them; True if the holder was placed this step."""
    size = self.cfg.kv_page_size
    shared = (len(episode.tokens) - 1) // size * size
    if not self.cfg.kv_prefix_sharing or episode.num_turns or shared == 0:
      return False
    prefix = tuple(episode.tokens[:shared])
    holder = next(iter(self._holders.get(prefix, ())), None)
    if holder is not None and self._pool.share(holder, slot, shared // size):
      episode.cache_len = shared
      same_step = any(other.slot == holder for other in placed)
    else:
      same_step = False
    self._holders.setdefault(prefix, {})[slot] = None
    self._prefix_of[slot] = prefix
    return same_step

  def _evict_parked(self, keep: int | None = None) -> bool:
    """Evicts the longest-parked slot whose episode is not queued (not `keep`)."""
    for slot in self._parked:
      if slot != keep and self._episodes[self._owner[slot]].state != "queued":
        self._evict(slot)
        return True
    return False

  def _get_pages(self, slot: int, n_tokens: int) -> bool:
    while not self._pool.ensure(slot, n_tokens):
      if not self._evict_parked(keep=slot):
        return False
    return True

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
      slot = episode.slot if episode.slot is not None else self._claim_slot()
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
    """Prefills the episodes' missing tokens, several rows per call; -> {id: (token,
    behavior_logp)} sampled after each one's last token."""
    chunk_max, rows_max = self.cfg.prefill_buckets[-1], self.cfg.prefill_row_buckets[-1]
    pending = [episode.tokens[episode.cache_len:len(episode.tokens) - (episode.id in self._resume)]
               for episode in admitted]
    done = [0] * len(admitted)
    sampled: dict[int, tuple] = {}
    while len(sampled) < len(admitted):
      live = [i for i in range(len(admitted)) if i not in sampled]
      for group in (live[g:g + rows_max] for g in range(0, len(live), rows_max)):
        pieces = [pending[i][done[i]:done[i] + chunk_max] for i in group]
        chunk = next(b for b in self.cfg.prefill_buckets if b >= max(map(len, pieces)))
        rows = next(b for b in self.cfg.prefill_row_buckets if b >= len(group))
        rows_B = np.full(rows, self.cfg.slots, np.int32)
        tokens_BxC, mask_BxC = np.zeros((rows, chunk), np.int32), np.zeros((rows, chunk), np.int32)
        start_B, seed_B = np.zeros(rows, np.int32), np.zeros(rows, np.uint32)
        for b, (i, piece) in enumerate(zip(group, pieces)):
          episode = admitted[i]
          rows_B[b], start_B[b], seed_B[b] = episode.slot, episode.cache_len + done[i], episode.seed
          tokens_BxC[b, :len(piece)], mask_BxC[b, :len(piece)] = piece, 1
        self._cache, token_B, logp_B = self._steps.prefill(
            self._params, self._cache, self._pool.table_NxM, rows_B, tokens_BxC, mask_BxC,
            start_B, seed_B)
        self.stats["prefill_calls"] += 1
        self.stats["prefill_rows"] += len(group)
        for b, (i, piece) in enumerate(zip(group, pieces)):
          done[i] += len(piece)
          if done[i] == len(pending[i]):
            sampled[i] = (token_B, logp_B, b)
    for i, episode in enumerate(admitted):
      episode.cache_len += len(pending[i])
    return {admitted[i].id: (np.asarray(token_B)[b], np.asarray(logp_B)[b])
            for i, (token_B, logp_B, b) in sampled.items()}

  def _decode(self, turns: list[Turn]) -> None:
    self._reserve_decode_pages()
    if self._active_N.any():
      super()._decode(turns)

  def _reserve_decode_pages(self) -> None:
    """Pages for every active slot's next decode call, oldest first; preempts the
    youngest active episode while they do not suffice."""
    for slot in sorted(np.flatnonzero(self._active_N), key=self._admitted_at.__getitem__):
      if not self._active_N[slot]:
        continue  # preempted for an older one in this loop
      episode = self._episodes[self._owner[slot]]
      need = min(len(episode.tokens) - 1 + self.cfg.steps_per_call, self.cfg.max_seq_len)
      while not self._get_pages(slot, need):
        youngest = max(np.flatnonzero(self._active_N), key=self._admitted_at.__getitem__)
        self._preempt(youngest)
        if youngest == slot:
          break

  def _decode_call(self, entries: int | None = None):
    # Only active slots' pages are listed, so parked caches cost no attention reads.
    table_NxM = np.where(self._active_N[:, None], self._pool.table_NxM, -1)
    if entries is None:
      listed = int((table_NxM >= 0).sum())
      entries = next(e for e in self._entry_buckets() if e >= listed)
    return self._steps.decode(self._params, self._cache, table_NxM, self._token_N,
                              self._active_N, self._budget_N, self._seed_N, entries=entries)

  def _extend_turn(self, episode: _Episode, tokens: np.ndarray, logps: np.ndarray,
                   turns: list[Turn]) -> None:
    super()._extend_turn(episode, tokens, logps, turns)
    if episode.state == "waiting":  # parked: keep only the pages its cache still uses
      self._pool.trim(episode.slot, episode.cache_len)
