"""math-verify in a child process, so that no answer can stall or bloat the caller.

  verify(predicted, gold, timeout_s=..., deadline_s=...) -> True / False / None

A policy's answer is parsed and compared symbolically (sympy), and some short
answers make that explode: `2^{+99999999999}`, `(99999999)!`, a power of a
power. math-verify bounds its own work with `signal.alarm`, which works only on
the main thread (elsewhere its timeouts are off and such an answer runs
forever) and cannot interrupt one long C-level operation (a bigint multiply).
No pattern list catches every such answer, so the work runs in a small pool of
long-lived child interpreters (`_POOL_SIZE` per process, started as needed)
instead:

- the child runs math-verify on its main thread, with math-verify's own
  `timeout_s` per parse and per comparison, under `RLIMIT_AS = _MEMORY_BYTES`
  (a memory bomb is a `MemoryError` there, i.e. incorrect);
- the caller waits at most `deadline_s` for the verdict, then SIGKILLs the child
  and answers False (the answer made the checker stall: it is not accepted); the
  next call on that pool slot starts a fresh child;
- calls from several threads (the sampler's environment step threads) each take
  a free child, so one stalling answer holds one child, not every episode's
  check; with all `_POOL_SIZE` busy, a call waits for the first to be free.

The verdict is None when math-verify cannot parse one side (the caller then
falls back to its own comparison). A child that cannot start raises
`RuntimeError` (an environment failure, not reward 0).
"""

from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import sys
import time

_MEMORY_BYTES = 2 << 30
_START_S = 120.0  # importing sympy on a loaded host
_MAX_REPLY_BYTES = 64  # "true", "false", "null", "ready" and a newline
# One request per line: {"predicted", "gold", "timeout_s"}; one JSON verdict per line back.
_CHILD = r'''
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (%(memory)d, %(memory)d))
import math_verify
sys.stdout.write("\"ready\"\n")
sys.stdout.flush()
for line in sys.stdin:
  request = json.loads(line)
  timeout = request["timeout_s"]
  try:
    gold = math_verify.parse("\\boxed{%%s}" %% request["gold"], parsing_timeout=timeout)
    predicted = math_verify.parse("\\boxed{%%s}" %% request["predicted"], parsing_timeout=timeout)
    verdict = (None if not gold or not predicted else
               bool(math_verify.verify(gold, predicted, timeout_seconds=timeout)))
  except Exception:  # MemoryError, RecursionError, a parser bug: not accepted
    verdict = False
  sys.stdout.write(json.dumps(verdict) + "\n")
  sys.stdout.flush()
''' % {"memory": _MEMORY_BYTES}

# Children per process: each holds sympy (~100 MB); a few let checks overlap
# without one stalling answer holding the rest.
_POOL_SIZE = min(4, os.cpu_count() or 1)


class _Slot:
  """One pool place: its child, or None until a call starts one."""

  child: subprocess.Popen | None = None


def _new_pool(size: int = _POOL_SIZE) -> queue.LifoQueue:
  pool = queue.LifoQueue()  # last in, first out: warm children are reused first
  for _ in range(size):
    pool.put(_Slot())
  return pool


_free = _new_pool()


def start() -> None:
  """Starts a child unless one runs (environments call it when built, so that a
  missing math-verify fails at startup, not in every episode)."""
  slot = _free.get()
  try:
    _running(slot)
  finally:
    _free.put(slot)


def verify(predicted: str, gold: str, *, timeout_s: float, deadline_s: float) -> bool | None:
  """math-verify's verdict on `predicted` against `gold` (module docstring)."""
  slot = _free.get()  # blocks while every child is busy
  try:
    child = _running(slot)
    request = json.dumps({"predicted": predicted, "gold": gold, "timeout_s": timeout_s})
    try:
      os.write(child.stdin.fileno(), (request + "\n").encode())
      return _read_verdict(child, time.monotonic() + deadline_s)
    except (OSError, TimeoutError, ValueError):  # stalled, died, or an unreadable reply
      _stop(child)
      slot.child = None
      return False
  finally:
    _free.put(slot)


def _running(slot: _Slot) -> subprocess.Popen:
  """The slot's child, started if none runs; the caller holds the slot."""
  if slot.child is None:
    slot.child = _start()
  return slot.child


def _start() -> subprocess.Popen:
  child = subprocess.Popen([sys.executable, "-I", "-c", _CHILD], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
  try:
    if _read_verdict(child, time.monotonic() + _START_S) != "ready":
      raise ValueError("an unexpected first line")
  except (OSError, TimeoutError, ValueError) as error:
    _stop(child)
    raise RuntimeError(f"the math answer checker (math-verify in {sys.executable}) did not "
                       f"start: {error}; check that math-verify imports there") from None
  return child


def _read_verdict(child: subprocess.Popen, deadline: float):
  """The next JSON line `child` writes, by `deadline` (TimeoutError otherwise)."""
  fd, data = child.stdout.fileno(), b""
  while not data.endswith(b"\n"):
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([fd], [], [], left)[0]:
      raise TimeoutError("no verdict in time")
    chunk = os.read(fd, _MAX_REPLY_BYTES)
    if not chunk:
      raise OSError("the checker exited")
    data += chunk
    if len(data) > _MAX_REPLY_BYTES:
      raise ValueError("a reply too long to be a verdict")
  return json.loads(data)


def _stop(child: subprocess.Popen) -> None:
  child.kill()
  child.wait()
  child.stdin.close()
  child.stdout.close()
