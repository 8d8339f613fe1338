"""Who owns a leftover, and whether that owner still runs.

Host resources that outlive a SIGKILLed process (shared-memory weight blocks,
the sandbox's and coding episodes' scratch directories, per-run cgroups) carry
their owner in their name, and whoever starts next reclaims those of dead
owners. An owner is a process, named in one of two strengths:

- `running(pid)`: the pid alone (weight blocks, whose names predate the rest).
  A reused pid keeps a leftover until that process ends too; nothing live is
  ever removed.
- `token()` / `token_alive(text)`: `<pid namespace>.<pid>.<start time>`, the
  start time in clock ticks since boot (`/proc/<pid>/stat`, field 22). A pid
  reused by another process has another start time, so its owner is dead. A
  token from another pid namespace (another container sharing `/tmp`) is
  always taken as alive: its pid means nothing here.
"""

from __future__ import annotations

import os
import re

_TOKEN = re.compile(r"([0-9]{1,20})\.([0-9]{1,10})\.([0-9]{1,20})")


def running(pid: int) -> bool:
  """Whether `pid` is a live process (a zombie, killed but not yet reaped, is not)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:  # "pid (comm) state ..."; comm may hold spaces
      return f.read().rpartition(b")")[2].split()[0] != b"Z"
  except (OSError, IndexError):  # no procfs (not Linux), or it exited meanwhile
    return True


def start_time(pid: int) -> int | None:
  """When `pid` started, in clock ticks since boot; None without procfs or process."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      # After "(comm)": state is field 3, start time field 22, so index 19 here.
      return int(f.read().rpartition(b")")[2].split()[19])
  except (OSError, IndexError, ValueError):
    return None


def _pid_namespace() -> int:
  try:
    return os.stat("/proc/self/ns/pid").st_ino
  except OSError:  # no procfs: one namespace, as far as this module can tell
    return 0


def token(pid: int | None = None) -> str:
  """`<pid namespace>.<pid>.<start time>` of `pid` (default: this process)."""
  pid = os.getpid() if pid is None else pid
  return f"{_pid_namespace()}.{pid}.{start_time(pid) or 0}"


def token_alive(text: str) -> bool:
  """Whether the owner `text` (a `token()`) may still run: True unless its process is
  gone or its pid now names a later process, both in this pid namespace. Text that
  is not a token counts as alive (nothing is known about it)."""
  match = _TOKEN.fullmatch(text)
  if match is None:
    return True
  namespace, pid, started = map(int, match.groups())
  if namespace != _pid_namespace() or pid == 0:
    return True
  if not running(pid):
    return False
  now = start_time(pid)
  return now is None or started == 0 or now == started
