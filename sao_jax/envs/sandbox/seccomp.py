"""The sandbox's seccomp filter: no system call that holds memory no limit counts.

The sandbox bounds memory with rlimits (`RLIMIT_AS`: what the code maps) and the
capped tmpfs mounts (`disk_mb` each). Some kernel objects hold pages that
neither counts, which one tool run used to hold ~2 GiB of host RAM with
`memory_mb=1024`:

- `memfd_create` (and `memfd_secret`): an anonymous file written with
  `write()` is never mapped, so `RLIMIT_AS` does not see it; only
  `RLIMIT_FSIZE` x `RLIMIT_NOFILE` bounded it (~1 GiB).
- `fcntl(F_SETPIPE_SZ)`: pipe buffers of up to 1 MiB each instead of 64 KiB.
- `socket` / `socketpair`: socket buffers (the code has no network anyway; the
  audit hook already refuses Python's `socket`).
- `io_uring_setup`, `bpf`: rings, registered buffers and maps; `inotify_init`:
  watches, each pinning kernel memory up to a host-wide per-user limit.

`program()` compiles a classic-BPF filter that makes each of them fail with
EPERM (so the code sees an ordinary error, not a kill), and fails every system
call of another ABI (x32, or 32-bit calls through `int 0x80`, where the numbers
differ). bwrap loads it (`--seccomp FD`) right before it starts the
interpreter. What remains unbounded by a limit is then the pipes' default
buffers: at most `max_open_files` / 2 pipes of 64 KiB, so the code holds at
most `memory_mb` + 3 x `disk_mb` + `max_open_files` x 32 KiB (`held_bound`),
plus the kernel's own bookkeeping (page tables, slab); a cgroup would count
those too.

Supported machines: x86_64 and aarch64 (`supported()`); elsewhere the sandbox
says so in its self-test and bounds memory by the rlimits alone.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

# struct seccomp_data: nr (u32), arch (u32), instruction_pointer (u64), args[6] (u64).
_NR, _ARCH, _ARG1_LOW = 0, 4, 24  # args[1]'s low 32 bits (little-endian machines)
_LD_W_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_X32_BIT = 0x40000000
F_SETPIPE_SZ = 1031
# inotify: each watch pins kernel memory, up to the (host-wide, per-uid) watch limit.
DENIED = ("memfd_create", "memfd_secret", "socket", "socketpair", "io_uring_setup", "bpf",
          "inotify_init", "inotify_init1")
# Per machine: (AUDIT_ARCH_*, {system call: number}).
_MACHINES = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "memfd_secret": 447, "socket": 41,
                            "socketpair": 53, "io_uring_setup": 425, "bpf": 321, "fcntl": 72,
                            "inotify_init": 253, "inotify_init1": 294}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "memfd_secret": 447, "socket": 198,
                             "socketpair": 199, "io_uring_setup": 425, "bpf": 280, "fcntl": 25,
                             "inotify_init1": 26}),  # aarch64 has no inotify_init
}
PIPE_BYTES = 64 << 10  # a pipe's default buffer, which F_SETPIPE_SZ could raise


def supported() -> bool:
  return platform.machine() in _MACHINES


def _assemble(code: list[tuple]) -> bytes:
  """Classic BPF from (opcode, k) and (opcode, k, true label, false label) entries and
  ("label", name) markers; a label target is the number of entries to skip."""
  labels, at = {}, 0
  for entry in code:
    if entry[0] == "label":
      labels[entry[1]] = at
    else:
      at += 1
  out, at = [], 0
  for entry in code:
    if entry[0] == "label":
      continue
    op, k, *targets = entry
    jt, jf = (labels[t] - at - 1 if isinstance(t, str) else t for t in (targets or (0, 0)))
    out.append(struct.pack("=HBBI", op, jt, jf, k))
    at += 1
  return b"".join(out)


@functools.cache
def program() -> bytes:
  """The filter (module docstring) for this machine, as bwrap's `--seccomp` reads it."""
  arch, numbers = _MACHINES[platform.machine()]
  code: list[tuple] = [(_LD_W_ABS, _ARCH), (_JEQ, arch, 0, "deny"), (_LD_W_ABS, _NR)]
  if platform.machine() == "x86_64":
    code.append((_JGE, _X32_BIT, "deny", 0))
  code += [(_JEQ, numbers[name], "deny", 0) for name in DENIED if name in numbers]
  code += [(_JEQ, numbers["fcntl"], 0, "allow"), (_LD_W_ABS, _ARG1_LOW),
           (_JEQ, F_SETPIPE_SZ, "deny", "allow"),
           ("label", "allow"), (_RET, _ALLOW),
           ("label", "deny"), (_RET, _ERRNO | errno.EPERM)]
  return _assemble(code)


def held_bound(memory_mb: int, disk_mb: int, max_open_files: int) -> int:
  """Bytes a run can hold under the filter and the limits (module docstring)."""
  return (memory_mb << 20) + 3 * (disk_mb << 20) + max_open_files * PIPE_BYTES // 2
