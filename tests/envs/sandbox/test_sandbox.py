"""The Python sandbox contains model misbehaviour and reports it; the caller survives."""

import dataclasses
import os
import pathlib

import pytest

from sao_jax.config.env import SANDBOX_MODES
from sao_jax.envs import sandbox

LIMITS = sandbox.SandboxLimits(wall_time_s=3.0, cpu_time_s=1, memory_mb=256,
                               max_output_bytes=1000)
PROJECT_FILE = pathlib.Path(__file__).resolve().parents[3] / "pyproject.toml"


def run(code, limits=LIMITS):
  return sandbox.run_python(code, limits)


def test_normal_code_runs_and_its_directory_is_removed():
  result = run("import math, os\n"
               "open('out.txt', 'w').write(str(math.factorial(5)))\n"
               "print(open('out.txt').read())\n"
               "print(os.getcwd())\n")
  assert result.ok, result.stderr
  value, workdir = result.stdout.split()
  assert value == "120"
  assert not os.path.exists(workdir)
  assert not (result.timed_out or result.stdout_truncated or result.stderr_truncated)


def test_errors_are_reported_with_a_traceback():
  result = run("x = 1\n1 / x.missing\n")
  assert result.exit_code == 1 and result.killed_reason is None
  assert "AttributeError" in result.stderr and 'File "main.py", line 2' in result.stderr


def test_infinite_loop_hits_the_cpu_limit():
  # Wall time well above the CPU limit, so that a loaded machine cannot hit it first.
  limits = dataclasses.replace(LIMITS, wall_time_s=15.0)
  result = run("while True:\n  pass\n", limits)
  assert result.killed_reason == "cpu_time" and not result.ok


def test_sleeping_forever_hits_the_wall_clock_limit():
  limits = sandbox.SandboxLimits(wall_time_s=1.0, cpu_time_s=5)
  result = run("import time\nprint('started', flush=True)\ntime.sleep(60)\n", limits)
  assert result.timed_out and result.killed_reason == "wall_time"
  assert result.stdout == "started\n"
  assert result.wall_time_s < 3


def test_closing_the_pipes_does_not_escape_the_wall_clock():
  limits = sandbox.SandboxLimits(wall_time_s=1.0, cpu_time_s=5)
  result = run("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)\n", limits)
  assert result.timed_out and result.wall_time_s < 3


def test_fork_bomb_is_contained():
  result = run("import os\nwhile True:\n  os.fork()\n")
  assert not result.ok and "PermissionError" in result.stderr
  result = run("import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])\n")
  assert not result.ok and "PermissionError" in result.stderr


def test_threads_are_limited_by_rlimit_nproc():
  result = run("import threading\nthreading.Thread(target=print).start()\n")
  assert not result.ok and "can't start new thread" in result.stderr


def test_memory_bomb_gets_memory_error():
  result = run("blocks = []\nwhile True:\n  blocks.append(bytearray(10**7))\n")
  assert not result.ok and "MemoryError" in result.stderr


def test_huge_output_is_truncated_and_flagged():
  result = run("print('x' * 10**7)\nimport sys\nsys.stderr.write('e' * 5000)\n")
  assert result.ok
  assert result.stdout == "x" * 1000 and result.stdout_truncated
  assert result.stderr == "e" * 1000 and result.stderr_truncated


def test_file_size_is_limited():
  limits = sandbox.SandboxLimits(file_size_mb=1, wall_time_s=5)
  result = run("open('big', 'wb').write(b'0' * (2 << 20))\n", limits)
  assert not result.ok and "File too large" in result.stderr


@pytest.mark.parametrize("path", ["/etc/passwd", str(PROJECT_FILE)])
def test_files_outside_the_sandbox_cannot_be_read(path):
  assert os.path.exists(path)  # The file exists for the caller...
  result = run(f"print(open({path!r}).read())\n")
  assert not result.ok and "not allowed" in result.stderr  # ...but not in the sandbox.
  assert result.stdout == ""


def test_directories_outside_the_sandbox_cannot_be_listed_or_changed():
  for code in (f"import os\nprint(os.listdir({str(PROJECT_FILE.parent)!r}))\n",
               f"import os\nos.remove({str(PROJECT_FILE)!r})\n",
               f"import os\nos.symlink({str(PROJECT_FILE)!r}, 'link')\n",
               f"open({str(PROJECT_FILE.parent / 'sandbox_was_here')!r}, 'w')\n"):
    result = run(code)
    assert not result.ok and "not allowed" in result.stderr, code
  assert PROJECT_FILE.exists()
  assert not (PROJECT_FILE.parent / "sandbox_was_here").exists()


def test_sockets_are_blocked():
  result = run("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))\n")
  assert not result.ok and "socket.__new__ is not allowed" in result.stderr
  result = run("import socket\nsocket.getaddrinfo('example.com', 80)\n")
  assert not result.ok and "not allowed" in result.stderr


def test_killing_the_parent_is_contained():
  for target in ("os.getppid()", str(os.getpid())):
    result = run(f"import os, signal\nos.kill({target}, signal.SIGKILL)\n")
    assert not result.ok and "os.kill is not allowed" in result.stderr
  result = run("import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)\n")
  assert not result.ok
  assert os.getpid() > 0  # Still here.


def test_caller_environment_is_not_inherited(monkeypatch):
  monkeypatch.setenv("SAO_SANDBOX_SECRET", "hunter2")
  result = run("import os\nprint(sorted(os.environ))\n")
  assert result.ok and "SAO_SANDBOX_SECRET" not in result.stdout


def test_limits_cannot_be_raised_from_inside():
  result = run("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))\n")
  assert not result.ok and "not allowed" in result.stderr


def test_invalid_limits_name_the_field():
  with pytest.raises(ValueError, match="env.tool.cpu_time_s=0"):
    run("print(1)", sandbox.SandboxLimits(cpu_time_s=0))


@pytest.mark.parametrize("field, value, allowed", [
    ("cpu_time_s", 10**30, "at most 604800 seconds"), ("cpu_time_s", 2**63, "at most 604800"),
    ("memory_mb", 10**30, "at most 8796093022207 MiB"),
    ("file_size_mb", 10**15, "at most 8796093022207 MiB")])
def test_a_limit_beyond_what_the_kernel_takes_is_refused_at_validation(field, value, allowed):
  # Before: valid, and then every tool run failed with SandboxError (the bootstrap's
  # setrlimit: OverflowError), dropping every episode of a tool environment.
  limits = sandbox.SandboxLimits(**{field: value})
  with pytest.raises(ValueError, match=f"env.tool.{field}={value}.*{allowed}"):
    limits.validate()
  largest = {"cpu_time_s": 7 * 24 * 3600}.get(field, (2**63 - 1) >> 20)
  assert run("print(1)", dataclasses.replace(LIMITS, **{field: largest})).stdout == "1\n"


@pytest.mark.parametrize("code, error", [("x = " + "-" * 100_000 + "1", "MemoryError"),
                                         ("x = " + "+" * 5_000 + "1", "RecursionError")])
def test_code_too_nested_to_compile_is_the_codes_fault_not_a_harness_failure(code, error):
  # The bootstrap compiled it before READY and died: SandboxError, so a policy could turn
  # any math or coding episode into an environment failure (dropped, not reward 0).
  result = sandbox.run_python(code, LIMITS)
  assert result.exit_code == 1 and result.killed_reason is None and error in result.stderr


def test_a_broken_interpreter_is_a_harness_error(monkeypatch):
  monkeypatch.setattr(sandbox.process.sys, "executable", "/nonexistent/python")
  with pytest.raises(sandbox.SandboxError):
    run("print(1)")


def test_syntax_error_is_the_codes_fault_not_a_harness_failure():
  """Regression: a SyntaxError in model code used to raise SandboxError
  ("bootstrap did not start"), turning a wrong action into an environment
  failure that training filters out."""
  for code, message in (("print(3 - 9", "'(' was never closed"),
                        ("x = '\x00'", "cannot contain null bytes")):
    result = sandbox.run_python(code, sandbox.SandboxLimits())
    assert result.exit_code == 1 and result.killed_reason is None
    assert "SyntaxError" in result.stderr and message in result.stderr


@pytest.mark.parametrize("code, warning", [("x = 5\nprint(x is 5)\n", "SyntaxWarning"),
                                           ("print(len('\\d'))\nprint((1, 2) (3))\n",
                                            "SyntaxWarning")])
def test_compiler_warnings_are_the_codes_output_not_a_harness_failure(code, warning):
  # The bootstrap compiled the code before READY and the compiler's warning came first on
  # stderr: SandboxError ("bootstrap did not start"), so a policy that wrote `x is 5` turned
  # its episode into an environment failure (dropped) instead of a scored answer.
  result = sandbox.run_python(code, LIMITS)
  assert "main.py:2: " + warning in result.stderr
  if "x is 5" in code:
    assert result.ok and result.stdout == "True\n" and "print(x is 5)" in result.stderr
  else:  # the call on a tuple still fails when it runs: the code's error, after its warning
    assert result.exit_code == 1 and result.stdout == "2\n" and "TypeError" in result.stderr


@pytest.mark.parametrize("isolation", SANDBOX_MODES)
def test_the_work_directory_is_not_imported_from_before_the_code_runs(tmp_path, isolation):
  # Compiling "\N{...}" imports unicodedata; with the work directory already on the
  # path, an agent's unicodedata.py ran inside the compile (unisolated: the copy is
  # there from the start), before the start marker, so its output made the run a
  # harness failure: an episode the policy could drop at will.
  (tmp_path / "unicodedata.py").write_text("import sys\nsys.stderr.write('planted')\n")
  result = sandbox.run_python('print("\\N{BULLET}")', LIMITS, workdir=tmp_path,
                              isolation=isolation)
  assert result.ok and result.stdout == "\u2022\n" and not result.stderr, result
  imported = sandbox.run_python("import unicodedata", LIMITS, workdir=tmp_path,
                                isolation=isolation)
  assert imported.stderr == "planted"  # the code itself still imports from its directory


def test_compiler_warnings_shown_are_bounded():
  # One long line can hold thousands of warnings, each quoting the whole line: 5000 here,
  # each with ~35 kB of line (~170 MB of text had they all been formatted).
  code = "x = 1\ny = " + " or ".join(["x is 1"] * 5000) + "\nprint('ran', y)\n"
  result = sandbox.run_python(code, sandbox.SandboxLimits())
  assert result.ok and result.stdout == "ran True\n"
  assert result.stderr.count("SyntaxWarning") == 20
  assert "(4980 more compiler warnings not shown)" in result.stderr
