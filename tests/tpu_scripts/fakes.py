"""A fake `gcloud` (plus `curl` and a VM python) for the tpu_scripts tests.

The fake gcloud appends its argv as one JSON line per call to calls.jsonl and
answers `describe` from env vars: FAKE_QR_STATES (space-separated, one per call,
the last repeats), FAKE_QR_REASON, FAKE_NODE_STATE. `tpu-vm ssh` exits with
FAKE_SSH_RCS (same sequence rule), or, with FAKE_WORKERS_DIR set, really runs the
remote command once per worker (FAKE_NUM_WORKERS, default 2) with
HOME=$FAKE_WORKERS_DIR/w<N>, and `tpu-vm scp` copies files to/from those homes:
that executes the remote scripts the way the VMs would.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tpu_scripts"

SETTINGS = {
  "PROJECT": "proj-1",
  "ZONE": "us-east5-a",
  "TPU_NAME": "sao-test",
  "ACCELERATOR_TYPE": "v5p-32",
  "RUNTIME_VERSION": "v2-alpha-tpuv5",
  "JAX_VERSION": "0.10.2",
  "POLL_INTERVAL": "0.01",
  "POLL_TIMEOUT": "5",
}

_FAKE_GCLOUD = r'''#!{python}
import glob, json, os, pathlib, shutil, subprocess, sys

argv = sys.argv[1:]
home = pathlib.Path(os.environ["FAKE_GCLOUD_DIR"])
with open(home / "calls.jsonl", "a") as f:
  f.write(json.dumps(argv) + "\n")


def next_in(var, default):
  """The next value of the space-separated sequence in $var; the last repeats."""
  seq = os.environ.get(var, default).split()
  counter = home / (var + ".count")
  i = int(counter.read_text()) if counter.exists() else 0
  counter.write_text(str(i + 1))
  return seq[min(i, len(seq) - 1)]


def flag(name):
  return next((a.split("=", 1)[1] for a in argv if a.startswith("--" + name + "=")), None)


def workers():
  root = pathlib.Path(os.environ["FAKE_WORKERS_DIR"])
  which = flag("worker")
  ids = range(int(os.environ.get("FAKE_NUM_WORKERS", "2"))) if which == "all" else [int(which)]
  for i in ids:
    (root / f"w{i}").mkdir(parents=True, exist_ok=True)
  return [(i, root / f"w{i}") for i in ids]


assert argv[:2] == ["compute", "tpus"], argv
group, verb = argv[2], argv[3]
positional = [a for a in argv[4:] if not a.startswith("--")]
if group == "queued-resources" and verb == "describe":
  if flag("format") == "value(state.state)":
    print(next_in("FAKE_QR_STATES", "ACTIVE"))
  else:
    print("state:\n  failedData:\n    error:\n      code: 8\n      message: "
          + os.environ.get("FAKE_QR_REASON", "") + "\n  state: FAILED")
elif group == "tpu-vm" and verb == "describe":
  print(os.environ.get("FAKE_NODE_STATE", "READY"))
elif group == "tpu-vm" and verb == "ssh" and "FAKE_WORKERS_DIR" in os.environ:
  rc = 0
  for i, whome in workers():
    # What the VM's login shell gets: a bare environment, no local settings.
    # Worker 0 has TPU_WORKER_ID; the others ask the (fake) metadata server.
    env = {"PATH": os.environ["PATH"], "HOME": str(whome), "FAKE_WORKER": str(i)}
    if i == 0:
      env["TPU_WORKER_ID"] = "0"
    rc = max(rc, subprocess.run(["sh", "-c", flag("command")], env=env, cwd=whome).returncode)
  sys.exit(rc)
elif group == "tpu-vm" and verb == "ssh":
  sys.exit(int(next_in("FAKE_SSH_RCS", "0")))
elif group == "tpu-vm" and verb == "scp" and "FAKE_WORKERS_DIR" in os.environ:
  src, dst = positional[1:] if len(positional) == 3 else positional
  for i, whome in workers():
    if ":" in src:  # from the VM
      for path in glob.glob(str(whome / src.split(":", 1)[1])):
        shutil.copy(path, dst)
    else:
      shutil.copy(src, whome / dst.split(":", 1)[1])
elif group == "queued-resources" and verb == "create":
  sys.exit(int(os.environ.get("FAKE_CREATE_RC", "0")))
'''

# Answers the metadata query run.sh makes for the worker number.
_FAKE_CURL = """#!/bin/sh
case "$*" in
  *agent-worker-number*) echo "$FAKE_WORKER" ;;
  *) exit 22 ;;
esac
"""

# Stands in for the VM's python: `-m venv` makes a venv holding a copy of this
# script, pip only records its arguments, `-c` answers the version checks.
_FAKE_PYTHON = """#!/bin/sh
echo "$0 $*" >> "$HOME/python_calls.log"
case "$1" in
  -m) if [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && : > "$3/bin/activate"; fi ;;
  -c) case "$2" in *version_info*) exit {old} ;; *jax*) echo 0.10.2 ;; esac ;;
  -V) echo "Python {version}" ;;
esac
"""


class Fake:
  """A tmp dir with the fake gcloud first on PATH; runs scripts against it."""

  def __init__(self, tmp_path):
    self.dir = tmp_path / "gcloud"
    self.bin = tmp_path / "bin"
    self.workers = tmp_path / "workers"
    for d in (self.dir, self.bin):
      d.mkdir()
    self._write(self.bin / "gcloud", _FAKE_GCLOUD.replace("{python}", sys.executable))
    self._write(self.bin / "curl", _FAKE_CURL)
    self.env = {
      "PATH": f"{self.bin}:{os.environ['PATH']}",
      "HOME": str(tmp_path / "local_home"),
      "FAKE_GCLOUD_DIR": str(self.dir),
      **SETTINGS,
    }

  @staticmethod
  def _write(path, text):
    path.write_text(text)
    path.chmod(0o755)

  def run(self, script, *args, stdin=subprocess.DEVNULL, **env):
    """Runs tpu_scripts/<script>; env overrides the settings, a None value unsets one."""
    merged = {**self.env, **env}
    for k in [k for k, v in merged.items() if v is None]:
      del merged[k]
    return subprocess.run([str(SCRIPTS / script), *args], env=merged, stdin=stdin,
                          capture_output=True, text=True, timeout=60)

  def calls(self):
    log = self.dir / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

  def verbs(self):
    return [" ".join(c[2:4]) for c in self.calls()]

  def worker_home(self, i):
    return self.workers / f"w{i}"

  def write_python(self, name, version, old):
    """A fake VM python called `name` reporting `version`; `old` fails the >= 3.11 check."""
    path = self.bin / name
    self._write(path, _FAKE_PYTHON.format(old=int(old), version=version))
    return path

