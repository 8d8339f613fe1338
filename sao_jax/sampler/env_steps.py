"""Environment steps off the decode loop: a bounded pool of step threads.

  steps = EnvSteps(workers=4, timeout_s=30.0)
  steps.submit(episode_id, lambda: env.step(action))  # runs when a worker is free
  for episode_id, outcome in steps.collect(wait=False): ...  # outcome: a value or an Exception
  steps.close(grace_s=5.0)

`EpisodeRunner` (`sao_jax.sampler.episodes`) hands every turn that ends to
`submit` and goes on decoding the other episodes; it picks the results up with
`collect` at its next step. The pool is built for environments that misbehave:

- At most `workers` steps run at once; the others wait in submission order
  (`backlog`). Each step runs on a daemon thread of its own, started when a
  worker is free (a thread costs ~0.1 ms, a tool call milliseconds to seconds).
- A step that has run for more than `timeout_s` (counted from when it started,
  not from when it was queued) is *abandoned*: `collect` returns a
  `StepTimeout` for it and its worker is free at once. A Python thread cannot be
  killed, so the abandoned thread runs on until its step returns (its result is
  then dropped); `abandoned` counts them, and `stuck` says how many still run.
  Steps that can hang for good (an uninterruptible C call) belong in a process
  the environment can kill (the sandbox, the math checker's child).
- An exception raised by a step is its outcome (the caller fails that episode);
  a `BaseException` that is not an `Exception` (KeyboardInterrupt, SystemExit)
  is re-raised by `collect` on the caller's thread.
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
    self._running: dict[Hashable, tuple[int, float, threading.Thread]] = {}  # key -> (ticket, start, thread)
    self._done: queue.SimpleQueue = queue.SimpleQueue()  # (key, ticket, outcome, is_base)
    self._abandoned_threads: list[threading.Thread] = []
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
    """Abandoned steps whose threads still run."""
    self._abandoned_threads = [t for t in self._abandoned_threads if t.is_alive()]
    return len(self._abandoned_threads)

  def submit(self, key: Hashable, step: Callable[[], Any]) -> None:
    """Queues `step()` for `key` (one step per key at a time)."""
    if key in self._running or any(k == key for k, _ in self._waiting):
      raise ValueError(f"episode {key!r} already has an environment step in flight")
    self._waiting.append((key, step))
    self._dispatch()

  def collect(self, *, wait: bool) -> list[tuple[Hashable, Any]]:
    """The outcomes ready now, in completion order, timeouts included; with `wait`,
    blocks until there is at least one (or nothing is pending)."""
    out = self._drain(block=False)
    while wait and not out and self.pending:
      deadline = self._next_deadline()
      left = None if deadline is None else max(deadline - self._clock(), 0.0)
      out = self._drain(block=True, timeout=left)
    return out

  def cancel(self, key: Hashable) -> None:
    """Drops `key`'s step: unstarted it never runs, running it is abandoned."""
    self._waiting = collections.deque((k, s) for k, s in self._waiting if k != key)
    if key in self._running:
      self._abandon(key)
      self._dispatch()

  def close(self, grace_s: float = 5.0) -> list[Hashable]:
    """Drops unstarted steps, waits up to `grace_s` for running ones, abandons the
    rest; returns the keys abandoned (their threads still run)."""
    self._waiting.clear()
    end = self._clock() + grace_s
    for key, (_, _, thread) in list(self._running.items()):
      thread.join(max(end - self._clock(), 0.0))
    stuck = [key for key, (_, _, thread) in self._running.items() if thread.is_alive()]
    for key in stuck:
      self._abandon(key)
    self._running.clear()  # the others returned in the grace: their outcomes are dropped
    while True:  # what finished is dropped
      try:
        self._done.get_nowait()
      except queue.Empty:
        break
    return stuck

  # ---- internals ----

  def _dispatch(self) -> None:
    while self._waiting and len(self._running) < self.workers:
      key, step = self._waiting.popleft()
      self._tickets += 1
      ticket = self._tickets
      thread = threading.Thread(target=self._run, args=(key, ticket, step), daemon=True,
                                name=f"{THREAD_NAME}-{ticket}")
      self._running[key] = (ticket, self._clock(), thread)
      thread.start()

  def _run(self, key: Hashable, ticket: int, step: Callable[[], Any]) -> None:
    try:
      outcome, is_base = step(), False
    except Exception as error:  # the episode's failure, handed to the caller
      outcome, is_base = error, False
    except BaseException as error:  # KeyboardInterrupt, SystemExit: the caller's
      outcome, is_base = error, True
    self._done.put((key, ticket, outcome, is_base))

  def _drain(self, *, block: bool, timeout: float | None = None) -> list[tuple[Hashable, Any]]:
    out, base = [], None
    while True:
      try:
        key, ticket, outcome, is_base = (self._done.get(timeout=timeout) if block and not out
                                         else self._done.get_nowait())
      except queue.Empty:
        break
      running = self._running.get(key)
      if running is None or running[0] != ticket:
        continue  # an abandoned step that returned after all: dropped
      del self._running[key]
      if is_base:
        base = base or outcome
      else:
        out.append((key, outcome))
    out += self._expire()
    self._dispatch()
    if base is not None:
      raise base
    return out

  def _next_deadline(self) -> float | None:
    if not self.timeout_s or not self._running:
      return None
    return min(start for _, start, _ in self._running.values()) + self.timeout_s

  def _expire(self) -> list[tuple[Hashable, StepTimeout]]:
    if not self.timeout_s:
      return []
    now, out = self._clock(), []
    for key, (_, start, _) in list(self._running.items()):
      if now - start >= self.timeout_s:
        self._abandon(key)
        out.append((key, StepTimeout(f"the environment step ran past env.step_timeout_s="
                                     f"{self.timeout_s:g} s; its episode is failed and the "
                                     "step's thread abandoned")))
    return out

  def _abandon(self, key: Hashable) -> None:
    _, _, thread = self._running.pop(key)
    self.abandoned += 1
    self._abandoned_threads.append(thread)
