"""Environment steps off the decode loop: a bounded pool of step threads.

  steps = EnvSteps(workers=4, timeout_s=30.0)
  steps.submit(episode_id, lambda: env.step(action))  # runs when a worker is free
  for episode_id, outcome in steps.collect(wait=False): ...  # a value or what the step raised
  steps.close(grace_s=5.0)

`EpisodeRunner` (`sao_jax.sampler.episodes`) hands every turn that ends to
`submit` and goes on decoding the other episodes; it picks the results up with
`collect` at its next step. The pool is built for environments that misbehave:

- At most `workers` steps run at once; the others wait in submission order
  (`backlog`). The threads are daemon threads kept between steps, started as
  needed up to `workers`: a thread per step would pay `Thread.start`, which
  waits for the new thread to be scheduled, on the runner's thread (measured:
  ~10 ms each on a loaded 2-core host, a third of the decode loop's time in
  benchmarks/env_overlap.py).
- A step that has run for more than `timeout_s` (counted from when it started,
  not from when it was queued) is *abandoned*: `collect` returns a
  `StepTimeout` for it and its worker is free at once. A Python thread cannot be
  killed, so the abandoned thread leaves the pool (a new one takes its place)
  and runs on until its step returns (its result is then dropped, the thread
  ends); `abandoned` counts them, and `stuck` says how many still run.
  Steps that can hang for good (an uninterruptible C call) belong in a process
  the environment can kill (the sandbox, the math checker's child).
- Stuck threads are bounded: when more than `workers` abandoned steps still run
  at once, `collect` raises `StuckSteps`. Their threads cannot be killed, but the
  process can: a sampler process ends with the error and its supervisor starts a
  fresh one (the threads die with the old process; the restart budget counts it
  as the crash it is). Without the bound an environment whose steps hang for good
  would leak a thread, and whatever it holds, per timeout for as long as the
  run lasts.
- Whatever a step raises is its outcome (the caller fails that episode), a
  `BaseException` that is not an `Exception` included: on a step thread a
  SystemExit or KeyboardInterrupt can only come from the step's own code (an
  environment calling `sys.exit`), since signals arrive on the main thread, so it
  ends that episode, never the process. Ctrl-C reaches the caller's thread as ever.
- `close` waits at most `grace_s` for running steps, then abandons them; being
  daemon threads, they never hold the process's exit.

Not thread-safe itself: call it from one thread (the runner's).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable, Hashable

THREAD_NAME = "env-step"


class StepTimeout(Exception):
  """An environment step ran past `env.step_timeout_s`."""


class StuckSteps(RuntimeError):
  """More abandoned environment steps still run than the pool tolerates (module
  docstring): the process must end for their threads to end."""


class EnvSteps:
  """A bounded pool of environment-step threads (module docstring)."""

  def __init__(self, workers: int, timeout_s: float = 0.0, *,
               clock: Callable[[], float] = time.monotonic):
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
      raise ValueError(f"workers={workers!r}: expected a positive number of step threads")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s < 0:
      raise ValueError(f"timeout_s={timeout_s!r}: expected seconds >= 0 (0: no timeout)")
    self.workers, self.timeout_s, self._clock = workers, float(timeout_s), clock
    self._waiting: collections.deque[tuple[Hashable, Callable[[], Any]]] = collections.deque()
    self._running: dict[Hashable, tuple[int, float]] = {}  # key -> (ticket, start)
    self._work: queue.SimpleQueue = queue.SimpleQueue()  # (ticket, key, step) or None: exit
    self._done: queue.SimpleQueue = queue.SimpleQueue()  # (key, ticket, outcome)
    self._threads: list[threading.Thread] = []  # started, not retired
    self._stuck: dict[int, threading.Thread] = {}  # abandoned ticket -> the thread running it
    # Which thread runs which ticket, and the tickets abandoned before any thread took
    # them; shared with the step threads, under the lock.
    self._lock = threading.Lock()
    self._ticket_thread: dict[int, threading.Thread] = {}
    self._cancelled: set[int] = set()
    self._tickets = 0
    self.abandoned = 0  # steps given up on (timed out, or still running at close)

  @property
  def pending(self) -> int:
    """Steps submitted whose outcome `collect` has not returned yet."""
    return len(self._waiting) + len(self._running)

  @property
  def backlog(self) -> int:
    """Steps waiting for a free worker (all `workers` busy)."""
    return len(self._waiting)

  @property
  def stuck(self) -> int:
    """Abandoned steps whose threads still run them."""
    return len(self._stuck)

  def submit(self, key: Hashable, step: Callable[[], Any]) -> None:
    """Queues `step()` for `key` (one step per key at a time)."""
    if key in self._running or any(k == key for k, _ in self._waiting):
      raise ValueError(f"episode {key!r} already has an environment step in flight")
    self._waiting.append((key, step))
    self._dispatch()

  def collect(self, *, wait: bool, timeout_s: float | None = None) -> list[tuple[Hashable, Any]]:
    """The outcomes ready now, in completion order, timeouts included; with `wait`,
    blocks until there is at least one (or nothing is pending), for at most
    `timeout_s` seconds of `time.monotonic` when given."""
    out = self._drain(block=False)
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while wait and not out and self.pending:
      deadline = self._next_deadline()
      left = None if deadline is None else max(deadline - self._clock(), 0.0)
      if end is not None:
        if (budget := end - time.monotonic()) <= 0:
          break
        left = budget if left is None else min(left, budget)
      out = self._drain(block=True, timeout=left)
    return out

  def close(self, grace_s: float = 5.0) -> list[Hashable]:
    """Drops unstarted steps, waits up to `grace_s` for running ones, abandons the
    rest and ends the idle threads; returns the keys abandoned (their threads run on)."""
    self._waiting.clear()
    end = self._clock() + grace_s
    while self._running and self._clock() < end:
      try:
        key, ticket, _ = self._done.get(timeout=max(end - self._clock(), 0.0))
      except queue.Empty:
        break
      if self._running.get(key, (None,))[0] == ticket:
        del self._running[key]  # returned in the grace: its outcome is dropped
    stuck = list(self._running)
    for key in stuck:
      self._abandon(key)
    for _ in self._threads:
      self._work.put(None)
    for thread in self._threads:
      thread.join(max(end - self._clock(), 0.1))
    self._threads = []
    return stuck

  def widen(self, workers: int) -> None:
    """Lets up to `workers` steps run at once from now on (never fewer than before); the
    steps waiting for a worker start now."""
    self.workers = max(self.workers, workers)
    self._dispatch()

  # ---- internals ----

  def _dispatch(self) -> None:
    while self._waiting and len(self._running) < self.workers:
      key, step = self._waiting.popleft()
      self._tickets += 1
      self._running[key] = (self._tickets, self._clock())
      if len(self._threads) < len(self._running):  # no idle thread: start one
        thread = threading.Thread(target=self._serve, daemon=True,
                                  name=f"{THREAD_NAME}-{self._tickets}")
        self._threads.append(thread)
        thread.start()
      self._work.put((self._tickets, key, step))

  def _serve(self) -> None:
    """A step thread: runs steps until told to exit, or until its step is abandoned."""
    me = threading.current_thread()
    while (item := self._work.get()) is not None:
      ticket, key, step = item
      with self._lock:
        if ticket in self._cancelled:
          self._cancelled.discard(ticket)
          continue
        self._ticket_thread[ticket] = me
      try:
        outcome = step()
      # The episode's failure, handed to the caller: SystemExit too (module docstring).
      except BaseException as error:
        outcome = error
      with self._lock:
        del self._ticket_thread[ticket]
        retired = self._stuck.pop(ticket, None) is not None
      self._done.put((key, ticket, outcome))
      if retired:
        return  # abandoned: a replacement took this thread's place

  def _drain(self, *, block: bool, timeout: float | None = None) -> list[tuple[Hashable, Any]]:
    out = []
    while True:
      try:
        first = block and not out
        key, ticket, outcome = (self._done.get(timeout=timeout) if first
                                else self._done.get_nowait())
      except queue.Empty:
        break
      running = self._running.get(key)
      if running is None or running[0] != ticket:
        continue  # an abandoned step that returned after all: dropped
      del self._running[key]
      out.append((key, outcome))
    out += self._expire()
    self._dispatch()
    self._check_stuck()
    return out

  def _check_stuck(self) -> None:
    with self._lock:
      stuck = len(self._stuck)
    if stuck > self.workers:
      raise StuckSteps(
          f"{stuck} environment steps still run past env.step_timeout_s={self.timeout_s:g} s "
          f"on threads that cannot be killed, more than the pool's {self.workers} step "
          "threads: the process stops so that they end with it (a sampler process is "
          "restarted by its supervisor). Make the environment's step return, or run what "
          "can hang in a subprocess it kills on a deadline")

  def _next_deadline(self) -> float | None:
    if not self.timeout_s or not self._running:
      return None
    return min(start for _, start in self._running.values()) + self.timeout_s

  def _expire(self) -> list[tuple[Hashable, StepTimeout]]:
    if not self.timeout_s:
      return []
    now, out = self._clock(), []
    for key, (_, start) in list(self._running.items()):
      if now - start >= self.timeout_s:
        self._abandon(key)
        out.append((key, StepTimeout(f"the environment step ran past env.step_timeout_s="
                                     f"{self.timeout_s:g} s; its episode is failed and the "
                                     "step's thread abandoned")))
    return out

  def _abandon(self, key: Hashable) -> None:
    """Gives up on `key`'s running step: its thread leaves the pool (it exits once the
    step returns) and the next dispatch starts a replacement."""
    ticket, _ = self._running.pop(key)
    self.abandoned += 1
    with self._lock:
      thread = self._ticket_thread.get(ticket)
      if thread is None:  # no thread took it yet (or it just returned): never run it
        self._cancelled.add(ticket)
        return
      self._stuck[ticket] = thread
    self._threads.remove(thread)
