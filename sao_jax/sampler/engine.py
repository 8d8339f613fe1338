"""The rollout engine: continuous batching of multi-turn episodes over fixed slots.

  engine = Engine(sampler_cfg, model_cfg, params, version=0,
                  stop_token_ids=stop_token_ids(tokenizer, sampler_cfg.stop_tokens),
                  detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
  engine.warmup()                                 # compile every program once, up front
  engine.submit(episode_id, prompt_tokens, seed=s)  # a new episode; its first turn is queued
  turns = engine.step()                           # admit, decode; -> list[Turn] that ended
  pending = engine.dispatch()                     # the same step in two halves: admit and
  ...                                             #   launch the decode call, host work here,
  turns = engine.complete(pending)                #   then wait for it (below)
  engine.submit(episode_id, observation_tokens)   # continue an episode after its Turn
  generation = engine.finish(episode_id)          # -> Generation; its slot is freed
  engine.set_params(params, version)              # in-flight weight update, next step on

A worker drives it with text-level environments (`sao_jax.envs.base`):

  engine.submit(i, chat.prompt(env.reset(task)), seed=...)  # chat: sao_jax.chat.ChatFormat
  while engine.busy:
    for turn in engine.step():
      result = env.step(tok.decode(turn.tokens))
      if result.done: emit(engine.finish(turn.episode_id), result)
      else: engine.submit(turn.episode_id, chat.continuation(history, [observation], closed=...))

An episode's trajectory is every token in order: what was submitted (prompt,
observations, chat glue; action_mask 0, behavior_logp 0) and what was sampled
(action_mask 1, behavior_logp recorded), index t belonging to token t like
`sao_jax.types.Batch`. Not thread-safe: call everything from one thread.

Slots. The engine decodes `slots` rows at once, each holding one episode's KV
cache. When a turn ends its slot is *parked*: it keeps the episode's cache, so a
continuation only prefills the new tokens (the turn's last sampled token, which
is not yet in the cache, then the observation). Parked slots count as free: a
request that finds no empty slot evicts the longest-parked one, and that
episode's next turn re-prefills its whole trajectory into whatever slot it gets.
So no slot waits for the longest sequence or for a slow environment.

Turn ends: a stop token (kept as the turn's last token), a stop pattern
(regular expression on the turn's text; the turn ends at the token completing
the first match, later tokens are discarded and the cache rolled back), the
per-turn `max_new_tokens`, or the episode reaching `max_seq_len` tokens.

Static shapes: submitted tokens are prefilled in chunks padded to a prefill
bucket; decoding always runs all slots for `steps_per_call` steps. After
`warmup` nothing compiles again (tests/sampler counts compilations).

Sampling (`sampling`): the token at trajectory position t of an episode with seed
s uses key fold_in(key(s), t), so tokens do not depend on the slot or on the other
episodes in flight: continuous batching reproduces one-at-a-time generation. (A
continuation whose parked cache was evicted recomputes its prefix, which can differ
from the cached values in the last float bits.) `behavior_logp` is the log-prob
under the full temperature-scaled distribution, log_softmax(logits / T)[token],
not renormalised after top-k/top-p truncation: the learner reproduces exactly
that distribution with `policy_forward(..., temperature=T)`. It is the sampling
distribution only without truncation, which training configs therefore refuse
(`sampling` module docstring); evaluation may truncate (greedy top_k = 1).

KV layout: this engine keeps a dense row per slot (`sampler.kv_layout="dense"`);
`sao_jax.sampler.paged_engine.PagedEngine`, the sampler's engine, is the same
engine over a paged cache. This one is kept as the paged engine's exactness
reference (its tests compare tokens and behavior_logp against it) and for runs
whose every episode fills max_seq_len; `sao_jax.sampler.kv_layout` maps the
config's layout to the engine class and its device programs (`programs`).

Routing (MoE models): every token a decode step feeds the model (each sampled
token but a turn's last, which enters the cache with the next prefill, if any)
records the experts each MoE layer routed it to (`sao_jax.models.moe.route`);
`Generation.routed_experts` holds them, -1 where nothing was recorded: prompt
and observation tokens, which the sampler prefills and the learner routes freely
(docs/explanation/moe-routing.md), and those last sampled tokens. A token
re-prefilled after an eviction or preemption keeps what its decode recorded.

Versions: `set_params` takes effect at the next prefill or decode call; every
sampled token records the version that produced it, and turns and trajectories
report the first and last.

Host work beside the device: `step` is `complete(dispatch())`. `dispatch` admits
queued turns (their prefill waits for its first tokens) and launches the decode
call without waiting for it (jax dispatches asynchronously); `complete` waits for
its tokens and records them. Between the two the caller runs its host work
(environment outcomes, tokenising observations, `submit` of next turns, `finish`
of episodes not decoding) while the device decodes, instead of after it; where
`overlaps_host` says it pays: on an accelerator, not on the CPU backend, whose
decode call runs on the same cores as that host work (measured there with
benchmarks/env_overlap.py: the overlapped runner's sampled tokens/s fell from
3692 to 3244, the decode ratio from 0.889 to 0.807). What
the call reads is copied at dispatch (jax may alias host arrays it is given
until the computation ends), so host work cannot change it; a `set_params`, or
a `finish` of an episode the call is decoding, in between is refused (its tokens
would be recorded under the wrong version, or for an episode that is gone).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Callable, Hashable, Sequence

import jax
import numpy as np

from sao_jax.config import ModelConfig
from sao_jax.config.sampler import SamplerConfig
from sao_jax.models import moe
from sao_jax.models.transformer import Params, moe_layers, param_shardings
from sao_jax.sampler import steps as device_steps
from sao_jax.sampler.turn_text import TurnText
from sao_jax.sharding import distributed


@dataclasses.dataclass(frozen=True)
class Turn:
  """One assistant turn that ended; `tokens` are its sampled ids (int32 [n])."""

  episode_id: Hashable
  tokens: np.ndarray
  behavior_logp: np.ndarray       # float32 [n]
  finish_reason: str              # stop_token | stop_pattern | max_new_tokens | max_seq_len
  policy_versions: tuple[int, int]  # first and last version that sampled its tokens
  # Tokens of the episode before the turn (since its last `finish`: the current segment's
  # prompt, earlier turns and observations): the context the turn was sampled from.
  context_tokens: int


@dataclasses.dataclass(frozen=True)
class Generation:
  """A finished episode as the engine generated it, token-aligned like
  `sao_jax.types.Batch` ([T] each); `sampler.episodes` turns it into the
  `records.Trajectory` the learner trains on (with rewards and prompt id)."""

  episode_id: Hashable
  tokens: np.ndarray         # int32
  action_mask: np.ndarray    # int32, 1 on sampled tokens
  behavior_logp: np.ndarray  # float32, 0 off the action mask
  policy_versions: tuple[int, int] | None  # None if nothing was sampled
  num_turns: int
  # MoE: [T, L, k] experts of each MoE layer per token, -1 where not recorded (module
  # docstring, Routing), `moe.expert_index_dtype`; None for a dense model.
  routed_experts: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class InFlight:
  """A step between `Engine.dispatch` and `Engine.complete`: the turns its
  prefills ended, and its decode call's outputs (device arrays, possibly not yet
  computed; None when no slot decodes) for `slots`."""

  turns: list[Turn]
  outputs: tuple | None
  slots: np.ndarray


@dataclasses.dataclass
class _Episode:
  id: Hashable
  seed: int
  tokens: list[int] = dataclasses.field(default_factory=list)
  action_mask: list[int] = dataclasses.field(default_factory=list)
  behavior_logp: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)  # per token, -1 off the mask
  # MoE: per token, the [L, k] experts its decode step routed it to, or None (not recorded).
  experts: list = dataclasses.field(default_factory=list)
  state: str = "queued"  # queued -> generating -> waiting (for submit or finish)
  slot: int | None = None
  cache_len: int = 0     # tokens[:cache_len] are in the slot's cache
  turn_start: int = 0
  turn_budget: int = 0
  turn_text: TurnText | None = None  # the turn's text for stop patterns, decoded as it grows
  max_new_tokens: int = 0
  num_turns: int = 0


def stop_token_ids(tokenizer, names: Sequence[str]) -> tuple[int, ...]:
  """Ids of the stop tokens `names` (`SamplerConfig.stop_tokens`) this tokenizer defines."""
  ids = tuple(i for i in (tokenizer.token_to_id(name) for name in names) if i is not None)
  if names and not ids:
    raise ValueError(f"sampler.stop_tokens={tuple(names)!r}: none is a token of this tokenizer; "
                     "list its end-of-turn token (Qwen: '<|im_end|>')")
  return ids


class Engine:
  """Continuous-batching generation engine (module docstring)."""

  kv_layout = "dense"     # the sampler.kv_layout this engine runs
  programs = device_steps  # its device programs (interface: sao_jax.sampler.kv_layout)

  def __init__(self, cfg: SamplerConfig, model_cfg: ModelConfig, params: Params, *,
               version: int = 0, stop_token_ids: Sequence[int] = (),
               detokenize: Callable[[Sequence[int]], str] | None = None,
               mesh: jax.sharding.Mesh | None = None):
    cfg.validate()
    bad = [i for i in stop_token_ids if not 0 <= i < model_cfg.vocab_size]
    if bad:
      raise ValueError(f"stop_token_ids {bad} lie outside the vocabulary [0, {model_cfg.vocab_size})")
    if cfg.stop_patterns and detokenize is None:
      raise ValueError(f"sampler.stop_patterns={cfg.stop_patterns!r} need `detokenize` to read "
                       "the turn's text; pass one or set stop_patterns=()")
    self.cfg, self._vocab = cfg, model_cfg.vocab_size
    self._stops = frozenset(int(i) for i in stop_token_ids)
    self._patterns = [re.compile(p, re.DOTALL) for p in cfg.stop_patterns]
    self._detokenize = detokenize
    # MoE: the shape and dtype of one token's recorded experts (module docstring, Routing).
    self._routing = None
    if model_cfg.num_experts:
      self._routing = ((moe_layers(model_cfg), model_cfg.num_experts_per_tok),
                       moe.expert_index_dtype(model_cfg.num_experts))
    self._init_device(model_cfg, mesh)
    # Every params version is placed here: by the sharding rules on a mesh,
    # otherwise on the default device (arrays already on devices stay put).
    self._shardings = None if mesh is None else param_shardings(model_cfg, mesh)
    self._params, self._version = self._place(params), int(version)
    self._episodes: dict[Hashable, _Episode] = {}
    self._queue: list[Hashable] = []
    n = cfg.slots
    self._owner: list[Hashable | None] = [None] * n
    self._parked: dict[int, None] = {}  # insertion order = parking order
    self._token_N = np.zeros(n, np.int32)
    self._active_N = np.zeros(n, bool)
    self._budget_N = np.zeros(n, np.int32)
    self._seed_N = np.zeros(n, np.uint32)
    self.stats = {"prefill_calls": 0, "decode_calls": 0, "decode_steps": 0, "sampled_tokens": 0}
    # Host seconds in prefill (admitting turns, until their first tokens) and in decode
    # (launching the call, waiting for its tokens, recording them): `run.phases`.
    self.seconds = {"prefill": 0.0, "decode": 0.0}
    self._in_flight: InFlight | None = None  # between dispatch() and complete()
    # Host work gains from overlapping a call only where the call runs elsewhere: on
    # the CPU backend the "device" is the host's own cores (module docstring).
    platform = next(iter(jax.tree.leaves(self._params)[0].devices())).platform
    self.overlaps_host = platform != "cpu"

  def _init_device(self, model_cfg: ModelConfig, mesh: jax.sharding.Mesh | None) -> None:
    """The device programs and the empty cache of this engine's layout."""
    if self.cfg.kv_layout != self.kv_layout:
      raise ValueError(f"sampler.kv_layout={self.cfg.kv_layout!r} is not the layout of "
                       f"{type(self).__name__} ({self.kv_layout!r}): build engines with "
                       "sao_jax.sampler.episodes.make_engine, which picks the engine for the "
                       "config (sao_jax.sampler.kv_layout)")
    self._steps = self.programs.compile_steps(model_cfg, self.cfg, tuple(self._stops), mesh)
    self._cache = self.programs.new_cache(model_cfg, self.cfg, mesh)

  # ---- public API ----

  @property
  def busy(self) -> bool:
    """Whether `step` has work: queued turns or slots decoding."""
    return bool(self._queue) or bool(self._active_N.any())

  @property
  def queued(self) -> int:
    """Turns waiting for a slot (a preempted turn counts again until it resumes)."""
    return len(self._queue)

  @property
  def version(self) -> int:
    return self._version

  def set_params(self, params: Params, version: int) -> None:
    """New weights (same structure) for every call from the next one on."""
    if self._in_flight is not None:
      raise RuntimeError("set_params while a decode call is in flight: complete() it first "
                         "(its tokens are recorded with the version that sampled them)")
    self._params, self._version = self._place(params), int(version)

  def _place(self, params: Params) -> Params:
    if self._shardings is None:
      return jax.device_put(params)
    return distributed.place(params, self._shardings)  # on a mesh spanning processes too

  def room(self, episode_id: Hashable) -> int:
    """How many tokens `submit` may still append to this episode (one must stay free to sample)."""
    return self.cfg.max_seq_len - 1 - len(self._episode(episode_id).tokens)

  def submit(self, episode_id: Hashable, tokens: Sequence[int] | np.ndarray, *,
             seed: int | None = None, max_new_tokens: int | None = None) -> None:
    """Appends `tokens` (action_mask 0) and queues the episode's next turn.

    A new `episode_id` starts an episode (tokens = the prompt, `seed` required);
    a known one must be waiting after a `Turn` (tokens = the observation, may be
    empty). `max_new_tokens` overrides the config for this turn.
    """
    tokens = np.asarray(tokens, np.int64)
    if tokens.ndim != 1 or (tokens.size and not (0 <= tokens.min() and tokens.max() < self._vocab)):
      raise ValueError(f"episode {episode_id!r}: tokens must be a 1-D sequence of ids in "
                       f"[0, {self._vocab}); got shape {tokens.shape}")
    max_new = self.cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new <= 0:
      raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: expected a positive integer")
    episode = self._episodes.get(episode_id)
    if episode is None:
      if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"new episode {episode_id!r}: seed={seed!r} is invalid: expected an "
                         "integer in [0, 2**32)")
      if not tokens.size:
        raise ValueError(f"new episode {episode_id!r}: the prompt is empty; pass at least one token")
      episode = _Episode(episode_id, seed)
    elif episode.state != "waiting":
      raise ValueError(f"episode {episode_id!r} is {episode.state}; submit again only after its "
                       "Turn came out of step()")
    elif seed is not None:
      raise ValueError(f"episode {episode_id!r} already has seed {episode.seed}; omit seed=")
    free = self.cfg.max_seq_len - 1 - len(episode.tokens)
    if tokens.size > free:
      raise ValueError(f"episode {episode_id!r}: {tokens.size} new tokens exceed the {free} left "
                       f"by sampler.max_seq_len={self.cfg.max_seq_len}; finish the episode "
                       "(check room()) or raise max_seq_len")
    self._episodes[episode_id] = episode
    episode.tokens += tokens.tolist()
    episode.action_mask += [0] * tokens.size
    episode.behavior_logp += [0.0] * tokens.size
    episode.versions += [-1] * tokens.size
    episode.experts += [None] * tokens.size
    episode.state, episode.max_new_tokens = "queued", max_new
    self._queue.append(episode_id)

  def step(self) -> list[Turn]:
    """Fills free slots from the queue (prefill), then decodes `steps_per_call`
    tokens in every active slot; returns the turns that ended."""
    return self.complete(self.dispatch())

  def dispatch(self) -> InFlight:
    """`step`'s first half: admits queued turns (prefill) and launches the decode
    call of every active slot without waiting for it (module docstring)."""
    if self._in_flight is not None:
      raise RuntimeError("dispatch while a decode call is in flight: complete() it first")
    turns: list[Turn] = []
    start = time.perf_counter()
    self._admit(turns)
    admitted = time.perf_counter()
    outputs = self._dispatch_decode()
    self.seconds["prefill"] += admitted - start
    self.seconds["decode"] += time.perf_counter() - admitted
    self._in_flight = InFlight(turns, outputs, np.flatnonzero(self._active_N))
    return self._in_flight

  @staticmethod
  def ready(step: InFlight) -> bool:
    """Whether `complete(step)` would return without waiting for the device."""
    return step.outputs is None or all(out.is_ready() for out in step.outputs
                                       if out is not None)

  def complete(self, step: InFlight) -> list[Turn]:
    """`step`'s second half: waits for the decode call `dispatch` launched and
    records its tokens; returns the turns that ended."""
    if step is not self._in_flight:
      raise RuntimeError("complete() takes the step the last dispatch() returned, once")
    self._in_flight = None
    if step.outputs is not None:
      start = time.perf_counter()
      self._record_decode(step.outputs, step.slots, step.turns)
      self.seconds["decode"] += time.perf_counter() - start
    return step.turns

  def finish(self, episode_id: Hashable) -> Generation:
    """Ends the episode in any state (a turn in progress is cut where it is) and frees its slot."""
    episode = self._episode(episode_id)
    if (self._in_flight is not None and episode.slot is not None
        and episode.slot in self._in_flight.slots):
      raise RuntimeError(f"finish({episode_id!r}) while the decode call in flight decodes it: "
                         "complete() the step first")
    del self._episodes[episode_id]
    if episode.state == "queued":
      self._queue.remove(episode_id)
    if episode.slot is not None:
      self._release(episode.slot)
    sampled = [v for v in episode.versions if v >= 0]
    return Generation(episode_id=episode_id, tokens=np.asarray(episode.tokens, np.int32),
                      action_mask=np.asarray(episode.action_mask, np.int32),
                      behavior_logp=np.asarray(episode.behavior_logp, np.float32),
                      policy_versions=(sampled[0], sampled[-1]) if sampled else None,
                      num_turns=episode.num_turns, routed_experts=self._routed(episode))

  def _routed(self, episode: _Episode) -> np.ndarray | None:
    """The episode's recorded experts as [T, L, k], -1 where none was recorded."""
    if self._routing is None:
      return None
    shape, dtype = self._routing
    out = np.full((len(episode.tokens), *shape), -1, dtype)
    for t, experts in enumerate(episode.experts):
      if experts is not None:
        out[t] = experts
    return out

  def warmup(self) -> None:
    """Compiles every prefill bucket and the decode step (before any episode)."""
    if self._episodes:
      raise ValueError("warmup() must run before any episode is submitted")
    for bucket in self.cfg.prefill_buckets:
      chunk_1xC = np.zeros((1, bucket), np.int32)
      self._cache, token, _ = self._steps.prefill(
          self._params, self._cache, np.int32(0), chunk_1xC, np.ones_like(chunk_1xC),
          np.int32(0), np.uint32(0))
    self._cache, *outs = self._steps.decode(self._params, self._cache, self._token_N,
                                            self._active_N, self._budget_N, self._seed_N)
    jax.block_until_ready((token, outs))

  # ---- scheduling ----

  def _episode(self, episode_id: Hashable) -> _Episode:
    if episode_id not in self._episodes:
      raise ValueError(f"unknown episode {episode_id!r}: submit it first (finished episodes are gone)")
    return self._episodes[episode_id]

  def _admit(self, turns: list[Turn]) -> None:
    for episode_id in list(self._queue):
      episode = self._episodes[episode_id]
      slot = episode.slot if episode.slot is not None else self._claim_slot()
      if slot is None:
        continue  # no slot now; a later episode with a parked slot may still go
      self._queue.remove(episode_id)
      self._parked.pop(slot, None)
      self._start_turn(episode, slot, turns)

  def _claim_slot(self) -> int | None:
    """An empty slot, else the longest-parked one whose episode is not queued (evicted)."""
    for slot, owner in enumerate(self._owner):
      if owner is None:
        return slot
    for slot in self._parked:
      if self._episodes[self._owner[slot]].state != "queued":
        self._evict(slot)
        return slot
    return None

  def _evict(self, slot: int) -> None:
    """Frees a parked slot; its episode's next turn re-prefills its whole trajectory."""
    victim = self._episodes[self._owner[slot]]
    victim.slot, victim.cache_len = None, 0
    self._release(slot)

  def _release(self, slot: int) -> None:
    self._owner[slot] = None
    self._active_N[slot] = False
    self._parked.pop(slot, None)

  def _start_turn(self, episode: _Episode, slot: int, turns: list[Turn]) -> None:
    """Prefills the tokens missing from the slot's cache and samples the turn's first token."""
    episode.slot, self._owner[slot] = slot, episode.id
    largest = self.cfg.prefill_buckets[-1]
    pending = episode.tokens[episode.cache_len:]
    for begin in range(0, len(pending), largest):
      piece = pending[begin:begin + largest]
      bucket = next(b for b in self.cfg.prefill_buckets if b >= len(piece))
      chunk_1xC = np.zeros((1, bucket), np.int32)
      mask_1xC = np.zeros((1, bucket), np.int32)
      chunk_1xC[0, :len(piece)], mask_1xC[0, :len(piece)] = piece, 1
      self._cache, token, logp = self._steps.prefill(
          self._params, self._cache, np.int32(slot), chunk_1xC, mask_1xC,
          np.int32(episode.cache_len + begin), np.uint32(episode.seed))
      self.stats["prefill_calls"] += 1
    episode.cache_len = len(episode.tokens)
    self._begin_turn(episode, token, logp, turns)

  def _begin_turn(self, episode: _Episode, token, logp, turns: list[Turn]) -> None:
    """The turn's first token, sampled by the prefill of everything before it."""
    episode.state, episode.turn_start = "generating", len(episode.tokens)
    episode.turn_budget = min(episode.max_new_tokens, self.cfg.max_seq_len - len(episode.tokens))
    episode.turn_text = TurnText(self._detokenize) if self._patterns else None
    self._extend_turn(episode, np.asarray(token)[None], np.asarray(logp)[None], turns)

  def _decode_call(self):
    return self._steps.decode(self._params, self._cache, *self._slot_inputs())

  def _slot_inputs(self) -> tuple[np.ndarray, ...]:
    """The decode call's per-slot host inputs (token, active, budget, seed), copied:
    the call may read its host inputs until it ends, and host work between dispatch
    and complete changes these arrays (module docstring)."""
    return (self._token_N.copy(), self._active_N.copy(), self._budget_N.copy(),
            self._seed_N.copy())

  def _dispatch_decode(self) -> tuple | None:
    """Launches the decode call of the active slots (None: no slot is active)."""
    if not self._active_N.any():
      return None
    self._cache, *outputs = self._decode_call()
    return tuple(outputs)

  def _record_decode(self, outputs: tuple, slots: np.ndarray, turns: list[Turn]) -> None:
    tokens_KxN, logp_KxN, emitted_KxN = map(np.asarray, outputs[:3])
    experts_KxNxLxk = None if outputs[3] is None else np.asarray(outputs[3])
    self.stats["decode_calls"] += 1
    self.stats["decode_steps"] += self.cfg.steps_per_call
    for slot in slots:
      emitted_K = emitted_KxN[:, slot]
      self._extend_turn(self._episodes[self._owner[slot]], tokens_KxN[emitted_K, slot],
                        logp_KxN[emitted_K, slot], turns,
                        None if experts_KxNxLxk is None else experts_KxNxLxk[emitted_K, slot])

  def _extend_turn(self, episode: _Episode, tokens: np.ndarray, logps: np.ndarray,
                   turns: list[Turn], experts: np.ndarray | None = None) -> None:
    """Records sampled tokens; ends the turn or (re)arms the slot for the next decode call.

    `experts` ([n, L, k], from a decode call): the routing of the n tokens its steps
    fed, the slot's armed token (the episode's last) and all new ones but the last.
    """
    n_before = len(episode.tokens) - episode.turn_start
    if len(tokens):
      fed = [None] * len(tokens) if experts is None else list(experts)
      if experts is not None:
        episode.experts[-1] = fed[0]
      episode.experts += fed[1:] + [None]  # the newest token is fed by the next call
    episode.tokens += tokens.tolist()
    episode.action_mask += [1] * len(tokens)
    episode.behavior_logp += logps.tolist()
    episode.versions += [self._version] * len(tokens)
    self.stats["sampled_tokens"] += len(tokens)
    end = self._turn_end(episode, n_before)
    slot = episode.slot
    if end is None:
      self._arm(episode)
      return
    kept, reason = end
    cut = episode.turn_start + kept
    for field in (episode.tokens, episode.action_mask, episode.behavior_logp, episode.versions,
                  episode.experts):
      del field[cut:]
    episode.cache_len = cut - 1  # the last kept token is (re)written by the next prefill
    episode.state, episode.num_turns = "waiting", episode.num_turns + 1
    self._active_N[slot] = False
    self._parked[slot] = None
    versions = episode.versions[episode.turn_start:]
    turns.append(Turn(episode_id=episode.id,
                      tokens=np.asarray(episode.tokens[episode.turn_start:], np.int32),
                      behavior_logp=np.asarray(episode.behavior_logp[episode.turn_start:], np.float32),
                      finish_reason=reason, policy_versions=(versions[0], versions[-1]),
                      context_tokens=episode.turn_start))

  def _arm(self, episode: _Episode) -> None:
    """Its slot decodes on from the episode's last sampled token (not yet in the cache)."""
    slot = episode.slot
    self._token_N[slot], self._active_N[slot] = episode.tokens[-1], True
    self._budget_N[slot] = episode.turn_budget - (len(episode.tokens) - episode.turn_start)
    self._seed_N[slot] = episode.seed

  def _turn_end(self, episode: _Episode, n_before: int) -> tuple[int, str] | None:
    """(tokens the turn keeps, reason) if it ended within its newest tokens, else None."""
    turn = episode.tokens[episode.turn_start:]
    end = None
    if turn[-1] in self._stops:
      end = (len(turn), "stop_token")
    elif len(turn) >= episode.turn_budget:
      full = len(episode.tokens) >= self.cfg.max_seq_len
      end = (len(turn), "max_seq_len" if full else "max_new_tokens")
    # The turn's full decode, kept by `TurnText` from a few new tokens per call (a
    # full decode per call made long turns quadratic); a hit is confirmed on a full
    # decode (once per turn: it ends the turn), whose shortest matching prefix ends the
    # turn. A pattern cannot have matched before n_before, or the previous call would
    # have ended the turn there.
    text = episode.turn_text.extend(turn) if self._patterns else ""
    if any(p.search(text) for p in self._patterns) and self._matches(turn):
      kept = next((n for n in range(n_before + 1, len(turn)) if self._matches(turn[:n])), len(turn))
      if end is None or kept < end[0]:
        end = (kept, "stop_pattern")
    return end

  def _matches(self, tokens: list[int]) -> bool:
    text = self._detokenize(tokens)
    return any(p.search(text) for p in self._patterns)
