"""Bounded directory walks over an agent's working copy (list, search, grading).

`walk(root)` lists the directories and regular files under `root` without
recursion (an explicit stack, so 1200 nested directories cost no Python stack),
never following links, and raises `WalkLimit` (with a message for the agent)
as soon as the tree has more than `MAX_ENTRIES` entries, is deeper than
`MAX_DEPTH`, has a path longer than `MAX_PATH_BYTES`, holds more than
`MAX_TOTAL_BYTES` of files, or the walk takes longer than `TIME_BUDGET_S`. A
path the OS refuses (e.g. too long) is a `WalkLimit` too: the agent's files
caused it.

Path length counts UTF-8 bytes, as the OS does (`PATH_MAX` = 4096): a limit in
characters let 1024 four-byte characters through, a path that fits the working
copy but not the grading copy, whose directory name is longer (an environment
failure the agent could cause at will).
"""

from __future__ import annotations

import dataclasses
import os
import time

MAX_ENTRIES = 2000
MAX_DEPTH = 16
MAX_TOTAL_BYTES = 16 << 20
MAX_PATH_BYTES = 1024
TIME_BUDGET_S = 2.0


class WalkLimit(Exception):
  """The tree is over a limit (the message says which)."""


@dataclasses.dataclass(frozen=True, order=True)
class Entry:
  """A directory (`size` 0) or regular file, by its path relative to the root."""

  rel: str
  is_dir: bool
  size: int


def walk(root: str, *, max_entries: int = MAX_ENTRIES, max_depth: int = MAX_DEPTH,
         max_total_bytes: int = MAX_TOTAL_BYTES, budget_s: float = TIME_BUDGET_S) -> list[Entry]:
  """Every directory and regular file under `root`, sorted by path (see the module
  docstring for the limits)."""
  deadline = time.monotonic() + budget_s
  entries: list[Entry] = []
  total = 0
  stack = [("", 0)]
  while stack:
    rel, depth = stack.pop()
    try:
      with os.scandir(os.path.join(root, rel)) as listing:
        for item in listing:
          if time.monotonic() > deadline:
            raise WalkLimit(f"walking the files took longer than {budget_s:g} s")
          if len(entries) >= max_entries:
            raise WalkLimit(f"more than {max_entries} files and directories")
          path = os.path.join(rel, item.name)
          if len(os.fsencode(path)) > MAX_PATH_BYTES:
            raise WalkLimit(f"a path is longer than {MAX_PATH_BYTES} bytes")
          if item.is_dir(follow_symlinks=False):
            if depth + 1 > max_depth:
              raise WalkLimit(f"{path!r} is nested deeper than {max_depth} directories")
            entries.append(Entry(path, True, 0))
            stack.append((path, depth + 1))
          elif item.is_file(follow_symlinks=False):
            size = item.stat(follow_symlinks=False).st_size
            total += size
            if total > max_total_bytes:
              raise WalkLimit(f"the files hold more than {max_total_bytes} bytes")
            entries.append(Entry(path, False, size))
    except OSError as e:
      raise WalkLimit(f"cannot read {rel or '.'!r}: {e.strerror}") from None
  return sorted(entries)
