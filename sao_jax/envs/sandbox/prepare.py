"""Prepares this machine for the sandbox: `python -m sao_jax.envs.sandbox.prepare`.

Tool code runs as an unprivileged user (`bwrap`: uid nobody, no capabilities),
so the interpreter and stdlib it executes must be reachable by "other": every
directory from `/` down to them needs the traverse bit (o+x). Interpreters
installed under a private home (pyenv in `/root`, mode 0700) lack it. Run as
root, this adds o+x (traverse only: listing stays forbidden) to exactly those
directories and says which; otherwise it prints the command to run. Then it
runs the sandbox self-test and reports whether isolation works here.
`make test` and `make demo` call it.
"""

from __future__ import annotations

import os
import pathlib
import stat
import sys

from sao_jax.envs.sandbox import bwrap


def untraversable(roots: list[str]) -> list[pathlib.Path]:
  """The directories on the way to (and including) `roots` that others cannot traverse."""
  blocked: list[pathlib.Path] = []
  for root in roots:
    path = pathlib.Path(root)
    for directory in (*reversed(path.parents), path):
      if not directory.stat().st_mode & stat.S_IXOTH and directory not in blocked:
        blocked.append(directory)
  return blocked


def make_traversable(directories: list[pathlib.Path]) -> None:
  """Adds o+x (traverse, not list) to each of `directories`."""
  for directory in directories:
    directory.chmod(directory.stat().st_mode | stat.S_IXOTH)


def main() -> int:
  blocked = untraversable(bwrap.interpreter_roots())
  if blocked and os.geteuid() == 0:
    make_traversable(blocked)
    print(f"sandbox: made {', '.join(map(str, blocked))} traversable by others (o+x), so "
          "tool code running as nobody can reach the interpreter")
  elif blocked:
    print(f"sandbox: tool code runs as an unprivileged user and cannot reach the interpreter; "
          f"run: sudo chmod o+x {' '.join(map(str, blocked))}", file=sys.stderr)
  reason = bwrap.unavailable_reason()
  if reason is None:
    print("sandbox: kernel isolation (bwrap) works here")
  else:
    print(f"sandbox: tool execution will be refused: {reason}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
