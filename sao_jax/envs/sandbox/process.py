"""Run untrusted, model-written Python in a separate, limited process.

`run_python(code, limits, isolation=...)` runs `code` as `main.py` in a *new*
interpreter (`python -I -S -B`: isolated mode, no `site`, no bytecode writes;
never a fork of the caller) and returns a `SandboxResult`. The code runs like a
script in its working directory (the cwd and first `sys.path` entry): an empty
directory, or with `workdir=path` a throwaway copy of the directory `path`
(e.g. a repository to test). Whatever the code writes is discarded when it
ends: `path` itself is never written.

Model misbehaviour (crashes, timeouts, bombs, forbidden calls) is always
reported in the result, never raised; a harness failure (the interpreter cannot
be started, the bootstrap did not come up) raises `SandboxError`, which
environments turn into an environment failure; so does `IsolationUnavailable`.

What is enforced, and by what:

- Kernel, `isolation="bwrap"` (the default; `bwrap` module): a fresh mount
  namespace with only `/usr`, the interpreter and stdlib (+ site-packages with
  `site_packages=True`) read-only, the work directory, `/tmp` and `/dev/shm` as
  private tmpfs capped at `disk_mb` and `max_files` each (user xattrs included)
  and gone after the run; no `/proc`; no SysV IPC objects; no network;
  own PID namespace; new session; dies with its parent; uid nobody with no
  capabilities and no further user namespaces; a seccomp filter against the
  system calls whose memory no limit counts (`seccomp`: `memfd_create`, pipe
  growth, sockets, ...). No host file outside those mounts exists for the code,
  whatever it does in-process.
- Kernel, always (set by the bootstrap with `resource.setrlimit` before the
  code runs, soft = hard): CPU time (`RLIMIT_CPU`), address space
  (`RLIMIT_AS`, so memory bombs get `MemoryError`), written file size
  (`RLIMIT_FSIZE`), open files, no core dumps, and `RLIMIT_NPROC = 0` (no new
  processes or threads; the kernel ignores it for uid 0, which the bwrap mode
  never is).
- Parent side, always: a wall-clock limit after which the child's whole process
  group (it runs in its own session) is SIGKILLed; stdout and stderr are read
  incrementally and capped at `max_output_bytes` each; an environment holding
  only `_CHILD_ENV`; stdin is /dev/null; the temporary directory is deleted.
- Audit hook (PEP 578), for friendly error messages only (it is no boundary:
  pure Python can switch it off): opens outside the work directory and stdlib,
  sockets, subprocesses, signals, `setrlimit`, ctypes calls raise
  `PermissionError` with a readable message.

`isolation="unisolated"` (config `env.sandbox`) drops the kernel layer: the
code then runs as the caller with only the rlimits and the hook, i.e. full code
execution as the training user. Without working bwrap, `"bwrap"` refuses to
run anything (`IsolationUnavailable`) instead of falling back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import sysconfig
import time

from sao_jax.config.env import DEFAULT_SANDBOX, SANDBOX_MODES, SandboxLimits
from sao_jax.envs.sandbox import bwrap, files, nesting
from sao_jax.envs.sandbox import scratch as scratch_dirs

# The bootstrap writes this to stderr right before running the code; its absence
# means the harness, not the model, failed.
_READY = "\x00sao-sandbox-ready\n"
_CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
              "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "PYTHONDONTWRITEBYTECODE": "1"}
_READ_CHUNK = 65536
_DRAIN_S = 5.0  # After a kill, how long to wait for the pipes to close.


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxResult:
  """What happened. `exit_code` is the process status (negative: killed by that
  signal); `killed_reason` is "wall_time", "cpu_time" or "signal <NAME>" when the
  process did not exit by itself."""

  stdout: str
  stderr: str
  exit_code: int
  timed_out: bool
  killed_reason: str | None
  stdout_truncated: bool
  stderr_truncated: bool
  wall_time_s: float

  @property
  def ok(self) -> bool:
    return self.exit_code == 0 and self.killed_reason is None


class SandboxError(RuntimeError):
  """The sandbox harness itself failed (not the model's code)."""


class IsolationUnavailable(SandboxError):
  """Kernel isolation was asked for and cannot be set up here."""


def require_isolation(isolation: str) -> None:
  """Raises `IsolationUnavailable` (saying how to get it) if `isolation` cannot run here."""
  if isolation not in SANDBOX_MODES:
    raise ValueError(f"isolation={isolation!r} is invalid: allowed values are "
                     f"{', '.join(map(repr, SANDBOX_MODES))}.")
  reason = bwrap.unavailable_reason() if isolation == "bwrap" else None
  if reason is not None:
    raise IsolationUnavailable(f"tool execution refused: kernel isolation is unavailable: "
                               f"{reason}.")


def _read_roots(site_packages: bool) -> list[str]:
  """Directories the code may read: where this interpreter's stdlib lives."""
  # Not "platstdlib": in a virtualenv that is the venv's lib/, site-packages included.
  roots = {sysconfig.get_paths()["stdlib"], os.path.dirname(os.__file__)}
  roots.update(p for p in sys.path if p.endswith(("lib-dynload", ".zip")))
  if site_packages:
    roots.update((sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]))
  return sorted(os.path.realpath(r) for r in roots)


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), *,
               workdir: str | os.PathLike | None = None,
               isolation: str = DEFAULT_SANDBOX) -> SandboxResult:
  """Runs `code` under `limits` in an empty directory, or in a throwaway copy of
  `workdir` (see the module docstring for what is enforced)."""
  limits.validate()
  require_isolation(isolation)
  if workdir is not None and not os.path.isdir(workdir):
    raise ValueError(f"workdir={os.fspath(workdir)!r} is not an existing directory.")
  scratch = scratch_dirs.make("sao_sandbox_")
  try:
    script_dir = os.path.join(scratch, "script")
    os.mkdir(script_dir)
    script = os.path.join(script_dir, "main.py")
    with open(script, "w", encoding="utf-8") as f:
      f.write(code)
    work = os.path.join(scratch, "work")
    read_roots = _read_roots(limits.site_packages)
    settings = {
        "workdir": work, "script": script, "read_roots": read_roots, "copy_from": None,
        "sys_path": (sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
                     if limits.site_packages else []),
        "cpu_time_s": limits.cpu_time_s,
        "memory_bytes": limits.memory_mb << 20,
        "file_size_bytes": limits.file_size_mb << 20,
        "max_open_files": limits.max_open_files,
    }
    python = os.path.realpath(sys.executable)
    if isolation == "bwrap":
      # Read as "other" by the unprivileged child: world-readable, not capabilities.
      os.chmod(scratch, 0o711)
      os.chmod(script_dir, 0o755)
      os.chmod(script, 0o644)
      copy_from = None
      if workdir is not None:  # Its copy (a tmpfs) sits where the original is.
        copy_from = os.path.join(scratch, "in")
        files.readable_copy(os.path.realpath(workdir), copy_from)
        settings["copy_from"] = bwrap.COPY_SOURCE
        settings["workdir"] = work = os.path.realpath(workdir)
      read_only = sorted({*bwrap.interpreter_paths(), script_dir,
                          *filter(os.path.exists, read_roots)})
      with bwrap.seccomp_file(scratch) as seccomp_fd:
        command = bwrap.command(
            [python, "-I", "-S", "-B", "-c", _BOOTSTRAP, json.dumps(settings)],
            mount_points=bwrap.make_mount_points(scratch), work_dir=work, copy_from=copy_from,
            read_only=read_only, hidden=bwrap.hidden_paths(read_only, shown=read_roots),
            disk_bytes=limits.disk_mb << 20, max_files=limits.max_files, env=_CHILD_ENV,
            seccomp_fd=seccomp_fd)
        return _supervise(command, "/", limits, wrapped=True,
                          pass_fds=() if seccomp_fd is None else (seccomp_fd,))
    if workdir is None:
      os.mkdir(work)
    else:
      files.readable_copy(os.path.realpath(workdir), work)
    command = [python, "-I", "-S", "-B", "-c", _BOOTSTRAP, json.dumps(settings)]
    return _supervise(command, work, limits, wrapped=False)
  finally:
    files.remove_tree(scratch)


def _supervise(command: list[str], cwd: str, limits: SandboxLimits, *,
              wrapped: bool, pass_fds: tuple[int, ...] = ()) -> SandboxResult:
  """Starts the child, collects capped output, enforces the wall-clock limit."""
  start = time.monotonic()
  try:
    proc = subprocess.Popen(command, cwd=cwd, env=_CHILD_ENV, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, close_fds=True, pass_fds=pass_fds)
  except OSError as e:
    raise SandboxError(f"could not start the sandbox interpreter {command[0]!r}: {e}") from e
  cap = limits.max_output_bytes + len(_READY)
  kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
  dropped = dict.fromkeys(kept, 0)
  deadline = start + limits.wall_time_s
  timed_out = False
  with selectors.DefaultSelector() as selector:
    for stream in (proc.stdout, proc.stderr):
      os.set_blocking(stream.fileno(), False)
      selector.register(stream.fileno(), selectors.EVENT_READ)
    while selector.get_map():
      now = time.monotonic()
      if now >= deadline and not timed_out:
        timed_out = True
        _kill_group(proc.pid)
      if now >= deadline + _DRAIN_S:
        break  # Killed, yet something still holds the pipes open: stop reading.
      for key, _ in selector.select(timeout=max(deadline - now, 0.05)):
        chunk = os.read(key.fd, _READ_CHUNK)
        if not chunk:
          selector.unregister(key.fd)
          continue
        room = cap - len(kept[key.fd])
        kept[key.fd] += chunk[:room]
        dropped[key.fd] += max(len(chunk) - room, 0)
  try:  # The code may have closed its pipes and kept running.
    exit_code = proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
  except subprocess.TimeoutExpired:
    timed_out = True
    _kill_group(proc.pid)
    exit_code = proc.wait()
  _kill_group(proc.pid)  # Nothing should be left; make sure.
  out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
  proc.stdout.close()
  proc.stderr.close()
  out, err = kept[out_fd], kept[err_fd]
  if not err.startswith(_READY.encode()):
    if timed_out:  # Killed while the interpreter was still starting.
      err = _READY.encode() + err
    else:
      raise SandboxError(f"the sandbox bootstrap did not start (exit {exit_code}): "
                         f"{err.decode('utf-8', 'replace')[-2000:]}")
  err = err[len(_READY):]
  return SandboxResult(
      stdout=out[:limits.max_output_bytes].decode("utf-8", "replace"),
      stderr=err[:limits.max_output_bytes].decode("utf-8", "replace"),
      exit_code=exit_code, timed_out=timed_out,
      killed_reason=_killed_reason(exit_code, timed_out, wrapped),
      stdout_truncated=dropped[out_fd] > 0 or len(out) > limits.max_output_bytes,
      stderr_truncated=dropped[err_fd] > 0 or len(err) > limits.max_output_bytes,
      wall_time_s=time.monotonic() - start)


def _kill_group(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _killed_reason(exit_code: int, timed_out: bool, wrapped: bool) -> str | None:
  if timed_out:
    return "wall_time"
  if exit_code == _CPU_EXIT or exit_code == -signal.SIGXCPU:
    return "cpu_time"
  if exit_code < 0:
    return f"signal {signal.Signals(-exit_code).name}"
  # bwrap reports a child killed by signal N as exit status 128 + N.
  if wrapped and exit_code > 128 and exit_code - 128 in signal.valid_signals():
    return f"signal {signal.Signals(exit_code - 128).name}"
  return None


# Exit status the bootstrap uses when the CPU limit's SIGXCPU arrives. In a PID
# namespace the child is init, which the kernel spares from default-action
# signals, so the bootstrap handles SIGXCPU itself.
_CPU_EXIT = 152
# Compiler warnings on the model's code shown (after READY), and characters of each
# message and quoted line: like its output, the code's warnings are bounded.
_MAX_WARNINGS, _WARNING_CHARS = 20, 200

# Runs inside the child as `python -I -S -B -c _BOOTSTRAP settings_json`. It
# keeps no reference to the audit hook or its state in any reachable namespace:
# everything the hook needs is bound in its closure at creation.
_BOOTSTRAP = r'''
import json, os, resource, signal, sys, traceback, warnings

def _make_hook(workdir, read_roots, read_files):
  realpath, sep, type_, str_, bytes_, int_, fsdecode = (
      os.path.realpath, os.sep, type, str, bytes, int, os.fsdecode)
  write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
  function_type = type(_make_hook)
  denied_events = frozenset((
      "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
      "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
      "socket.__new__", "socket.getaddrinfo", "socket.gethostbyname",
      "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.getnameinfo",
      "os.symlink", "os.link", "resource.setrlimit", "resource.prlimit",
      "gc.get_objects", "gc.get_referrers", "gc.get_referents",
      "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata"))
  denied_modules = frozenset(("_xxsubinterpreters", "_xxinterpchannels", "_sqlite3"))
  mutations = frozenset(("os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.truncate",
                         "os.utime", "os.chmod", "os.chown"))

  def resolve(path):
    if type_(path) is not str_ and type_(path) is not bytes_:
      return None
    return realpath(fsdecode(path))

  def inside(path, roots):
    return path is not None and any(path == r or path.startswith(r + sep) for r in roots)

  def readable(path):
    return inside(path, (workdir,) + read_roots) or path in read_files

  def hook(event, args):
    if event in denied_events:
      raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import":
      if args[0] in denied_modules or args[0].startswith("_test"):
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    elif event == "open":
      path, flags = args[0], args[2]
      if type_(path) is int_:
        return
      path = resolve(path)
      writes = type_(flags) is not int_ or flags & write_flags
      if not (inside(path, (workdir,)) or (not writes and readable(path))):
        raise PermissionError(f"sandbox: opening {args[0]!r} is not allowed")
    elif event in ("os.listdir", "os.scandir"):
      if args[0] is not None and type_(args[0]) is not int_ and not readable(resolve(args[0])):
        raise PermissionError(f"sandbox: listing {args[0]!r} is not allowed")
    elif event in mutations:
      for arg in args:
        if type_(arg) is not int_ and not inside(resolve(arg), (workdir,)):
          raise PermissionError(f"sandbox: {event} on {arg!r} is not allowed")
    elif event == "object.__setattr__" and type_(args[0]) is function_type and args[1] == "__code__":
      raise PermissionError("sandbox: replacing a function's __code__ is not allowed")

  return hook

def _cpu_exceeded(signum, frame):
  try:
    os.write(2, b"\nsandbox: CPU time limit exceeded\n")
  finally:
    os._exit(%(cpu_exit)d)

def _setup():
  settings = json.loads(sys.argv[1])
  sys.argv = ["main.py"]
  sys.path.extend(settings["sys_path"])
  with open(settings["script"], encoding="utf-8") as f:
    source = f.read()
  # A compile error is the model's mistake, reported after READY: also code nested past
  # the parser's stack (MemoryError) or the compiler's recursion limit (RecursionError).
  # So are the compiler's warnings (`x is 5`, "\d" in a string): printed before READY
  # they made the harness look broken, and an episode the policy chose to end that way
  # was dropped as an environment failure instead of scored. They are kept and printed
  # after READY, as python prints them.
  with warnings.catch_warnings(record=True) as warned:
    try:
      code = compile(source, "main.py", "exec")
    except (SyntaxError, ValueError) as error:
      code = error
    except (MemoryError, RecursionError) as error:  # named with its line where it is found
      code = too_deep(source, "main.py", error)
  if settings["copy_from"]:  # Into the capped work tmpfs, before the limits apply.
    import shutil
    try:
      shutil.copytree(settings["copy_from"], settings["workdir"], symlinks=True,
                      dirs_exist_ok=True)
    except (OSError, shutil.Error) as error:  # e.g. over the disk cap: the files' fault
      code = OSError(f"sandbox: could not copy the working directory in: {error}")
  cpu = settings["cpu_time_s"]
  for limit, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_AS, settings["memory_bytes"]),
                       (resource.RLIMIT_FSIZE, settings["file_size_bytes"]),
                       (resource.RLIMIT_NOFILE, settings["max_open_files"]),
                       (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, 0)):
    resource.setrlimit(limit, value if isinstance(value, tuple) else (value, value))
  signal.signal(signal.SIGXCPU, _cpu_exceeded)
  for module in (os, sys.modules["posix"], signal, sys.modules["_signal"]):
    for name in ("pidfd_open", "pidfd_send_signal"):
      if hasattr(module, name):
        delattr(module, name)
  # The kernel refuses it (seccomp, bwrap mode: EPERM); this says why.
  def memfd_create(*args, **kwargs):
    raise PermissionError("sandbox: memfd_create is not allowed (memory held in such files "
                          "would count against no limit); write files in the working "
                          "directory or /tmp instead")
  for module in (os, sys.modules["posix"]):
    if hasattr(module, "memfd_create"):
      module.memfd_create = memfd_create
  sys.addaudithook(_make_hook(settings["workdir"], tuple(settings["read_roots"]),
                              frozenset(("/dev/null", "/dev/zero", "/dev/urandom"))))
  # Bounded: one long line can hold thousands of warnings, each quoting that line.
  lines = source.splitlines()
  notes = [warnings.formatwarning(str(w.message)[:%(note_chars)d], w.category, w.filename,
                                  w.lineno, lines[w.lineno - 1][:%(note_chars)d]
                                  if 0 < w.lineno <= len(lines) else "")
           for w in warned[:%(max_notes)d]]
  if len(warned) > %(max_notes)d:
    notes.append(f"({len(warned) - %(max_notes)d} more compiler warnings not shown)\n")
  # Only now, limits and hook in place: compiling "\N{...}" imports unicodedata, and
  # with the work directory already first on the path (as it was) a unicodedata.py
  # there ran inside the compile, before READY, its output a harness failure.
  sys.path.insert(0, settings["workdir"])
  return code, notes

def _run(code, notes):
  sys.stderr.write(%(ready)r)
  for note in notes:
    sys.stderr.write(note)
  sys.stderr.flush()
  if isinstance(code, BaseException):
    traceback.print_exception(type(code), code, None)
    sys.exit(1)
  try:
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
  except SystemExit:
    raise
  except BaseException as e:
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)
    sys.exit(1)

_run(*_setup())
''' % {"ready": _READY, "cpu_exit": _CPU_EXIT, "max_notes": _MAX_WARNINGS,
       "note_chars": _WARNING_CHARS}
# `too_deep` names the line of code nested past the compiler; called only when the
# compile fails (tokenizing every run's code would cost tens of ms).
_BOOTSTRAP = nesting.pasteable() + _BOOTSTRAP
