"""Kernel isolation for one tool run: the bubblewrap (`bwrap`) command line.

`command(...)` wraps an interpreter command so that it runs in a fresh mount
namespace holding only

- read-only: `/usr` (with the `/lib*`, `/bin` links of a merged-/usr system),
  and the directories the caller names (the interpreter's prefix and stdlib,
  site-packages when allowed, the run's script directory, the files to copy in);
- writable: private tmpfs mounts for `/tmp`, `/dev/shm` and the work directory,
  each capped at `disk_bytes` by the kernel (`--size` before `--tmpfs`); they
  vanish with the run, so nothing the code writes outlives it;
- a fresh `/proc` (its own PID namespace) and a minimal `/dev`;

with every namespace unshared (no network: only a down loopback; own PID, IPC,
UTS, cgroup namespaces), a new session (no terminal to inject into), killed with
its parent, further user namespaces disabled (no private tmpfs the caps above
do not cover), uid/gid 65534 inside and no capabilities (`--cap-drop ALL`). When
the caller is root, it first drops to uid/gid nobody with `setpriv`, so outside
the namespace the code is an unprivileged user too (no `CAP_DAC_READ_SEARCH`,
and `RLIMIT_NPROC` applies, which the kernel ignores for uid 0). Files the code
must read are therefore read as "other": their directories must be world-
readable (`chmod o+rx`) and traversable, instead of granting capabilities.

`unavailable_reason()` runs a self-test once per process and says why isolation
cannot be used here (None when it works); the sandbox then refuses to run tools.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

NOBODY = 65534
HOW_TO_GET_IT = ("install bubblewrap (`apt-get install bubblewrap`) and run where user namespaces "
                 "work (not inside a container that forbids them), or set env.sandbox="
                 "'unisolated' to run tool code without kernel isolation (not for untrusted "
                 "policies)")
# Root drops to nobody before bwrap; --no-new-privs keeps it there.
_DROP_ROOT = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
              "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")
_MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _system_mounts() -> list[str]:
  """`/usr`, and the top-level links into it (or the directories themselves)."""
  args = ["--ro-bind", "/usr", "/usr"]
  for path in _MERGED_USR_LINKS:
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  return args


def command(inner: list[str], *, work_dir: str, copy_from: str | None, read_only: list[str],
            disk_bytes: int, env: dict[str, str]) -> list[str]:
  """`inner` wrapped in bwrap (see the module docstring). `work_dir` becomes an empty
  capped tmpfs (the cwd); `copy_from`, if given, is mounted read-only at
  `COPY_SOURCE` for the bootstrap to copy into it; `read_only` paths appear at the
  same place."""
  args = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
          "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL",
          "--new-session", "--die-with-parent", *_system_mounts()]
  args += ["--proc", "/proc", "--dev", "/dev"]
  # /tmp first: the read-only and work paths may lie below it.
  for path in ("/tmp", "/dev/shm"):
    args += ["--perms", "0700", "--size", str(disk_bytes), "--tmpfs", path]
  for path in read_only:
    args += ["--ro-bind", path, path]
  args += ["--perms", "0700", "--size", str(disk_bytes), "--tmpfs", work_dir]
  if copy_from is not None:
    args += ["--ro-bind", copy_from, COPY_SOURCE]
  args += ["--chdir", work_dir, "--clearenv"]
  for key, value in env.items():
    args += ["--setenv", key, value]
  prefix = list(_DROP_ROOT) if os.geteuid() == 0 else []
  return [*prefix, *args, "--", *inner]


# Where the files to copy into the work directory are mounted (read-only).
COPY_SOURCE = "/sao_copy_source"


@functools.cache
def unavailable_reason() -> str | None:
  """None if bwrap isolation works here, else why not and how to get it (cached)."""
  missing = [tool for tool in ("bwrap",) + (("setpriv",) if os.geteuid() == 0 else ())
             if shutil.which(tool) is None]
  if missing:
    return f"{' and '.join(missing)} not found on PATH; {HOW_TO_GET_IT}"
  python = os.path.realpath(sys.executable)
  roots = interpreter_roots()
  probe = command([python, "-I", "-S", "-B", "-c", "import os, json; print('ok')"],
                  work_dir="/sao_probe", copy_from=None, read_only=roots, disk_bytes=1 << 20,
                  env={"PATH": "/usr/bin:/bin"})
  try:
    result = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"the bwrap self-test could not run ({e}); {HOW_TO_GET_IT}"
  if result.returncode != 0 or result.stdout.strip() != b"ok":
    detail = result.stderr.decode("utf-8", "replace").strip()[-500:]
    return (f"the bwrap self-test failed (exit {result.returncode}: {detail}). If it cannot "
            f"read the interpreter, make {', '.join(roots)} and their parent directories "
            f"world-readable and traversable (chmod o+rx), since the sandbox reads them as "
            f"an unprivileged user; otherwise {HOW_TO_GET_IT}")
  return None


def interpreter_roots() -> list[str]:
  """Directories holding this interpreter and its stdlib (outside /usr)."""
  python = os.path.realpath(sys.executable)
  roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix),
           os.path.dirname(os.path.dirname(python))}
  return sorted(r for r in roots if not (r == "/usr" or r.startswith("/usr/")))
