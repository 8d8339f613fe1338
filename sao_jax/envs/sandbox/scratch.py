"""Scratch directories in `$TMPDIR` that name their owner, and their reclaiming.

A tool run (`sao_sandbox_`), a coding episode (`sao_coding_`) and the sandbox
self-test (`sao_probe_`) each work in a directory of their own, deleted when
they end. A process SIGKILLed meanwhile cannot delete it: three killed coding
episodes left 6 directories / 82 MiB, each with a copy of the working tree. So
each is named `<prefix><owner>_<random>` (`owner.token()`: pid namespace, pid,
start time), and `reclaim()`, run whenever an environment is created, deletes
those whose owner is gone (as a new learner unlinks a dead one's weight blocks).

Only directories of this user are touched, never through a link: `$TMPDIR` is
shared, and a link planted under such a name must not steer the deletion.
Directories from before owners were named (no token) are left alone.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile

from sao_jax import owner
from sao_jax.envs.sandbox.files import remove_tree

PREFIXES = ("sao_sandbox_", "sao_coding_", "sao_probe_")
_NAME = re.compile(r"(?P<prefix>%s)(?P<owner>[0-9.]+)_" % "|".join(map(re.escape, PREFIXES)))


def make(prefix: str, directory: str | None = None) -> str:
  """A new, private (0700) scratch directory `<prefix><owner>_<random>`; its real path."""
  if prefix not in PREFIXES:
    raise ValueError(f"prefix={prefix!r} is not a scratch prefix ({', '.join(PREFIXES)})")
  return os.path.realpath(tempfile.mkdtemp(prefix=f"{prefix}{owner.token()}_", dir=directory))


def reclaim(directory: str | None = None) -> list[str]:
  """Deletes the scratch directories in `directory` (default `$TMPDIR`) whose owner
  process is gone; returns their names. Missing directory: nothing to do."""
  directory = tempfile.gettempdir() if directory is None else directory
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  reclaimed = []
  uid = os.geteuid()
  for name in sorted(names):
    match = _NAME.match(name)
    if match is None or owner.token_alive(match["owner"]):
      continue
    path = os.path.join(directory, name)
    try:
      info = os.lstat(path)
    except FileNotFoundError:  # another process reclaimed it first
      continue
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
      continue
    remove_tree(path)
    if not os.path.lexists(path):
      reclaimed.append(name)
  return reclaimed
