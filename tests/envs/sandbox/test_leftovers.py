"""Scratch directories of SIGKILLed processes are reclaimed by the next environment.

Before, three SIGKILLed coding episodes left 6 directories / 82 MiB in $TMPDIR
(`sao_coding_*`, `sao_sandbox_*`, each with a copy of the working tree) and
nothing removed them."""

import os
import subprocess
import sys
import tempfile
import time

import pytest

from sao_jax import owner
from sao_jax.envs import sandbox
from sao_jax.envs.coding import env as coding
from sao_jax.envs.sandbox import files, scratch

LIMITS = sandbox.SandboxLimits(wall_time_s=60.0, cpu_time_s=30, memory_mb=256)
_EPISODE = r"""
import sys
from sao_jax.envs import sandbox
from sao_jax.envs.coding import env as coding, generator
from sao_jax.envs.coding.tools import format_tool_call as call
env = coding.CodingEnv(max_turns=5, sandbox_limits=sandbox.SandboxLimits(
    wall_time_s=60.0, cpu_time_s=30, memory_mb=256))
env.reset(generator.generate_task(0, difficulty=2))
env.step(call("python", code="import time\ntime.sleep(60)\n"))
"""


@pytest.fixture
def tmpdir_for_sandbox(monkeypatch):
  """A $TMPDIR the sandbox's unprivileged user can traverse, for this process and its children."""
  top = tempfile.mkdtemp(prefix="sao_leftovers_test_")
  os.chmod(top, 0o711)
  monkeypatch.setattr(tempfile, "tempdir", top)
  yield top
  files.remove_tree(top)


def _kill_mid_tool_run(top: str) -> list[str]:
  """Runs a coding episode whose `python` call sleeps, SIGKILLs it once both its
  episode and its tool-run directories exist; returns what it left in `top`."""
  caller = subprocess.Popen([sys.executable, "-c", _EPISODE],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                                 "TMPDIR": top})
  try:
    deadline = time.monotonic() + 60
    while not {"sao_coding_", "sao_sandbox_"} <= {n[:n.index("_", 4) + 1] for n in os.listdir(top)}:
      assert time.monotonic() < deadline and caller.poll() is None, "the episode never ran its tool"
      time.sleep(0.05)
    time.sleep(0.5)  # into the tool run
  finally:
    caller.kill()
    caller.wait()
  return sorted(os.listdir(top))


def test_sigkilled_episodes_leave_directories_the_next_environment_reclaims(tmpdir_for_sandbox):
  left = _kill_mid_tool_run(tmpdir_for_sandbox)
  assert any(n.startswith("sao_coding_") for n in left), left
  assert any(n.startswith("sao_sandbox_") for n in left), left
  env = coding.CodingEnv(max_turns=5, sandbox_limits=LIMITS)
  assert sorted(env.reclaimed) == left
  assert os.listdir(tmpdir_for_sandbox) == []


def test_a_live_owner_keeps_its_directories(tmpdir_for_sandbox):
  mine = scratch.make("sao_coding_")
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    theirs = tempfile.mkdtemp(prefix=f"sao_sandbox_{owner.token(sleeper.pid)}_")
    assert scratch.reclaim() == []
    assert os.path.isdir(mine) and os.path.isdir(theirs)
  finally:
    sleeper.kill()
    sleeper.wait()
  assert scratch.reclaim() == [os.path.basename(theirs)]
  assert os.path.isdir(mine)


def test_a_reused_pid_does_not_keep_a_dead_owners_directory(tmpdir_for_sandbox):
  """Same pid (this process's), other start time: that owner is gone."""
  namespace, pid, started = owner.token().split(".")
  stale = tempfile.mkdtemp(prefix=f"sao_coding_{namespace}.{pid}.{int(started) - 1}_")
  assert scratch.reclaim() == [os.path.basename(stale)]


def test_another_pid_namespaces_directories_are_left_alone(tmpdir_for_sandbox):
  """A container sharing $TMPDIR: its pids mean nothing here."""
  namespace, _, _ = owner.token().split(".")
  other = tempfile.mkdtemp(prefix=f"sao_coding_{int(namespace) + 1}.999999.1_")
  assert scratch.reclaim() == []
  assert os.path.isdir(other)


def test_reclaiming_never_follows_a_planted_link(tmpdir_for_sandbox):
  """$TMPDIR is shared: a link named like a dead owner's directory must not steer the deletion."""
  target = tempfile.mkdtemp(prefix="precious_", dir=tmpdir_for_sandbox)
  with open(os.path.join(target, "keep"), "w") as f:
    f.write("data")
  namespace, _, _ = owner.token().split(".")
  os.symlink(target, os.path.join(tmpdir_for_sandbox, f"sao_coding_{namespace}.4194000.1_x"))
  assert scratch.reclaim() == []
  assert os.path.exists(os.path.join(target, "keep"))


def test_directories_without_an_owner_are_left_alone(tmpdir_for_sandbox):
  old = tempfile.mkdtemp(prefix="sao_coding_")  # named as before owners were
  assert scratch.reclaim() == []
  assert os.path.isdir(old)
