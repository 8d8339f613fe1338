"""The kernel is the boundary: attacks that first switch off the audit hook (or skip
Python altogether with native code) still cannot reach the host.

Each test plays a policy paid to escape. `HOOK_BYPASSES` are four pure-Python
ways around the audit hook; `native(...)` runs C code (a shared object the
sandboxed code writes and loads with ctypes, whose constructor runs before any
Python check) so the kernel alone decides.
"""

import base64
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import uuid

import pytest

from sao_jax.config import EnvConfig
from sao_jax.config.env import SandboxLimits
from sao_jax.envs import registry, sandbox
from sao_jax.envs.coding import env as coding_env
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.coding.tools import format_tool_call as call
from sao_jax.envs.sandbox import bwrap

LIMITS = SandboxLimits(wall_time_s=10.0, cpu_time_s=2, memory_mb=256, max_output_bytes=4000,
                       disk_mb=1)

# Each defines `read(path) -> str` that gets past the audit hook's path checks.
HOOK_BYPASSES = {
    # The hook calls the builtin `any`, looked up when it runs.
    "rebind_builtin": "import builtins\nbuiltins.any = lambda items: True\n"
                      "def read(path):\n    return open(path).read()\n",
    # A blocked call's traceback ends in the hook's frame, whose locals hold its
    # helper closures; emptying their root cells allows every path.
    "traceback_closure": """
try:
    open('/sao-probe-blocked')
except PermissionError as error:
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    for value in list(tb.tb_frame.f_locals.values()):
        if type(value).__name__ != 'function':
            continue
        for cell in value.__closure__ or ():
            if type(cell.cell_contents) is tuple and all(type(r) is str for r in cell.cell_contents):
                cell.cell_contents = ('',)
            elif type(cell.cell_contents) is str and cell.cell_contents.startswith('/'):
                cell.cell_contents = ''
def read(path):
    return open(path).read()
""",
    # The hook resolves a relative path against the cwd; the kernel against dir_fd.
    "dir_fd_after_chdir": """
import os
def read(path):
    work = os.getcwd()
    depth = work.count('/')
    deep = os.path.join(work, *['d'] * depth)
    os.makedirs(deep, exist_ok=True)
    fd = os.open(work, os.O_RDONLY)
    os.chdir(deep)
    handle = os.open('../' * depth + path.lstrip('/'), os.O_RDONLY, dir_fd=fd)
    os.chdir(work)
    return os.read(handle, 1 << 16).decode()
""",
    # Native code in a shared object the code wrote: no audit hook runs there.
    "ctypes_shared_object": None,  # see native()
}


def _compile(c_body: str, tmp_path) -> bytes:
  if shutil.which("gcc") is None:
    pytest.skip("gcc is needed to build the native attack payload")
  source = tmp_path / f"payload_{uuid.uuid4().hex}.c"
  source.write_text("#include <arpa/inet.h>\n#include <dirent.h>\n#include <fcntl.h>\n"
                    "#include <netinet/in.h>\n#include <signal.h>\n#include <string.h>\n"
                    "#include <sys/mount.h>\n#include <sys/msg.h>\n#include <sys/sem.h>\n"
                    "#include <sys/shm.h>\n#include <sys/socket.h>\n#include <unistd.h>\n"
                    "#include <stdio.h>\n#include <sys/syscall.h>\n"
                    "static void say(const char *s) { write(1, s, strlen(s)); }\n"
                    f"__attribute__((constructor)) static void payload(void) {{\n{c_body}\n}}\n")
  library = source.with_suffix(".so")
  subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
  return library.read_bytes()


def native(c_body: str, tmp_path, limits=LIMITS, **kwargs) -> sandbox.SandboxResult:
  """Runs C statements (with `say(text)` for output) inside the sandbox."""
  data = base64.b64encode(_compile(c_body, tmp_path)).decode()
  code = (f"import base64, ctypes\nopen('p.so', 'wb').write(base64.b64decode({data!r}))\n"
          "ctypes.CDLL('./p.so')\n")
  return sandbox.run_python(code, limits, **kwargs)


def native_read(path: str) -> str:
  return (f'char buf[256] = {{0}}; int fd = open("{path}", O_RDONLY);\n'
          'if (fd >= 0 && read(fd, buf, 255) > 0) { say("READ:"); say(buf); } else say("DENIED");')


@pytest.fixture
def secret(tmp_path):
  """A host file the sandbox must never read."""
  path = tmp_path / "secret.txt"
  path.write_text("hunter2")
  os.chmod(path, 0o644)
  return str(path)


@pytest.mark.parametrize("bypass", sorted(HOOK_BYPASSES))
def test_hook_bypasses_cannot_read_host_files(bypass, secret, tmp_path):
  if HOOK_BYPASSES[bypass] is None:
    result = native(native_read(secret), tmp_path)
    assert "hunter2" not in result.stdout and "DENIED" in result.stdout, result
  else:
    result = sandbox.run_python(HOOK_BYPASSES[bypass] + f"print(read({secret!r}))\n", LIMITS)
    assert "hunter2" not in result.stdout and not result.ok, result
    assert "No such file or directory" in result.stderr, result.stderr


def test_the_host_tree_is_not_there(tmp_path):
  result = native('DIR *d = opendir("/"); struct dirent *e;\n'
                  'while (d && (e = readdir(d))) { say(e->d_name); say(" "); }\n'
                  'say(access("/etc/passwd", F_OK) == 0 ? "PASSWD" : "NOPASSWD");', tmp_path)
  names = set(result.stdout.split())
  # Only /usr, the interpreter's directory (here perhaps under /root) and the mounts.
  assert "NOPASSWD" in names and not names & {"etc", "home", "work", "var", "mnt"}, names


def test_cannot_write_outside_the_work_dir(tmp_path):
  target = tmp_path / "planted.txt"
  os.chmod(tmp_path, 0o777)  # Even a world-writable host directory.
  for path in (str(target), "/usr/planted.txt"):
    result = native(f'int fd = open("{path}", O_WRONLY | O_CREAT, 0644);\n'
                    'say(fd >= 0 && write(fd, "x", 1) == 1 ? "WROTE" : "DENIED");', tmp_path)
    assert result.stdout == "DENIED", (path, result)
  assert not target.exists() and not os.path.exists("/usr/planted.txt")


def test_tmp_and_dev_shm_are_private_capped_and_vanish(tmp_path):
  marker = f"sao_marker_{uuid.uuid4().hex}"
  code = (HOOK_BYPASSES["rebind_builtin"] + "import os\n"
          f"for d in ('/tmp', '/dev/shm'):\n"
          f"    open(os.path.join(d, {marker!r}), 'w').write('x')\n"
          "    try:\n"
          "        open(os.path.join(d, 'big'), 'wb').write(b'x' * (2 << 20))\n"
          "        print(d, 'uncapped')\n"
          "    except OSError as e:\n"
          "        print(d, 'capped', e.errno)\n")
  result = sandbox.run_python(code, LIMITS)
  assert result.stdout.split("\n")[:2] == ["/tmp capped 28", "/dev/shm capped 28"], result
  assert not os.path.exists(f"/tmp/{marker}") and not os.path.exists(f"/dev/shm/{marker}")


def test_the_capped_mounts_cannot_be_unmounted_or_remounted(tmp_path):
  """Under each capped tmpfs lies an uncapped one (bwrap's root) or a host
  directory; neither unmounting nor remounting without the caps may reach it."""
  result = native('for (int i = 0; i < 3; i++) {\n'
                  '  const char *p[] = {"/tmp", "/dev/shm", "."};\n'
                  '  say(umount2(p[i], MNT_DETACH) == 0 ? "UNMOUNTED " : "KEPT ");\n'
                  '  say(mount("none", p[i], NULL, MS_REMOUNT, "nr_inodes=0,size=0") == 0 ?\n'
                  '      "REMOUNTED " : "KEPT ");\n'
                  '}', tmp_path)
  assert result.stdout.split() == ["KEPT"] * 6, result


def test_no_sysv_ipc_objects(tmp_path):
  """SysV shared memory outlives every mapping and fd (until its IPC namespace
  ends) and counts against no rlimit: one run held 768 MiB of it with
  memory_mb=256. Message queues and semaphore sets hold kernel memory likewise."""
  result = native('say(shmget(IPC_PRIVATE, 1 << 20, IPC_CREAT | 0600) < 0 ? "NOSHM " : "SHM ");\n'
                  'say(msgget(IPC_PRIVATE, IPC_CREAT | 0600) < 0 ? "NOMSG " : "MSG ");\n'
                  'say(semget(IPC_PRIVATE, 1, IPC_CREAT | 0600) < 0 ? "NOSEM" : "SEM");', tmp_path)
  assert result.stdout.split() == ["NOSHM", "NOMSG", "NOSEM"], result


def test_work_dir_bytes_are_capped(tmp_path):
  code = ("import os\nfor i in range(8):\n"
          "    open(f'part{i}', 'wb').write(b'x' * (512 << 10))\n")
  result = sandbox.run_python(code, LIMITS)  # 4 MiB in 512 KiB files; the cap is 1 MiB.
  assert not result.ok and "No space left on device" in result.stderr, result


def test_no_network_even_to_a_local_listener(tmp_path):
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    result = native(f'int s = socket(AF_INET, SOCK_STREAM, 0); struct sockaddr_in a = {{0}};\n'
                    f'a.sin_family = AF_INET; a.sin_port = htons({port});\n'
                    'inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);\n'
                    'say(s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0 ? '
                    '"CONNECTED" : "REFUSED");', tmp_path)
  assert result.stdout == "REFUSED", result


def test_host_processes_are_invisible(tmp_path):
  result = native('int n = 0; DIR *d = opendir("/proc"); struct dirent *e;\n'
                  'while (d && (e = readdir(d))) n += e->d_name[0] >= 49 && e->d_name[0] <= 57;\n'
                  f'say(kill({os.getpid()}, 0) == 0 ? "SEES_HOST " : "NO_HOST ");\n'
                  'say(n < 4 ? "FEW" : "MANY");', tmp_path)
  assert result.stdout == "NO_HOST FEW", result


def test_no_capabilities_and_an_unprivileged_uid(tmp_path):
  # capget, not /proc/self/status: the sandbox has no /proc.
  result = native('struct { unsigned version; int pid; } head = {0x20080522, 0};\n'
                  'struct { unsigned effective, permitted, inheritable; } data[2] = {{0}};\n'
                  'char line[64];\n'
                  'if (syscall(SYS_capget, &head, data) == 0) {\n'
                  '  snprintf(line, sizeof line, "CapEff: %08x%08x", data[1].effective,\n'
                  '           data[0].effective); say(line); }\n'
                  'say(getuid() == 65534 ? " NOBODY" : " OTHER");', tmp_path)
  assert result.stdout.split() == ["CapEff:", "0000000000000000", "NOBODY"], result


def test_episodes_cannot_see_each_others_files(tmp_path):
  # The coding environment's own floor (a full working copy must fit the work tmpfs).
  limits = dataclasses.replace(LIMITS, disk_mb=coding_env.MIN_SANDBOX_DISK_MB,
                               max_files=coding_env.MIN_SANDBOX_FILES)
  config = EnvConfig(name="coding", max_turns=5, difficulty=1, tool=limits)
  first, second = registry.make_env(config), registry.make_env(config)
  first.reset(coding_generator.generate_task(0, difficulty=1))
  second.reset(coding_generator.generate_task(1, difficulty=1))
  other = second.workspace.root
  module = next(n for n in os.listdir(other) if n.endswith(".py"))
  before = open(os.path.join(other, module)).read()
  attack = (HOOK_BYPASSES["rebind_builtin"] + "import os\n"
            f"print(os.listdir({other!r}))\n")
  seen = first.step(call("python", code=attack)).observation
  assert "No such file or directory" in seen and module not in seen, seen
  attack = (HOOK_BYPASSES["rebind_builtin"]
            + f"open({os.path.join(other, module)!r}, 'w').write('hacked')\n")
  first.step(call("python", code=attack))
  assert open(os.path.join(other, module)).read() == before


def test_without_bwrap_tool_execution_is_refused(monkeypatch, tmp_path):
  monkeypatch.setenv("PATH", str(tmp_path))  # No bwrap here.
  bwrap.unavailable_reason.cache_clear()
  try:
    with pytest.raises(sandbox.IsolationUnavailable, match="apt-get install bubblewrap"):
      sandbox.run_python("print('ran')", LIMITS)
    with pytest.raises(sandbox.IsolationUnavailable, match="env.sandbox='unisolated'"):
      registry.make_env(EnvConfig(max_turns=2))
  finally:
    bwrap.unavailable_reason.cache_clear()


def test_unisolated_is_an_explicit_loud_opt_in(monkeypatch, tmp_path, caplog):
  monkeypatch.setenv("PATH", str(tmp_path))
  bwrap.unavailable_reason.cache_clear()
  registry._warn_unisolated.cache_clear()
  try:
    env = registry.make_env(EnvConfig(max_turns=2, sandbox="unisolated"))
    assert "WITHOUT kernel isolation" in caplog.text
    env.reset(next(registry.make_tasks(EnvConfig())))
    assert env.step("```python\nprint(6 * 7)\n```").observation == "42"
  finally:
    bwrap.unavailable_reason.cache_clear()
  with pytest.raises(ValueError, match="env.sandbox='none' is invalid"):
    EnvConfig(sandbox="none").validate()


def test_only_the_interpreter_and_its_stdlib_are_there_no_host_details(tmp_path):
  """Past the audit hook: no /proc (its mountinfo named the host's scratch paths, and
  /proc/cmdline the host's boot line), an empty /dev/pts, and of the interpreter's
  installation only its executable, shared library and stdlib, whose site-packages
  is empty (it held the host's third-party packages)."""
  prefix = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
  code = HOOK_BYPASSES["rebind_builtin"] + f"""
import os
def show(path):
  try:
    print(path, sorted(os.listdir(path)) if os.path.isdir(path) else repr(read(path)[:40]))
  except OSError as error:
    print(path, type(error).__name__)
for path in ('/proc/self/mountinfo', '/proc/cmdline', '/proc', '/dev/pts', {prefix!r},
             {os.path.join(prefix, "bin")!r}, *{bwrap.site_directories()!r}):
  show(path)
import json, decimal, fractions, unicodedata  # the stdlib works
try:
  import numpy
  print('numpy importable')
except ImportError:
  print('no numpy')
"""
  result = sandbox.run_python(code, LIMITS)
  assert result.ok, result
  seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
  for path in ("/proc/self/mountinfo", "/proc/cmdline", "/proc"):
    assert seen[path] == "FileNotFoundError", (path, seen[path])
  assert seen["/dev/pts"] == "[]"
  if not prefix.startswith("/usr/"):  # an installation of its own (pyenv, a venv's base)
    assert set(eval(seen[prefix])) <= {"bin", "lib"}, seen[prefix]
    assert eval(seen[os.path.join(prefix, "bin")]) == [os.path.basename(
        os.path.realpath(sys.executable))]
  for site_dir in bwrap.site_directories():
    assert seen[site_dir] in ("[]", "FileNotFoundError"), (site_dir, seen[site_dir])
  assert "no numpy" in result.stdout
