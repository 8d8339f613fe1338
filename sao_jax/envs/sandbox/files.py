"""Host-side tree operations of the sandbox, iterative so that deep trees (an
agent's 1200 nested directories) cost no Python stack."""

from __future__ import annotations

import os
import shutil


def remove_tree(path: str) -> None:
  """Deletes `path` and everything below it, best effort (errors are skipped, a
  missing path is fine), without recursion: a tree 1200 directories deep costs
  no Python stack (`shutil.rmtree` recurses)."""
  stack, failed = [path], set()
  while stack:
    top = stack[-1]
    try:
      with os.scandir(top) as listing:
        subdirs = []
        for item in listing:
          if item.is_dir(follow_symlinks=False):
            subdirs.append(item.path)
          else:
            os.unlink(item.path)
      subdirs = [d for d in subdirs if d not in failed]
      if subdirs:
        stack += subdirs
        continue
      os.rmdir(top)
    except OSError:
      failed.add(top)  # Not retried: its parent then fails too, and the walk ends.
    stack.pop()


def readable_copy(src: str, dst: str) -> None:
  """Copies the directories and regular files under `src` to `dst`, world-readable
  (the sandbox reads them as an unprivileged user); links and special files are
  left out. Iterative: deep trees cost no Python stack. The caller bounds `src`."""
  stack = [""]
  while stack:
    rel = stack.pop()
    os.mkdir(os.path.join(dst, rel), 0o755)
    with os.scandir(os.path.join(src, rel)) as listing:
      for item in listing:
        path = os.path.join(rel, item.name)
        if item.is_dir(follow_symlinks=False):
          stack.append(path)
        elif item.is_file(follow_symlinks=False):
          shutil.copyfile(item.path, os.path.join(dst, path))
          os.chmod(os.path.join(dst, path), 0o644)
