"""Checks this machine for the sandbox: `python -m sao_jax.envs.sandbox.prepare`.

It changes nothing on the host. Tool code runs as an unprivileged user
(`bwrap`: uid nobody, no capabilities); the interpreter's executable, shared
library and stdlib reach it through bind mounts the sandbox's prelude makes
(as root, or as root of the caller's own user namespace) in a mount namespace
that dies with the run, so an interpreter under a private home (pyenv in a
0700 `/root`) works without opening that home to anyone: an earlier version
made `/root` o+x for good, after which every local user could open the
world-readable files with guessable names under it.

What it prints: which kernel isolation runs tool code here, or why none can
and what would fix it (e.g. a `TMPDIR` that the sandbox's user cannot
traverse); how a run's memory is bounded (`bwrap.memory_mode`: the seccomp
filter of `seccomp`, or rlimits alone); the interpreter paths the sandbox
binds; and the site-packages directories it hides. `make test` and `make demo` call it.
"""

from __future__ import annotations

import sys

from sao_jax.envs.sandbox import bwrap


def main() -> int:
  paths = bwrap.interpreter_paths()
  print(f"sandbox: the interpreter reaches tool code through read-only bind mounts of "
        f"{', '.join(paths) or 'nothing outside /usr'}; no permissions are changed")
  hidden = bwrap.hidden_paths(paths)
  if hidden:
    print(f"sandbox: hidden from tool code (env.tool.site_packages=False): {', '.join(hidden)}")
  reason = bwrap.unavailable_reason()
  if reason is None:
    print("sandbox: kernel isolation (bwrap) works here")
    print(f"sandbox: memory of a tool run is bounded by {bwrap.memory_mode()}")
  else:
    print(f"sandbox: tool execution will be refused: {reason}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
