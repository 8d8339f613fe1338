"""One engine over several hosts: the leader's engine calls, replayed by every process.

  distributed.join(address, processes, process_id, ...)   # every process, before any JAX call
  mesh = make_mesh(cfg.sampler_mesh(), jax.devices())     # one mesh over all processes' devices
  engine = make_engine(cfg.sampler, cfg.model, params, chat, mesh=mesh)
  group = Group(timeout_s=cfg.sampler.group_timeout_s)
  if group.leader:                        # process 0: the EpisodeRunner drives this
    engine = LeaderEngine(engine, group)  #   same API as the engine it wraps
    ...; engine.close()                   #   the followers' `follow` returns
  else:
    follow(engine, group, params_for=store.take)  # replays the leader's calls until close

Every process of a multi-controller JAX program must launch the same programs
in the same order, and the engine's programs (prefill, decode) follow from its
host state (queue, slots, pages), which follows from the calls made into it. So
the leader broadcasts the calls, not the programs: `LeaderEngine` is the one
seam, recording each call that changes the engine's state (submit, dispatch,
complete, finish, set_params, warmup) and sending the calls recorded since the
last send, in order, through the distributed runtime's key-value store
(message n under key `sao/engine/<n>`) right before each call that launches a
device program (dispatch, set_params, warmup); every follower reads message n,
makes the same calls on its own engine and so runs the same programs in the same
order. Calls that launch nothing (submit, finish, complete) run on the leader
first and are recorded only if they succeeded, so a refused call is not replayed.
Reads (busy, room, version, stats, ...) are local: every engine holds the same
state. Outputs the host reads (tokens, behavior_logp) come back replicated
(`sao_jax.sharding.mesh.host_outputs`), so every process records the same
episodes; only the leader hands trajectories over.

Cost: one key-value write per engine step on the leader and one blocking read
per follower (a round trip to the coordinator), plus the replicated outputs'
all-gather inside the programs (benchmarks/multihost_sampler.py measures both).

Weights: every process receives each version from the learner's channel itself
and announces it (`Group.announce`, key `sao/held/<process>/<version>`);
`LeaderEngine.set_params` waits until every process announced the version, then
broadcasts it, and each process places its own shards (`Engine._place`). So a
version is adopted by all processes in the same engine step, or by none.

Failure as one unit: the group ends when any process dies or stalls. A follower
waits at most `timeout_s` for the next message (the leader's beat thread sends an
empty one while it is busy elsewhere); a device call (but a warmup, which compiles) that does not return within `timeout_s`
(a peer gone from a collective) is a stall (`Watchdog`); an error from the
runtime (a peer's connection reset) is re-raised as `GroupFailed`; the runtime
ends every process whose peer stopped sending heartbeats. The sampler process
then reports the episodes in flight as dropped and exits; its supervisor starts
it again and the group re-forms (`sao_jax.sampler.worker`).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import TYPE_CHECKING, Callable, Hashable, Sequence

import numpy as np

if TYPE_CHECKING:
  from sao_jax.sampler.engine import Engine, Generation, InFlight, Turn

KEY = "sao/engine"  # the key-value store's directory for this group's messages
# The engine attributes the leader reads from its own engine (no broadcast needed:
# every process's engine holds the same state).
_READS = frozenset({"cfg", "busy", "queued", "version", "room", "stats", "seconds",
                    "overlaps_host", "ready", "free_pages", "kv_layout"})


# How long a follower waits for its engine's first message.
START_TIMEOUT_S = 600.0
# Sent messages are dropped from the store in batches of at least this many.
_FORGET_EVERY = 16


class GroupFailed(RuntimeError):
  """The multi-host engine group ended: a process died, stalled or diverged."""


def _client():
  """The distributed runtime's client (jax keeps it in `jax._src.distributed`: no
  public accessor; jax's own checkpointing reads it there too)."""
  from jax._src import distributed

  if distributed.global_state.client is None:
    raise RuntimeError("a multi-host engine needs jax.distributed: join the group first "
                       "(sao_jax.sharding.distributed.join, or sao-sampler --coordinator)")
  return distributed.global_state.client


class Group:
  """This process's place in a multi-host engine group: messages and version
  announcements through the distributed runtime's key-value store."""

  def __init__(self, *, timeout_s: float, client=None, process_id: int | None = None,
               processes: int | None = None):
    """`client`, `process_id`, `processes`: the runtime's (None), or a stand-in's."""
    import jax

    if timeout_s <= 0:
      raise ValueError(f"timeout_s={timeout_s} must be > 0")
    self.client = _client() if client is None else client
    self.process_id = jax.process_index() if process_id is None else process_id
    self.processes = jax.process_count() if processes is None else processes
    self.timeout_s = float(timeout_s)
    # Messages are numbered over the group's life, whichever engine sends them.
    self._sent = self._received = 0
    self._lock = threading.Lock()

  @property
  def leader(self) -> bool:
    return self.process_id == 0

  def send(self, payload: bytes) -> int:
    """Sends the next message (the leader); its number."""
    with self._lock:
      seq = self._sent
      self.client.key_value_set_bytes(f"{KEY}/{seq}", payload)
      self._sent += 1
    return seq

  def receive(self, timeout_s: float | None = None) -> bytes:
    """The next message (a follower); GroupFailed when it does not come within
    `timeout_s` (None: the group's)."""
    seq, timeout_s = self._received, timeout_s or self.timeout_s
    try:
      payload = self.client.blocking_key_value_get_bytes(f"{KEY}/{seq}", int(timeout_s * 1000))
    except Exception as error:  # the runtime raises its own XlaRuntimeError kinds
      raise GroupFailed(f"process {self.process_id}: no engine message {seq} from the leader "
                        f"within {timeout_s:g} s ({error})") from error
    self._received += 1
    return payload

  def forget(self, seq: int) -> None:
    """Drops message `seq` from the store (every follower has read it)."""
    self.client.key_value_delete(f"{KEY}/{seq}")

  def announce(self, version: int) -> None:
    """This process holds `version`'s weights."""
    self.client.key_value_set(f"sao/held/{self.process_id}/{int(version)}", "1")

  def held_by_all(self, version: int) -> bool:
    """Whether every process announced `version`."""
    for process in range(self.processes):
      try:
        self.client.key_value_try_get(f"sao/held/{process}/{int(version)}")
      except Exception:  # not there (yet): the runtime raises NOT_FOUND
        return False
    return True


class Watchdog:
  """Calls `on_stall(what)` (on its own thread) when a guarded call runs past `timeout_s`."""

  def __init__(self, timeout_s: float, on_stall: Callable[[str], None]):
    self.timeout_s, self._on_stall = timeout_s, on_stall
    self._call: tuple[str, float] | None = None
    self._done = threading.Event()
    threading.Thread(target=self._watch, daemon=True, name="engine-watchdog").start()

  @contextlib.contextmanager
  def guard(self, what: str):
    self._call = (what, time.monotonic())
    try:
      yield
    finally:
      self._call = None

  def _watch(self) -> None:
    while not self._done.wait(min(1.0, self.timeout_s / 4)):
      call = self._call
      if call is not None and time.monotonic() - call[1] > self.timeout_s:
        self._on_stall(f"{call[0]} ran past {self.timeout_s:g} s")
        return

  def close(self) -> None:
    self._done.set()


def _guarded(watchdog: Watchdog | None, what: str):
  return contextlib.nullcontext() if watchdog is None else watchdog.guard(what)


def _runtime_errors(call: Callable, what: str):
  """`call()`; an error from the runtime or a peer (not the engine's own refusals:
  ValueError, and RuntimeError naming a misuse) ends the group."""
  try:
    return call()
  except (ValueError, GroupFailed):
    raise
  except Exception as error:
    if type(error) is RuntimeError:  # the engine's misuse errors (dispatch twice, ...)
      raise
    raise GroupFailed(f"{what} failed: {error}") from error


def _id(episode_id: Hashable):
  if isinstance(episode_id, bool) or not isinstance(episode_id, (int, str)):
    raise ValueError(f"episode id {episode_id!r}: a multi-host engine's episode ids are ints "
                     "or strings (they are sent to the other processes as JSON)")
  return episode_id


class LeaderEngine:
  """The leader's engine, broadcasting every state-changing call (module docstring)."""

  def __init__(self, engine: Engine, group: Group, *, watchdog: Watchdog | None = None):
    if not group.leader:
      raise ValueError(f"process {group.process_id} is a follower: only process 0 leads")
    self._engine, self._group, self._watchdog = engine, group, watchdog
    self._calls: list[list] = []
    self._unread: list[int] = []  # messages not yet known to be read by every follower
    self._sent_with_call = -1  # the message of the last call that launched device programs
    self._forgotten = 0  # messages dropped from the store
    self.broadcast_s = 0.0  # host seconds spent sending (benchmarks)
    # The beat thread sends empty messages; the lock keeps message numbers in order.
    self._lock, self._closed = threading.Lock(), threading.Event()
    self._last_send = time.monotonic()
    threading.Thread(target=self._beat, daemon=True, name="engine-beat").start()

  def __getattr__(self, name: str):
    if name not in _READS:
      raise AttributeError(f"LeaderEngine has no {name!r}: state changes go through its "
                           "broadcast methods, reads are listed in multihost._READS")
    return getattr(self._engine, name)

  @property
  def messages(self) -> int:
    """Messages this engine sent."""
    return len(self._unread) + self._forgotten

  def _send(self, calls: list[list]) -> int:
    """Sends `calls` as the next message; its number."""
    start = time.perf_counter()
    payload = json.dumps(calls).encode()
    with self._lock:
      seq = _runtime_errors(lambda: self._group.send(payload), "sending an engine message")
      self._unread.append(seq)
      self._last_send = time.monotonic()
    self.broadcast_s += time.perf_counter() - start
    return seq

  def _beat(self) -> None:
    """Sends an empty message when nothing was sent for a third of the timeout: a
    leader busy elsewhere (an environment, a compile) is not taken for a dead one."""
    period = self._group.timeout_s / 3
    # A leader whose main thread ended (an exception, exit handlers running) is not busy.
    while not self._closed.wait(period / 4) and threading.main_thread().is_alive():
      if time.monotonic() - self._last_send > period:
        try:
          self._send([])
        except GroupFailed:  # the main thread meets the same failure at its next send
          return

  def _device(self, call: list, run: Callable, guard: bool = True):
    """Broadcasts `call` (with those recorded before it), then runs it here."""
    calls, self._calls = [*self._calls, call], []
    self._sent_with_call = self._send(calls)
    with _guarded(self._watchdog if guard else None, call[0]):
      return _runtime_errors(run, call[0])

  def submit(self, episode_id: Hashable, tokens: Sequence[int] | np.ndarray, *,
             seed: int | None = None, max_new_tokens: int | None = None) -> None:
    self._engine.submit(_id(episode_id), tokens, seed=seed, max_new_tokens=max_new_tokens)
    self._calls.append(["submit", episode_id, np.asarray(tokens).tolist(), seed, max_new_tokens])

  def finish(self, episode_id: Hashable) -> Generation:
    out = self._engine.finish(episode_id)
    self._calls.append(["finish", episode_id])
    return out

  def dispatch(self) -> InFlight:
    return self._device(["dispatch"], self._engine.dispatch)

  def complete(self, step: InFlight) -> list[Turn]:
    with _guarded(self._watchdog, "complete"):
      turns = _runtime_errors(lambda: self._engine.complete(step), "complete")
    self._calls.append(["complete"])
    if step.outputs is not None and len(self._unread) >= _FORGET_EVERY:
      # Every process has run this step's decode call (its outputs are all-gathered
      # over every process), so each has read every message up to its dispatch's.
      with self._lock:
        read = [seq for seq in self._unread if seq <= self._sent_with_call]
        self._unread = self._unread[len(read):]
      for seq in read:
        self._group.forget(seq)
      self._forgotten += len(read)
    return turns

  def step(self) -> list[Turn]:
    return self.complete(self.dispatch())

  def warmup(self) -> None:
    self._device(["warmup"], self._engine.warmup, guard=False)  # compiles: no time limit

  def set_params(self, params, version: int) -> None:
    """Adopts `version` once every process holds it (GroupFailed after `timeout_s`)."""
    deadline = time.monotonic() + self._group.timeout_s
    while not self._group.held_by_all(version):
      if time.monotonic() > deadline:
        raise GroupFailed(f"version {version}: not every process of the engine received it "
                          f"within {self._group.timeout_s:g} s")
      time.sleep(0.01)
    self._device(["set_params", int(version)], lambda: self._engine.set_params(params, version))

  def held_by_all(self, version: int) -> bool:
    return self._group.held_by_all(version)

  def close(self) -> None:
    """Ends the followers' `follow` (and this engine's beat)."""
    self._closed.set()
    calls, self._calls = [*self._calls, ["close"]], []
    self._send(calls)


def follow(engine: Engine, group: Group, *, params_for: Callable[[int], object],
           watchdog: Watchdog | None = None, stop: Callable[[], bool] = lambda: False) -> int:
  """Replays the leader's calls on this follower's `engine` until the leader closes
  (or `stop()`); returns the number of messages replayed. `params_for(version)`
  is this process's copy of an announced version. GroupFailed when a message does
  not come in time or a replayed call fails (the engines would diverge)."""
  if group.leader:
    raise ValueError("process 0 leads: wrap its engine in LeaderEngine instead")
  messages, in_flight = 0, None
  while not stop():
    # The first message comes once the leader has built its engine (params placed, the
    # cache allocated), which can take longer than a step may.
    calls = json.loads(group.receive(max(group.timeout_s, START_TIMEOUT_S) if not messages
                                     else None))
    messages += 1
    for name, *args in calls:
      if name == "close":
        return messages
      with _guarded(None if name == "warmup" else watchdog, name):  # compiles: no limit
        try:
          in_flight = _replay(engine, name, args, in_flight, params_for)
        except Exception as error:
          raise GroupFailed(f"process {group.process_id}: replaying {name} failed: "
                            f"{error}") from error
  return messages


def _replay(engine: Engine, name: str, args: list, in_flight, params_for):
  """Makes one recorded call; returns the step in flight after it."""
  if name == "submit":
    episode_id, tokens, seed, max_new_tokens = args
    engine.submit(episode_id, np.asarray(tokens, np.int64), seed=seed,
                  max_new_tokens=max_new_tokens)
  elif name == "finish":
    engine.finish(args[0])
  elif name == "dispatch":
    return engine.dispatch()
  elif name == "complete":
    engine.complete(in_flight)
    return None
  elif name == "set_params":
    engine.set_params(params_for(args[0]), args[0])
  elif name == "warmup":
    engine.warmup()
  else:
    raise ValueError(f"unknown engine call {name!r}")
  return in_flight
