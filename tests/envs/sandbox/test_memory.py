"""Memory a tool run holds stays within `memory_mb` plus a stated slack.

Before, `RLIMIT_AS` was the only bound: pages written into `memfd_create` files
with `write()` are never mapped, and pipe buffers are not counted either. One
run with `memory_mb=1024` held ~2 GiB of host RAM (memfd ~976 MiB over 61
descriptors, ~992 MiB anonymous, plus the tmpfs mounts). The attack here is
native code (loaded with ctypes: no Python check runs first) that fills every
such store in turn, keeps it all, and reports the bytes each one took."""

import base64
import errno
import re
import shutil
import subprocess
import uuid

import pytest

from sao_jax.config.env import SandboxLimits
from sao_jax.envs import sandbox
from sao_jax.envs.sandbox import bwrap, seccomp

LIMITS = SandboxLimits(wall_time_s=60.0, cpu_time_s=30, memory_mb=256, disk_mb=16,
                       max_open_files=64, file_size_mb=16, max_output_bytes=4000)

_ATTACK = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
static char chunk[1 << 20];
__attribute__((constructor)) static void attack(void) {
  long long memfd = 0, pipes = 0, anon = 0, tmpfs = 0;
  int memfd_errno = 0, setpipe_errno = 0;
  memset(chunk, 'x', sizeof chunk);
  for (int i = 0; i < 4096; i++) {  /* memfd files, written, never mapped */
    int fd = syscall(SYS_memfd_create, "held", 0);
    if (fd < 0) { memfd_errno = errno; break; }
    ssize_t n;
    while ((n = write(fd, chunk, sizeof chunk)) > 0) memfd += n;
  }
  const char *places[] = {"/tmp", "/dev/shm", "."};  /* files on the tmpfs mounts */
  for (int p = 0; p < 3; p++) {
    for (int i = 0; i < 4096; i++) {
      char name[256];
      snprintf(name, sizeof name, "%s/fill%d", places[p], i);
      int fd = open(name, O_WRONLY | O_CREAT, 0600);
      if (fd < 0) break;
      ssize_t n, wrote = 0;
      while ((n = write(fd, chunk, sizeof chunk)) > 0) wrote += n;
      close(fd);
      tmpfs += wrote;
      if (wrote == 0) break;
    }
  }
  for (;;) {  /* anonymous memory, touched */
    char *m = mmap(NULL, 16 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) break;
    memset(m, 1, 16 << 20);
    anon += 16 << 20;
  }
  int p[2];
  while (pipe2(p, O_NONBLOCK) == 0) {  /* pipe buffers, grown where allowed */
    if (fcntl(p[1], F_SETPIPE_SZ, 1 << 20) < 0) setpipe_errno = errno;
    ssize_t n;
    while ((n = write(p[1], chunk, sizeof chunk)) > 0) pipes += n;
  }
  char line[256];
  snprintf(line, sizeof line, "memfd=%lld tmpfs=%lld anon=%lld pipes=%lld memfd_errno=%d "
           "setpipe_errno=%d\n", memfd, tmpfs, anon, pipes, memfd_errno, setpipe_errno);
  write(1, line, strlen(line));
}
"""


def _payload(tmp_path) -> str:
  if shutil.which("gcc") is None:
    pytest.skip("gcc is needed to build the native attack payload")
  source = tmp_path / f"attack_{uuid.uuid4().hex}.c"
  source.write_text(_ATTACK)
  library = source.with_suffix(".so")
  subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
  return base64.b64encode(library.read_bytes()).decode()


def test_memfd_pipes_anonymous_and_tmpfs_together_stay_within_the_bound(tmp_path):
  if not seccomp.supported():
    pytest.skip("no seccomp filter for this machine: memory is bounded by rlimits alone")
  code = (f"import base64, ctypes\nopen('a.so', 'wb').write(base64.b64decode("
          f"{_payload(tmp_path)!r}))\nctypes.CDLL('./a.so')\n")
  result = sandbox.run_python(code, LIMITS)
  held = {key: int(value) for key, value in re.findall(r"(\w+)=(-?\d+)", result.stdout)}
  assert set(held) >= {"memfd", "tmpfs", "anon", "pipes"}, result
  total = held["memfd"] + held["tmpfs"] + held["anon"] + held["pipes"]
  bound = seccomp.held_bound(LIMITS.memory_mb, LIMITS.disk_mb, LIMITS.max_open_files)
  # The slack over memory_mb: the three capped tmpfs mounts and default pipe buffers.
  assert bound == (256 + 3 * 16) * 2**20 + 64 * 32 * 2**10
  print(f"held {held}: {total / 2**20:.1f} MiB of a {bound / 2**20:.1f} MiB bound")
  assert total <= bound, (held, total / 2**20, bound / 2**20)
  assert held["memfd"] == 0 and held["memfd_errno"] == errno.EPERM, held
  assert held["setpipe_errno"] == errno.EPERM, held
  assert held["pipes"] <= LIMITS.max_open_files // 2 * seccomp.PIPE_BYTES, held
  assert held["anon"] > 0 and held["tmpfs"] > 0, held  # the rest of the attack did run


def test_memfd_create_is_a_clear_tool_error():
  result = sandbox.run_python("import os\nfd = os.memfd_create('held')\n", LIMITS)
  assert result.exit_code == 1
  assert "PermissionError: sandbox: memfd_create is not allowed" in result.stderr, result


def test_the_filter_denies_exactly_the_listed_calls():
  """Decode the compiled program and check its decisions, independently of the kernel."""
  if not seccomp.supported():
    pytest.skip("no seccomp filter for this machine")
  import platform
  import struct
  program = seccomp.program()
  code = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]

  def decide(arch, nr, arg1=0):
    data = {0: nr, 4: arch, 24: arg1}
    pc, acc = 0, 0
    while True:
      op, jt, jf, k = code[pc]
      if op == 0x20:
        acc, pc = data[k], pc + 1
      elif op in (0x15, 0x35):
        hit = acc == k if op == 0x15 else acc >= k
        pc += 1 + (jt if hit else jf)
      else:
        assert op == 0x06
        return k

  arch, numbers = seccomp._MACHINES[platform.machine()]
  deny, allow = 0x00050000 | errno.EPERM, 0x7FFF0000
  for name in seccomp.DENIED:
    if name in numbers:  # aarch64 has no inotify_init
      assert decide(arch, numbers[name]) == deny, name
  assert decide(arch, numbers["fcntl"], seccomp.F_SETPIPE_SZ) == deny
  assert decide(arch, numbers["fcntl"], 1032) == allow  # F_GETPIPE_SZ
  assert decide(arch, 0) == decide(arch, 1) == allow  # read, write
  assert decide(arch ^ 1, 0) == deny  # another ABI
  if platform.machine() == "x86_64":
    assert decide(arch, 0x40000000 + 319) == deny  # x32's memfd_create


def test_the_self_test_says_which_memory_mode_is_active():
  mode = bwrap.memory_mode()
  assert mode.startswith("seccomp:" if seccomp.supported() else "rlimits only"), mode
