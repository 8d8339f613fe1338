"""`python -m sao_jax.envs.sandbox.prepare`: checks the host, changes nothing on it.

It used to make `/root` o+x for good (so that the sandbox's nobody could reach a
pyenv interpreter under it), after which any local user could open the
world-readable files with guessable names there."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from sao_jax.envs.sandbox import bwrap, files, prepare


def test_prepare_reports_that_isolation_works_here(capsys):
  assert prepare.main() == 0
  out = capsys.readouterr().out
  assert "kernel isolation (bwrap) works here" in out
  assert "no permissions are changed" in out
  assert "memory of a tool run is bounded by " + bwrap.memory_mode() in out


# In a private mount namespace (nothing here reaches the host's mounts): the top
# directory above the interpreter becomes an empty 0700 tmpfs, a home like /root,
# holding a world-readable canary with a guessable name, and the interpreter's
# installation is bound back at its own path. Then: prepare, the sandbox's
# self-test and a tool run, each as a fresh process.
_EMULATED_HOME = r'''
set -e
home=$1; prefix=$2; hold=$3; shift 3
mount --bind "$prefix" "$hold"
mount -t tmpfs -o mode=0700 emulated_home "$home"
mkdir -p "$prefix"
mount --bind "$hold" "$prefix"
echo hunter2 > "$home/canary.txt"; chmod 0644 "$home/canary.txt"
"$@" -m sao_jax.envs.sandbox.prepare
echo "HOME_MODE $(stat -c %a "$home")"
if setpriv --reuid=65534 --regid=65534 --clear-groups cat "$home/canary.txt" 2>/dev/null; then
  echo CANARY_READ_BY_NOBODY
else
  echo CANARY_SAFE
fi
"$@" -c "
from sao_jax.envs import sandbox
result = sandbox.run_python(
    'import os\ntry:\n  print(open(\"$home/canary.txt\").read())\nexcept OSError as e:\n  print(\"NO_CANARY\", type(e).__name__)\n',
    sandbox.SandboxLimits(wall_time_s=20.0))
print('TOOL', result.stdout.strip(), result.exit_code)
"
'''


@pytest.mark.slow  # three interpreter starts that import the package, ~30 s on 2 shared cores
def test_an_interpreter_under_a_private_home_works_and_the_home_stays_private():
  if os.geteuid() != 0 or shutil.which("unshare") is None:
    pytest.skip("emulating a 0700 home needs root and unshare (a private mount namespace)")
  prefix = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
  home = "/" + prefix.split("/")[1]
  if home in ("/usr", "/tmp") or prefix == home:
    pytest.skip(f"the interpreter ({prefix}) is not installed below a home-like directory")
  hold = tempfile.mkdtemp(prefix="sao_prepare_test_")
  try:
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _EMULATED_HOME, "sh",
         home, prefix, hold, sys.executable],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
  finally:
    files.remove_tree(hold)
  out = result.stdout
  assert result.returncode == 0, (out, result.stderr)
  assert "kernel isolation (bwrap) works here" in out, (out, result.stderr)
  assert "HOME_MODE 700" in out, out  # was 701: o+x added for good
  assert "CANARY_SAFE" in out, out
  assert "TOOL NO_CANARY" in out and "hunter2" not in out, out


def test_a_private_temporary_directory_gets_a_clear_self_test_message(monkeypatch):
  if os.geteuid() != 0:
    pytest.skip("only root's sandbox runs as another user (nobody) who must traverse TMPDIR")
  private = tempfile.mkdtemp(prefix="sao_private_tmp_")  # mode 0700
  monkeypatch.setattr(tempfile, "tempdir", private)
  try:
    reason = bwrap.unavailable_reason.__wrapped__()
  finally:
    files.remove_tree(private)
  assert reason is not None
  assert f"temporary directory {private} cannot be reached" in reason, reason
  assert "(mode 0700)" in reason and "Set TMPDIR" in reason, reason
