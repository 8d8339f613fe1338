"""Every writable place the sandboxed code gets is capped in files, not only in
bytes: a policy paid to exhaust the host creates masses of empty files, or files
carrying large user xattrs (kernel memory, not file data, so the byte cap does
not see them; an attack test held ~1.7 GB of host memory that way in one run
before the cap). Each test switches the audit hook off first, so the kernel
alone decides.
"""

import dataclasses
import errno
import os
import subprocess
import sys
import tempfile
import time
from unittest import mock

import pytest

from sao_jax.config.env import SandboxLimits
from sao_jax.envs import sandbox
from sao_jax.envs.sandbox import bwrap, files

LIMITS = SandboxLimits(wall_time_s=30.0, cpu_time_s=2, memory_mb=256, max_output_bytes=4000,
                       disk_mb=1, max_files=64)
# Switches the audit hook off (it calls the builtin `any`, looked up when it runs).
NO_HOOK = "import builtins\nbuiltins.any = lambda items: True\nimport os\n"
WRITABLE = ("/tmp", "/dev/shm", "work")  # "work": the cwd
# Ten times the cap: the old sandbox (no inode cap) created them all.
ATTEMPTS = 10 * LIMITS.max_files


def _create_files(kind: str) -> str:
  """Code that creates up to ATTEMPTS entries of `kind` in each writable place and
  prints `place count errno` (errno 0: none refused)."""
  make = {"file": "open(path, 'w').close()", "dir": "os.mkdir(path)"}[kind]
  return NO_HOOK + f"""
for place in {WRITABLE!r}:
    root = os.getcwd() if place == 'work' else place
    count, error = 0, 0
    try:
        while count < {ATTEMPTS}:
            path = os.path.join(root, 'f%d' % count)
            {make}
            count += 1
    except OSError as e:
        error = e.errno
    print(place, count, error)
"""


def _untraversable_by_others(path: str) -> str | None:
  """The first directory on `path`'s real path that users other than its owner cannot
  enter (no o+x), or None."""
  current = "/"
  for part in os.path.realpath(path).strip("/").split("/"):
    current = os.path.join(current, part)
    if os.path.isdir(current) and not os.stat(current).st_mode & 0o001:
      return current
  return None


@pytest.fixture(params=["as_caller", "unprivileged_caller"])
def chain(request, monkeypatch):
  """The sandbox as this process starts it, and (when this process is root) as a
  non-root caller starts it: user + mount namespace for the prelude, run here
  as nobody."""
  if request.param == "unprivileged_caller":
    if os.geteuid() != 0:
      pytest.skip("this process is not root: `as_caller` already is the unprivileged chain")
    blocked = _untraversable_by_others(sys.base_prefix)
    if blocked:
      # The chain runs as the host's nobody, which must reach the interpreter as a real
      # non-root caller's own account would; a root-only home (0700 /root) stops it.
      pytest.skip(f"{blocked} is closed to other users (mode {os.stat(blocked).st_mode & 0o777:o}), "
                  "so no non-root caller could run this interpreter")
    real = bwrap.command

    def as_nobody(*args, **kwargs):
      with mock.patch.object(bwrap.os, "geteuid", return_value=bwrap.NOBODY):
        return [*bwrap._DROP_ROOT, *real(*args, **kwargs)]

    monkeypatch.setattr(bwrap, "command", as_nobody)
  return request.param


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_file_count_is_capped_in_every_writable_mount(kind, chain):
  result = sandbox.run_python(_create_files(kind), LIMITS)
  lines = [line.split() for line in result.stdout.splitlines()]
  assert [line[0] for line in lines] == list(WRITABLE), result
  for place, count, error in lines:
    # A few inodes of /tmp hold the mount points of paths below it.
    assert LIMITS.max_files - 8 <= int(count) <= LIMITS.max_files, (place, count, result)
    assert int(error) == errno.ENOSPC, (place, count, error)


def test_large_user_xattrs_are_refused_by_the_same_budget():
  """tmpfs (Linux >= 6.6) charges user xattrs to the inode budget of
  `max_files + 1` KiB: one 64 KB value does not fit, and 4 KiB values stop
  once the budget is spent, whatever the number of files."""
  big, small = 65000, 4096
  code = NO_HOOK + f"""
for place in {WRITABLE!r}:
    root = os.getcwd() if place == 'work' else place
    path = os.path.join(root, 'carrier')
    open(path, 'w').close()
    try:
        os.setxattr(path, 'user.big', b'x' * {big})
        big = 0
    except OSError as e:
        big = e.errno
    stored, error = 0, 0
    try:
        while stored < 100000:
            os.setxattr(path, 'user.s%d' % stored, b'x' * {small})
            stored += 1
    except OSError as e:
        error = e.errno
    print(place, big, stored, error)
"""
  result = sandbox.run_python(code, LIMITS)
  lines = [line.split() for line in result.stdout.splitlines()]
  assert [line[0] for line in lines] == list(WRITABLE), result
  budget = (LIMITS.max_files + 1) * 1024
  for place, big_errno, stored, error in lines:
    assert int(big_errno) == errno.ENOSPC, (place, "a 64 KB xattr was stored")
    assert 0 < int(stored) * small < budget, (place, stored)
    assert int(error) == errno.ENOSPC, (place, error)


def test_the_root_and_dev_are_not_writable():
  """bwrap's own root and /dev are tmpfs mounts without any cap: read-only."""
  code = NO_HOOK + """
for place in ('/', '/dev'):
    try:
        open(os.path.join(place, 'planted'), 'w').close()
        print(place, 'wrote')
    except OSError as e:
        print(place, e.errno)
"""
  result = sandbox.run_python(code, LIMITS)
  assert result.stdout.split() == ["/", str(errno.EROFS), "/dev", str(errno.EROFS)], result


def test_capped_mounts_stay_private_and_are_gone_after_the_run():
  marker = " tmpfs sao_sandbox "  # the capped mounts' type and source
  # Inside, without /proc (whose mountinfo named host paths): each place is a mount
  # of exactly the caps' size and inode count.
  code = NO_HOOK + f"""
open('/tmp/f', 'w').write('x')
caps = ({LIMITS.disk_mb << 20}, {LIMITS.max_files + 1})
print(sum((s.f_blocks * s.f_frsize, s.f_files) == caps
          for s in map(os.statvfs, ('/tmp', '/dev/shm', os.getcwd()))))
"""
  result = sandbox.run_python(code, LIMITS)
  assert result.stdout.strip() == "3", result  # /tmp, /dev/shm, the work directory
  with open("/proc/self/mountinfo") as host:
    assert not [line for line in host if marker in line]


def test_max_files_is_validated():
  with pytest.raises(ValueError, match="max_files"):
    dataclasses.replace(LIMITS, max_files=8).validate()
  with pytest.raises(ValueError, match="max_files"):
    dataclasses.replace(LIMITS, max_files=0).validate()


def _descendants(pid: int) -> set[int]:
  children: dict[int, list[int]] = {}
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat") as stat:
        parent = int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    children.setdefault(parent, []).append(int(entry))
  found, stack = set(), [pid]
  while stack:
    for child in children.get(stack.pop(), ()):
      found.add(child)
      stack.append(child)
  return found


def _stat(pid: int) -> list[str] | None:
  """/proc/PID/stat's fields after the command name (state first), None when gone."""
  try:
    with open(f"/proc/{pid}/stat") as stat:
      return stat.read().rsplit(")", 1)[1].split()
  except OSError:
    return None


def _alive(pid: int, started: str) -> bool:
  """The process that started at `started` (clock ticks after boot) is running: a
  zombie has already left its namespaces, mounts included, and a new process that
  reused the pid (pid_max can be 32768; other pytest workers spawn many) is not it."""
  fields = _stat(pid)
  return fields is not None and fields[0] != "Z" and fields[19] == started


def test_a_sigkilled_caller_leaves_no_sandbox_and_so_no_mount_behind():
  """The capped mounts live in the sandbox's own mount namespace, which the
  kernel frees with its last process: once every process of the run is gone,
  so are they. SIGKILL the caller mid-run; every process of the run must go."""
  code = "import time\ntime.sleep(60)\n"
  # The killed caller cannot delete its scratch directory: keep it out of /tmp.
  scratch = tempfile.mkdtemp(prefix="sao_killed_caller_")
  os.chmod(scratch, 0o711)
  caller = subprocess.Popen(
      [sys.executable, "-c", "import sys\nfrom sao_jax.config.env import SandboxLimits\n"
       f"from sao_jax.envs import sandbox\nsandbox.run_python(sys.argv[1], {LIMITS!r})", code],
      env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": scratch})
  try:
    deadline = time.monotonic() + 30
    while not any(b"sao-sandbox-ready" in _cmdline(p) for p in _descendants(caller.pid)):
      assert time.monotonic() < deadline and caller.poll() is None, "the sandbox never started"
      time.sleep(0.05)
    run = {p: fields[19] for p in _descendants(caller.pid) if (fields := _stat(p))}
  finally:
    caller.kill()
    caller.wait()
  deadline = time.monotonic() + 5
  while any(_alive(*entry) for entry in run.items()) and time.monotonic() < deadline:
    time.sleep(0.05)
  try:
    assert not [p for p in run.items() if _alive(*p)], "sandbox processes outlived their caller"
    with open("/proc/self/mountinfo") as host:
      assert " tmpfs sao_sandbox " not in host.read()
    (run_dir,) = os.listdir(scratch)  # Left behind, but only as empty mount points.
    points = os.path.join(scratch, run_dir, "mounts")
    dirs = [entry.path for entry in os.scandir(points) if entry.is_dir()]
    assert {"tmp", "shm", "work"} <= set(map(os.path.basename, dirs)), dirs
    assert not any(map(os.listdir, dirs)), dirs  # bind mount points included
  finally:
    files.remove_tree(scratch)


def _cmdline(pid: int) -> bytes:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read()
  except OSError:
    return b""


def test_a_temporary_directory_with_spaces_still_gets_capped_mounts(monkeypatch):
  """The prelude mounts from an fstab, where a space would split the path."""
  parent = tempfile.mkdtemp(prefix="sao sandbox \\ ")
  os.chmod(parent, 0o711)
  monkeypatch.setattr(tempfile, "tempdir", parent)
  try:
    result = sandbox.run_python(_create_files("file"), LIMITS)
  finally:
    files.remove_tree(parent)
  assert [line.split()[-1] for line in result.stdout.splitlines()] == [str(errno.ENOSPC)] * 3, result
