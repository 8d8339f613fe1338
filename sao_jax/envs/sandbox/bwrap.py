"""Kernel isolation for one tool run: the command line that starts it.

`command(...)` wraps an interpreter command so that it runs in a fresh mount
namespace holding only

- read-only: `/usr` (with the `/lib*`, `/bin` links of a merged-/usr system),
  and the paths the caller names (the interpreter's executable, shared library
  and stdlib, `interpreter_paths`; site-packages when allowed, the run's script
  directory, the files to copy in), with the interpreter's other site-packages
  directories shown empty (`hidden_paths`); the namespace's own root and `/dev`
  are remounted read-only too;
- writable: `/tmp`, `/dev/shm` and the work directory, each a private tmpfs
  capped by the kernel at `disk_bytes` of data and `max_files` files,
  directories and links (`size=`, `nr_inodes=`); since Linux 6.6 a tmpfs
  charges its user xattrs to the same inode budget (`nr_inodes` KiB), so one
  mount holds at most `disk_bytes + (max_files + 1)` KiB of host memory. They
  vanish with the run, so nothing the code writes outlives it;
- a minimal `/dev` with an empty `/dev/pts`, and no `/proc` (its `mountinfo`
  names the host paths of every bind; `/proc/cmdline` the host's boot line);

with every namespace unshared (no network: only a down loopback; own PID, IPC,
UTS, cgroup namespaces; no SysV shared memory, message queues or semaphores,
whose memory no rlimit or mount caps), a new session (no terminal to inject
into), killed with its parent, further user namespaces disabled, uid/gid 65534
inside and no capabilities (`--cap-drop ALL`): the code can neither unmount nor remount the
capped mounts (that needs `CAP_SYS_ADMIN` over them; they are also locked, being
made in a more privileged namespace than bwrap's). When the caller is root,
bwrap itself runs as uid/gid nobody (`setpriv`), so outside the namespace the
code is an unprivileged user too (no `CAP_DAC_READ_SEARCH`, and `RLIMIT_NPROC`
applies, which the kernel ignores for uid 0). The read-only paths are bound by
the prelude (below), which runs with the caller's rights, so nobody need
traverse the directories above them (an interpreter under a 0700 home works,
and no host permission is changed); what nobody must reach itself is each run's
scratch directory, so a root caller's `$TMPDIR` must be traversable by others
(the self-test says so otherwise). bwrap also loads the `seccomp` filter
(`seccomp_fd`) before it starts the code.

bwrap (0.8) cannot set `nr_inodes`, so the capped mounts are made before it
starts, by `_PRELUDE`: `unshare` gives it private IPC and mount namespaces (as
root) or user + IPC + mount namespaces (otherwise: it is root there and may
mount a tmpfs); it sets the IPC namespace's SysV limits to 0, mounts a tmpfs
on each mount point and binds each read-only path onto a point of its own
(`mount -a` of a per-run fstab), then execs bwrap, which binds them in. Those mounts exist only in that namespace, which dies with its
last process: nothing is left mounted after the run, even when the caller is
SIGKILLed.

`unavailable_reason()` runs a self-test once per process and says why isolation
cannot be used here (None when it works); the sandbox then refuses to run tools.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import shutil
import site
import stat
import subprocess
import sys
import sysconfig
import tempfile

from sao_jax.envs.sandbox import files, seccomp
from sao_jax.envs.sandbox import scratch as scratch_dirs

NOBODY = 65534
HOW_TO_GET_IT = ("install bubblewrap (`apt-get install bubblewrap`) and run where user namespaces "
                 "work (not inside a container that forbids them; on Ubuntu >= 23.10 as a "
                 "non-root user, `sysctl kernel.apparmor_restrict_unprivileged_userns=0`), or "
                 "set env.sandbox='unisolated' to run tool code without kernel isolation (not "
                 "for untrusted policies)")
# Root drops to nobody before bwrap; --no-new-privs keeps it there.
_DROP_ROOT = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
              "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs")
_MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Run by `sh` inside the prelude's namespaces as `sh -c _PRELUDE name FSTAB
# COMMAND...`: no SysV IPC objects in its IPC namespace (which the code shares;
# a kernel without SysV IPC has no such files), every mount FSTAB lists, then
# COMMAND. Any failure stops it (and so fails the self-test: no silent
# fallback, e.g. where /proc/sys is read-only). One `mount -a` rather than a
# `mount` per tmpfs: each run of `mount` costs a process start (~1-10 ms).
_PRELUDE = ('set -e; if [ -e /proc/sys/kernel/shmmni ]; then '
            'echo 0 > /proc/sys/kernel/shmmni; echo 0 > /proc/sys/kernel/msgmni; '
            'echo 0 0 0 0 > /proc/sys/kernel/sem; fi; mount -a -T "$1"; shift; exec "$@"')
# The capped mounts' points in the caller's `mount_points` directory (`command`
# says where the code sees each), next to the fstab listing them.
_MOUNT_POINTS = ("tmp", "shm", "work")
_FSTAB = "fstab"
_EMPTY = "empty"  # bound read-only over what the code must not see


def _system_mounts() -> list[str]:
  """`/usr`, and the top-level links into it (or the directories themselves)."""
  args = ["--ro-bind", "/usr", "/usr"]
  for path in _MERGED_USR_LINKS:
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  return args


def _fstab_field(text: str) -> str:
  """`text` as an fstab field: whitespace and backslashes as octal escapes."""
  return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in text)


def make_mount_points(parent: str) -> str:
  """Creates the empty directories the capped mounts go on in `parent` (which
  the caller removes, and which others must be able to traverse), and an empty
  read-only directory that hides what must not be seen; returns the directory
  to pass to `command` as `mount_points`."""
  points = os.path.join(parent, "mounts")
  os.mkdir(points)
  os.chmod(points, 0o711)  # Traversed by the prelude and bwrap, which may run as nobody.
  for name in _MOUNT_POINTS:
    os.mkdir(os.path.join(points, name))
  os.mkdir(os.path.join(points, _EMPTY), 0o555)
  os.chmod(os.path.join(points, _EMPTY), 0o555)
  return points


def command(inner: list[str], *, mount_points: str, work_dir: str, copy_from: str | None,
            read_only: list[str], disk_bytes: int, max_files: int,
            env: dict[str, str], hidden: list[str] = (),
            seccomp_fd: int | None = None) -> list[str]:
  """`inner` wrapped in the prelude and bwrap (see the module docstring). The
  capped mounts go on the directories `make_mount_points` made in `mount_points`
  (this writes the fstab the prelude mounts them from there);
  `work_dir` becomes an empty capped tmpfs (the cwd); `copy_from`, if given, is
  mounted read-only at `COPY_SOURCE` for the bootstrap to copy into it;
  `read_only` paths (files or directories) appear at the same place, bound by the
  prelude, so nobody need traverse the directories above them (a 0700 home);
  `hidden` directories (below those) appear empty. `seccomp_fd`: an open file holding
  the `seccomp.program()` bwrap loads before it starts `inner` (the caller passes it on
  to the child)."""
  as_root = os.geteuid() == 0
  places = {"tmp": "/tmp", "shm": "/dev/shm", "work": work_dir}
  # Every namespace but IPC, which the prelude made and emptied (--unshare-all would
  # give the code a fresh one, where SysV shared memory is limited only by RAM).
  # No /proc: its mountinfo names the host paths of every bind, and the code needs none
  # of it. /dev/pts hidden: the code has no terminal.
  args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-uts",
          "--unshare-cgroup-try", "--disable-userns",
          "--uid", str(NOBODY), "--gid", str(NOBODY), "--cap-drop", "ALL",
          "--new-session", "--die-with-parent", *_system_mounts()]
  args += ["--dev", "/dev", "--ro-bind", os.path.join(mount_points, _EMPTY), "/dev/pts"]
  # /tmp first: the read-only and work paths may lie below it.
  for name in ("tmp", "shm"):
    args += ["--bind", os.path.join(mount_points, name), places[name]]
  binds = []
  for index, path in enumerate(read_only):
    if path == "/usr" or path.startswith("/usr/"):
      continue  # bound whole already
    point = os.path.join(mount_points, f"ro{index}")
    if os.path.isdir(path):
      os.mkdir(point)
    else:
      open(point, "xb").close()
    binds.append((path, point))
    args += ["--ro-bind", point, path]
  for path in hidden:
    args += ["--ro-bind", os.path.join(mount_points, _EMPTY), path]
  args += ["--bind", os.path.join(mount_points, "work"), places["work"]]
  if copy_from is not None:
    args += ["--ro-bind", copy_from, COPY_SOURCE]
  # After every mount: bwrap makes their mount points in / and /dev. Neither is
  # capped, so neither may stay writable.
  args += ["--remount-ro", "/", "--remount-ro", "/dev", "--chdir", work_dir, "--clearenv"]
  if seccomp_fd is not None:
    args += ["--seccomp", str(seccomp_fd)]
  for key, value in env.items():
    args += ["--setenv", key, value]
  # The mounts' owner as the prelude's namespace sees it: the user bwrap runs as.
  owner = NOBODY if as_root else 0
  options = (f"size={disk_bytes},nr_inodes={max_files + 1},mode=0700,"  # +1: the root directory
             f"uid={owner},gid={owner}")
  fstab = os.path.join(mount_points, _FSTAB)
  with open(fstab, "w", encoding="utf-8") as f:
    for name in _MOUNT_POINTS:
      point = _fstab_field(os.path.join(mount_points, name))
      f.write(f"sao_sandbox {point} tmpfs {options} 0 0\n")
    for path, point in binds:  # in the prelude's private mount namespace, gone with it
      f.write(f"{_fstab_field(path)} {_fstab_field(point)} none bind 0 0\n")
  # SIGKILL on the caller's death from the start (bwrap's --die-with-parent comes later).
  namespaces = ["--ipc", "--mount"] if as_root else ["--user", "--map-root-user", "--ipc", "--mount"]
  prelude = ["setpriv", "--pdeathsig", "KILL", "unshare", *namespaces, "--propagation", "private",
             "sh", "-c", _PRELUDE, "sao_prelude", fstab]
  return [*prelude, *(_DROP_ROOT if as_root else ()), *args, "--", *inner]


# Where the files to copy into the work directory are mounted (read-only).
COPY_SOURCE = "/sao_copy_source"


@functools.cache
def unavailable_reason() -> str | None:
  """None if bwrap isolation works here, else why not and how to get it (cached)."""
  missing = [tool for tool in ("bwrap", "setpriv", "unshare", "mount", "sh")
             if shutil.which(tool) is None]
  if missing:
    return f"{' and '.join(missing)} not found on PATH; {HOW_TO_GET_IT}"
  if os.geteuid() == 0:
    blocked = untraversable([tempfile.gettempdir()])
    if blocked:
      modes = ", ".join(f"{d} (mode {stat.S_IMODE(d.stat().st_mode):04o})" for d in blocked)
      return (f"the temporary directory {tempfile.gettempdir()} cannot be reached by the "
              f"sandbox's unprivileged user (nobody), who reads each run's scratch directory "
              f"there: {modes} lacks the traverse bit for others. Set TMPDIR to a directory "
              f"every user can traverse, such as /tmp")
  python = os.path.realpath(sys.executable)
  paths = interpreter_paths()
  scratch = scratch_dirs.make("sao_probe_")
  try:
    os.chmod(scratch, 0o711)
    with seccomp_file(scratch) as fd:
      probe = command([python, "-I", "-S", "-B", "-c", "import os, json; print('ok')"],
                      mount_points=make_mount_points(scratch), work_dir="/sao_probe",
                      copy_from=None, read_only=paths, disk_bytes=1 << 20, max_files=16,
                      env={"PATH": "/usr/bin:/bin"}, hidden=hidden_paths(paths), seccomp_fd=fd)
      try:
        result = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True,
                                timeout=30, pass_fds=() if fd is None else (fd,),
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
      except (OSError, subprocess.TimeoutExpired) as e:
        return f"the bwrap self-test could not run ({e}); {HOW_TO_GET_IT}"
  finally:
    files.remove_tree(scratch)
  if result.returncode != 0 or result.stdout.strip() != b"ok":
    detail = result.stderr.decode("utf-8", "replace").strip()[-500:]
    return f"the bwrap self-test failed (exit {result.returncode}: {detail}); {HOW_TO_GET_IT}"
  return None


@contextlib.contextmanager
def seccomp_file(directory: str):
  """An fd open on `seccomp.program()` (written to `directory`), None where the machine
  has no filter (`seccomp.supported()`); closed on exit."""
  if not seccomp.supported():
    yield None
    return
  path = os.path.join(directory, "seccomp.bpf")
  with open(path, "wb") as f:
    f.write(seccomp.program())
  fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # pass_fds clears CLOEXEC in the child
  try:
    yield fd
  finally:
    os.close(fd)


def memory_mode() -> str:
  """How a tool run's memory is bounded here, in words (the self-test prints it)."""
  if seccomp.supported():
    return ("seccomp: rlimits (RLIMIT_AS: memory_mb) and the capped tmpfs mounts, with "
            f"{', '.join(seccomp.DENIED)} and F_SETPIPE_SZ denied (memory they hold is "
            "counted by no limit); a run holds at most memory_mb + 3 x disk_mb + "
            "max_open_files x 32 KiB")
  return ("rlimits only (no seccomp filter for this machine): memory held through memfd "
          "files and pipe or socket buffers is not counted")


def untraversable(paths: list[str]) -> list[pathlib.Path]:
  """The directories on the way to (and including) `paths` that others cannot traverse."""
  blocked: list[pathlib.Path] = []
  for path in map(pathlib.Path, paths):
    for directory in (*reversed(path.parents), path):
      if not directory.stat().st_mode & stat.S_IXOTH and directory not in blocked:
        blocked.append(directory)
  return blocked


def _outside_usr(path: str) -> bool:
  return not (path == "/usr" or path.startswith("/usr/"))


@functools.cache  # per process: the interpreter does not move
def interpreter_paths() -> tuple[str, ...]:
  """What this interpreter needs to start, outside /usr (bound whole): its executable,
  its shared libpython, its stdlib (with lib-dynload and the zipped stdlib). Not its
  prefix: that holds site-packages and whatever else was installed there."""
  paths = {os.path.realpath(sys.executable), sysconfig.get_paths()["stdlib"],
           os.path.dirname(os.__file__)}
  paths.update(p for p in sys.path if p.endswith(("lib-dynload", ".zip")))
  if sysconfig.get_config_var("Py_ENABLE_SHARED"):
    libdir, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if libdir and name:
      paths.add(os.path.join(libdir, name))
  return tuple(sorted(p for p in map(os.path.realpath, paths)
                     if os.path.exists(p) and _outside_usr(p)))


@functools.cache
def site_directories() -> tuple[str, ...]:
  """Where this interpreter's third-party packages live (its base's and its venv's)."""
  found = set(site.getsitepackages([sys.base_prefix, sys.base_exec_prefix, sys.prefix]))
  for scheme_vars in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
    found.update(sysconfig.get_paths(vars=scheme_vars)[key] for key in ("purelib", "platlib"))
  return tuple(sorted({os.path.realpath(p) for p in found if os.path.isdir(p)}))


def hidden_paths(bound: list[str], shown: list[str] = ()) -> list[str]:
  """The site-packages directories inside `bound` paths (or /usr) that the code would
  otherwise see, less those in `shown`."""
  return [p for p in site_directories()
          if p not in shown and any(p.startswith(root + os.sep) for root in (*bound, "/usr"))]
