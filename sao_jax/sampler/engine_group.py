"""A sampler process's part in one engine over several hosts (`sao-sampler --coordinator`).

  spec = GroupSpec("10.0.0.2:8476", processes=2, process_id=i).validate()
  spec.join(timeout_s)                     # first thing in the sampler process
  group = multihost.Group(timeout_s=...)   # after the engine is built on all devices
  lead(engine, group, first, ...)          # process 0: -> the LeaderEngine its runner drives
  follow_leader(engine, group, first, ...) # the others: replay until the leader closes

Every process polls the learner's weight channel itself (`sao_jax.sampler.worker`'s
poller) and announces each version it holds (`Versions`); the leader adopts a version
once every process announced it (`multihost.LeaderEngine.set_params`). The first
version is adopted that way too, before any episode: every process built its engine
with the first version it got, and a mesh's shards must all come from one version.
When the group ends (`multihost.GroupFailed`, or the watchdog: a call past
`sampler.group_timeout_s`) the process says how many episodes in flight it drops
and exits; its supervisor starts it again and it re-joins the group.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

from sao_jax.sampler import multihost

_POLL_S = 0.05  # between looks at the weight poller, on a follower's version thread
_KEPT_VERSIONS = 3  # versions a follower keeps for the leader to name (newest)
EXIT_GROUP_ENDED = 3  # a process whose group ended by a stall


@dataclasses.dataclass(frozen=True)
class GroupSpec:
  """Where a sampler process joins its engine group (the sao-sampler flags)."""

  address: str      # --coordinator: host:port of process 0
  processes: int    # --num-processes
  process_id: int   # --process-id

  def validate(self) -> "GroupSpec":
    host, _, port = self.address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f"--coordinator={self.address!r} is not HOST:PORT (process 0's host "
                       "and a free port, the same on every process)")
    if self.processes < 2:
      raise ValueError(f"--num-processes={self.processes}: one engine over several hosts "
                       "needs at least 2 processes (one host: leave --coordinator out)")
    if not 0 <= self.process_id < self.processes:
      raise ValueError(f"--process-id={self.process_id} is not in [0, --num-processes="
                       f"{self.processes})")
    return self

  def join(self, timeout_s: float) -> None:
    """Joins the group (jax.distributed); before any JAX computation. The runtime's
    heartbeat timeout is twice the group's, so the group's own checks, which count the
    episodes dropped, end it first."""
    from sao_jax.sharding import distributed

    distributed.join(self.address, self.processes, self.process_id,
                     heartbeat_s=max(1, round(2 * timeout_s)))


class Versions:
  """A follower's weight versions: taken from `poller` on a thread of its own,
  converted (`to_policy`) and announced to the group; `take(version)` hands one to
  the engine (older ones are dropped, at most `_KEPT_VERSIONS` are kept)."""

  def __init__(self, group: multihost.Group, poller, to_policy: Callable, first):
    self._group, self._poller, self._to_policy = group, poller, to_policy
    self._held: dict[int, Any] = {}
    self._lock, self._stop = threading.Lock(), threading.Event()
    self.error: BaseException | None = None
    self._add(first)
    self._thread = threading.Thread(target=self._run, daemon=True, name="sao-versions")
    self._thread.start()

  def _add(self, got) -> None:
    params, version = self._to_policy(got[0]), int(got[1])
    with self._lock:
      self._held[version] = params
      for old in sorted(self._held)[:-_KEPT_VERSIONS]:
        del self._held[old]
    self._group.announce(version)

  def _run(self) -> None:
    try:
      while not self._stop.wait(_POLL_S):
        got = self._poller.take()
        if got is not None:
          self._add(got)
    except BaseException as error:  # raised by the next take, on the replaying thread
      self.error = error

  def take(self, version: int):
    if self.error is not None:
      raise self.error
    with self._lock:
      for old in [v for v in self._held if v < version]:
        del self._held[old]
      return self._held[version]

  def close(self) -> None:
    self._stop.set()
    self._thread.join(1.0)


def _stalled(log: Callable[[str], None], in_flight: Callable[[], int]):
  """The watchdog's end of the group: the process cannot raise out of a call the
  runtime holds, so it reports and exits (its supervisor restarts it)."""
  from sao_jax.sampler.worker import exit_without_flushing

  def stall(what: str) -> None:
    log(f"engine group ended ({what}): {in_flight()} episodes in flight dropped")
    exit_without_flushing(EXIT_GROUP_ENDED)

  return stall


def lead(engine, group: multihost.Group, first, to_policy: Callable, *,
         log: Callable[[str], None], in_flight: Callable[[], int]) -> multihost.LeaderEngine:
  """The leader's engine: announces `first` (params, version), wraps `engine` and
  adopts `first` once every process holds it. `in_flight()` counts the episodes a
  stall drops."""
  group.announce(first[1])
  watchdog = multihost.Watchdog(group.timeout_s, _stalled(log, in_flight))
  leader = multihost.LeaderEngine(engine, group, watchdog=watchdog)
  leader.warmup()
  leader.set_params(to_policy(first[0]), first[1])
  log(f"leading one engine over {group.processes} processes")
  return leader


def follow_leader(engine, group: multihost.Group, first, poller, to_policy: Callable, *,
                  alive: Callable[[], bool], log: Callable[[str], None]) -> None:
  """Replays the leader's calls on `engine` until the leader closes or `alive()` fails."""
  versions = Versions(group, poller, to_policy, first)
  watchdog = multihost.Watchdog(group.timeout_s, _stalled(log, lambda: 0))
  log(f"following the leader as process {group.process_id} of {group.processes}")
  try:
    multihost.follow(engine, group, params_for=versions.take, watchdog=watchdog,
                     stop=lambda: not alive())
  except multihost.GroupFailed as error:
    log(f"engine group ended: {error}")
    raise
  finally:
    watchdog.close()
    versions.close()
