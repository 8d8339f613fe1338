"""tpu_scripts/*.sh against a fake `gcloud` (fakes.py): dry-run output and the real argv.

Dry runs must print exactly the gcloud commands and run none. Normal runs are
checked through the argv the fake records, and copy/setup/run/logs also through
what their remote scripts do on fake worker homes.
"""

import os
import pty
import re
import shlex
import shutil
import subprocess

import pytest
from fakes import SCRIPTS, SETTINGS, Fake

SCRIPT_NAMES = ["create.sh", "setup.sh", "copy.sh", "run.sh", "logs.sh", "delete.sh"]
ROOT = SCRIPTS.parent
LOC = ["--project=proj-1", "--zone=us-east5-a"]
STATE_FORMAT = "--format=value(state.state)"


@pytest.fixture
def fake(tmp_path):
  return Fake(tmp_path)


def dry_run_commands(result):
  """The argv of every `DRY_RUN: gcloud ...` line; stdout must hold nothing else."""
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines, "dry run printed no commands"
  for line in lines:
    assert line.startswith("DRY_RUN: gcloud "), f"not a dry-run command line: {line!r}"
  return [shlex.split(line.removeprefix("DRY_RUN: "))[1:] for line in lines]


def remote_script(ssh_argv):
  """The bash script inside `--command=bash -c '<script>'`."""
  command = [a for a in ssh_argv if a.startswith("--command=")]
  assert len(command) == 1, ssh_argv
  words = shlex.split(command[0].removeprefix("--command="))
  assert words[:2] == ["bash", "-c"] and len(words) == 3, words
  return words[2]


def create_argv(*tier):
  return ["compute", "tpus", "queued-resources", "create", "sao-test-qr", "--node-id=sao-test",
          "--accelerator-type=v5p-32", "--runtime-version=v2-alpha-tpuv5", *LOC, *tier]


DESCRIBE = ["compute", "tpus", "queued-resources", "describe", "sao-test-qr", *LOC, STATE_FORMAT]


# --- dry run ---------------------------------------------------------------


@pytest.mark.parametrize("tier_env,tier_flags", [
  ({}, []), ({"SPOT": "1"}, ["--spot"]), ({"RESERVED": "1"}, ["--reserved"])])
def test_create_dry_run_prints_create_and_one_describe(fake, tier_env, tier_flags):
  result = fake.run("create.sh", DRY_RUN="1", **tier_env)
  assert dry_run_commands(result) == [create_argv(*tier_flags), DESCRIBE]
  assert fake.calls() == [], "a dry run must not call gcloud"


def test_qr_id_setting_overrides_the_default(fake):
  result = fake.run("create.sh", DRY_RUN="1", QR_ID="my-qr")
  create, describe = dry_run_commands(result)
  assert create[4] == "my-qr" and describe[4] == "my-qr"


def test_setup_dry_run(fake):
  [ssh] = dry_run_commands(fake.run("setup.sh", DRY_RUN="1"))
  assert ssh[:5] == ["compute", "tpus", "tpu-vm", "ssh", "sao-test"]
  assert ssh[5:8] == [*LOC, "--worker=all"]
  script = remote_script(ssh)
  assert 'sao_jax_venv/bin/python -m pip install --quiet "jax[tpu]==0.10.2"' in script
  # The gcs extra: gcsfs, without which a gs:// checkpoint directory fails.
  assert "sao_jax_venv/bin/python -m pip install --quiet -e 'sao_jax[gcs]'" in script
  assert "if [ ! -x sao_jax_venv/bin/python ]; then" in script


def test_copy_dry_run(fake, tmp_path):
  scp, ssh = dry_run_commands(fake.run("copy.sh", DRY_RUN="1", SRC_DIR=str(empty_src(tmp_path))))
  assert scp[:4] == ["compute", "tpus", "tpu-vm", "scp"]
  assert scp[4].endswith("/sao_jax_src.tar.gz")
  assert scp[5:] == ["sao-test:sao_jax_src.tar.gz", *LOC, "--worker=all"]
  assert ssh[3:8] == ["ssh", "sao-test", *LOC, "--worker=all"]
  assert "tar -xzf sao_jax_src.tar.gz -C sao_jax.incoming" in remote_script(ssh)


def test_run_dry_run_quotes_the_program_once(fake):
  result = fake.run("run.sh", "--", "sao-train", "--config", "configs/x y.py", "--set", "a.b='c'",
                    DRY_RUN="1", RUN_NAME="r1", BUCKET="gs://b/sao")
  [ssh] = dry_run_commands(result)
  assert ssh[3:8] == ["ssh", "sao-test", *LOC, "--worker=all"]
  script = remote_script(ssh)
  assert "sao-train --config 'configs/x y.py' --set 'a.b='\\''c'\\' 2>&1 | tee \"$log\"" in script
  assert "export RUN_NAME=r1 RELAUNCH_ATTEMPT=0 BUCKET=gs://b/sao" in script


def test_logs_and_delete_dry_run(fake):
  [ssh] = dry_run_commands(fake.run("logs.sh", "--worker=3", "--follow", DRY_RUN="1", RUN_NAME="r1"))
  assert ssh[3:8] == ["ssh", "sao-test", *LOC, "--worker=3"]
  assert "ls -1 -- r1-worker*.log" in remote_script(ssh)
  assert "tail -n 50 -F" in remote_script(ssh)
  [scp] = dry_run_commands(fake.run("logs.sh", "--fetch=out", DRY_RUN="1", RUN_NAME="r1"))
  assert scp == ["compute", "tpus", "tpu-vm", "scp", "sao-test:logs/r1-worker*.log", "out", *LOC,
                 "--worker=all"]
  [delete] = dry_run_commands(fake.run("delete.sh", DRY_RUN="1"))
  assert delete == ["compute", "tpus", "queued-resources", "delete", "sao-test-qr", *LOC,
                    "--force", "--quiet"]
  assert fake.calls() == []


# --- settings and usage ----------------------------------------------------


@pytest.mark.parametrize("script", SCRIPT_NAMES)
def test_help(fake, script):
  result = fake.run(script, "--help")
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith(f"Usage: tpu_scripts/{script}")
  assert "PROJECT" in result.stdout and "DRY_RUN=1" in result.stdout


@pytest.mark.parametrize("script,args,missing", [
  ("create.sh", [], ["PROJECT", "ZONE", "TPU_NAME", "ACCELERATOR_TYPE", "RUNTIME_VERSION"]),
  ("setup.sh", [], ["PROJECT", "ZONE", "TPU_NAME", "JAX_VERSION"]),
  ("copy.sh", [], ["PROJECT", "ZONE", "TPU_NAME"]),
  ("run.sh", ["--", "true"], ["PROJECT", "ZONE", "TPU_NAME"]),
  ("run.sh", ["--relaunch", "2", "--", "true"],
   ["PROJECT", "ZONE", "TPU_NAME", "ACCELERATOR_TYPE", "RUNTIME_VERSION", "JAX_VERSION"]),
  ("logs.sh", [], ["PROJECT", "ZONE", "TPU_NAME"]),
  ("delete.sh", ["--yes"], ["PROJECT", "ZONE", "TPU_NAME"]),
])
def test_missing_settings_are_named(fake, script, args, missing):
  result = fake.run(script, *args, **{k: None for k in SETTINGS})
  assert result.returncode == 2
  for name in missing:
    assert f"error: {name} is not set; for example: export {name}=" in result.stderr
  assert f"Usage: tpu_scripts/{script}" in result.stderr
  assert fake.calls() == []


def test_one_missing_setting_names_only_that_one(fake):
  result = fake.run("setup.sh", JAX_VERSION=None)
  assert result.returncode == 2
  assert "error: JAX_VERSION is not set; for example: export JAX_VERSION=0.10.2" in result.stderr
  assert "PROJECT is not set" not in result.stderr


@pytest.mark.parametrize("env,message", [
  ({"SPOT": "1", "RESERVED": "1"}, "SPOT=1 and RESERVED=1 are both set"),
  ({"SPOT": "yes"}, "SPOT=yes; use SPOT=1 or SPOT=0"),
  ({"ACCELERATOR_TYPE": "v5p"}, "ACCELERATOR_TYPE=v5p is not a TPU type"),
  ({"POLL_INTERVAL": "fast"}, "POLL_INTERVAL=fast"),
])
def test_bad_settings_fail_with_the_value(fake, env, message):
  result = fake.run("create.sh", **env)
  assert result.returncode != 0
  assert message in result.stderr
  assert fake.calls() == []


def test_no_gcloud_on_path(fake, tmp_path):
  # Only what the scripts need before the check; never the machine's real gcloud.
  bare = tmp_path / "bare_bin"
  bare.mkdir()
  for tool in ("bash", "dirname"):
    (bare / tool).symlink_to(shutil.which(tool))
  result = fake.run("create.sh", PATH=str(bare))
  assert result.returncode == 1
  assert "gcloud is not on PATH; install the Google Cloud CLI" in result.stderr
  assert fake.run("create.sh", PATH=str(bare), DRY_RUN="1").returncode == 0


def test_run_needs_a_program(fake):
  result = fake.run("run.sh")
  assert result.returncode == 2 and "no program given" in result.stderr
  result = fake.run("run.sh", "sao-train")
  assert result.returncode == 2 and "put the program after --" in result.stderr


# --- create against the fake -----------------------------------------------


@pytest.mark.parametrize("tier_env,tier_flags", [({"SPOT": "1"}, ["--spot"]), ({}, [])])
def test_create_polls_until_active(fake, tier_env, tier_flags):
  states = "ACCEPTED WAITING_FOR_RESOURCES WAITING_FOR_RESOURCES PROVISIONING ACTIVE"
  result = fake.run("create.sh", FAKE_QR_STATES=states, **tier_env)
  assert result.returncode == 0, result.stderr
  assert fake.calls() == [create_argv(*tier_flags)] + [DESCRIBE] * 5
  assert "WAITING_FOR_RESOURCES" in result.stderr and "is ACTIVE" in result.stderr


@pytest.mark.parametrize("final", ["FAILED", "SUSPENDED"])
def test_create_fails_with_the_reason(fake, final):
  reason = "Insufficient capacity for v5p-32 in us-east5-a"
  result = fake.run("create.sh", FAKE_QR_STATES=f"WAITING_FOR_RESOURCES {final}", FAKE_QR_REASON=reason)
  assert result.returncode == 1
  assert f"error: queued resource sao-test-qr is {final}" in result.stderr
  assert reason in result.stderr
  calls = fake.calls()
  assert calls[:3] == [create_argv(), DESCRIBE, DESCRIBE]
  assert calls[3][:5] == DESCRIBE[:5] and "--format=yaml(state)" in calls[3]


def test_create_gives_up_after_poll_timeout(fake):
  result = fake.run("create.sh", FAKE_QR_STATES="WAITING_FOR_RESOURCES", POLL_TIMEOUT="2",
                    POLL_INTERVAL="0.2")
  assert result.returncode == 1
  assert "still WAITING_FOR_RESOURCES after 2s (POLL_TIMEOUT)" in result.stderr
  # Between 1 and 2 s of polling every 0.2 s.
  assert 2 <= fake.verbs().count("queued-resources describe") <= 12


def test_create_wait_only_does_not_create(fake):
  result = fake.run("create.sh", "--wait-only", FAKE_QR_STATES="PROVISIONING ACTIVE")
  assert result.returncode == 0, result.stderr
  assert fake.calls() == [DESCRIBE, DESCRIBE]


def test_create_stops_when_gcloud_create_fails(fake):
  result = fake.run("create.sh", FAKE_CREATE_RC="1")
  assert result.returncode == 1
  assert fake.verbs() == ["queued-resources create"]


# --- copy / setup / run / logs, executed on fake workers ---------------------


def make_tree(root):
  (root / "sao_jax").mkdir(parents=True)
  (root / "sao_jax" / "__init__.py").write_text("")
  (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
  (root / "stale.txt").write_text("old")
  for junk in (".git/HEAD", ".venv/bin/python", "sao_jax/__pycache__/x.pyc"):
    (root / junk).parent.mkdir(parents=True, exist_ok=True)
    (root / junk).write_text("junk")


def test_copy_ships_the_tree_without_git_and_venv(fake, tmp_path):
  src = tmp_path / "src"
  make_tree(src)
  env = {"SRC_DIR": str(src), "FAKE_WORKERS_DIR": str(fake.workers)}
  result = fake.run("copy.sh", **env)
  assert result.returncode == 0, result.stderr
  assert fake.verbs() == ["tpu-vm scp", "tpu-vm ssh"]
  assert all("--worker=all" in c for c in fake.calls())
  for i in (0, 1):
    repo = fake.worker_home(i) / "sao_jax"
    shipped = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*"))
    assert shipped == ["pyproject.toml", "sao_jax", "sao_jax/__init__.py", "stale.txt"]
    assert not (fake.worker_home(i) / "sao_jax_src.tar.gz").exists()
  # A second copy replaces the first: files deleted locally go away remotely.
  (src / "stale.txt").unlink()
  assert fake.run("copy.sh", **env).returncode == 0
  assert not (fake.worker_home(1) / "sao_jax" / "stale.txt").exists()
  assert (fake.worker_home(1) / "sao_jax" / "pyproject.toml").exists()


@pytest.mark.parametrize("repo_dir", ["..", ".", "a/../b", "~/x", "/"])
def test_copy_rejects_repo_dirs_it_would_rm(fake, repo_dir):
  result = fake.run("copy.sh", REPO_DIR=repo_dir, DRY_RUN="1")
  assert result.returncode == 1 and "REPO_DIR=" in result.stderr
  assert result.stdout == ""


def test_copy_refuses_to_replace_a_dir_that_is_not_a_checkout(fake, tmp_path):
  src = tmp_path / "src"
  make_tree(src)
  (fake.worker_home(0) / "data").mkdir(parents=True)
  (fake.worker_home(0) / "data" / "keep").write_text("precious")
  result = fake.run("copy.sh", SRC_DIR=str(src), REPO_DIR="data", FAKE_WORKERS_DIR=str(fake.workers),
                    FAKE_NUM_WORKERS="1")
  assert result.returncode != 0 and "is not a sao_jax checkout" in result.stderr
  assert (fake.worker_home(0) / "data" / "keep").read_text() == "precious"


def test_setup_is_idempotent_on_every_worker(fake, tmp_path):
  src = tmp_path / "src"
  make_tree(src)
  env = {"SRC_DIR": str(src), "FAKE_WORKERS_DIR": str(fake.workers),
         "REMOTE_PYTHON": str(fake.write_python("python3.11", "3.11.9", old=False))}
  assert fake.run("copy.sh", **env).returncode == 0
  for attempt in (1, 2):
    result = fake.run("setup.sh", **env)
    assert result.returncode == 0, result.stderr
    assert "ready, jax 0.10.2" in result.stdout
  for i in (0, 1):
    calls = (fake.worker_home(i) / "python_calls.log").read_text().splitlines()
    assert sum(" -m venv sao_jax_venv" in c for c in calls) == 1, calls
    assert sum(c.endswith('-m pip install --quiet jax[tpu]==0.10.2') for c in calls) == 2, calls
    assert sum(c.endswith("-m pip install --quiet -e sao_jax[gcs]") for c in calls) == 2, calls


def test_setup_stops_on_an_old_python(fake, tmp_path):
  src = tmp_path / "src"
  make_tree(src)
  env = {"SRC_DIR": str(src), "FAKE_WORKERS_DIR": str(fake.workers),
         "REMOTE_PYTHON": str(fake.write_python("python3", "3.10.12", old=True))}
  assert fake.run("copy.sh", **env).returncode == 0
  result = fake.run("setup.sh", **env)
  assert result.returncode != 0
  assert "is Python 3.10.12; sao_jax needs Python >= 3.11" in result.stderr
  assert "REMOTE_PYTHON=python3.11" in result.stderr
  assert not (fake.worker_home(0) / "sao_jax_venv").exists()


def test_setup_asks_for_copy_first(fake):
  result = fake.run("setup.sh", FAKE_WORKERS_DIR=str(fake.workers))
  assert result.returncode != 0 and "run tpu_scripts/copy.sh first" in result.stderr


def prepare_workers(fake, n=2):
  """A copied checkout and a set-up venv on each fake worker."""
  for i in range(n):
    home = fake.worker_home(i)
    (home / "sao_jax").mkdir(parents=True)
    (home / "sao_jax_venv" / "bin").mkdir(parents=True)
    (home / "sao_jax_venv" / "bin" / "activate").write_text("export VENV_MARK=activated\n")


PROGRAM = ["sh", "-c", 'echo "$1 $RUN_NAME $RELAUNCH_ATTEMPT $BUCKET $EXTRA $VENV_MARK $(pwd)"; '
           'if [ -f "$HOME/fail" ]; then echo boom; exit 3; fi', "prog", "it's quoted"]


def test_run_writes_one_log_per_worker_and_forwards_env(fake):
  prepare_workers(fake)
  result = fake.run("run.sh", "--", *PROGRAM, RUN_NAME="r1", BUCKET="gs://b/sao", EXTRA="x y",
                    FORWARD_ENV="EXTRA", FAKE_WORKERS_DIR=str(fake.workers))
  assert result.returncode == 0, result.stderr
  assert [c[4:8] for c in fake.calls()] == [["sao-test", *LOC, "--worker=all"]]
  for i in (0, 1):
    home = fake.worker_home(i)
    log = (home / "logs" / f"r1-worker{i}.log").read_text()
    assert log == f"it's quoted r1 0 gs://b/sao x y activated {home / 'sao_jax'}\n"
  # Worker 0 streams to the terminal; the others only write their log.
  assert result.stdout.count("it's quoted r1") == 1


def test_run_failure_is_not_relaunched_without_preemption(fake):
  prepare_workers(fake)
  (fake.worker_home(1) / "fail").write_text("")
  result = fake.run("run.sh", "--relaunch", "3", "--", *PROGRAM, RUN_NAME="r1",
                    FAKE_WORKERS_DIR=str(fake.workers))
  assert result.returncode == 1
  assert "worker 1: exit 3; last lines of" in result.stderr and "boom" in result.stderr
  assert "on a healthy slice: not relaunching" in result.stderr
  assert fake.verbs() == ["tpu-vm ssh", "queued-resources describe", "tpu-vm describe"]


def test_run_without_relaunch_does_not_query_state(fake):
  result = fake.run("run.sh", "--", "false", FAKE_SSH_RCS="1")
  assert result.returncode == 1 and "failed (exit 1)" in result.stderr
  assert fake.verbs() == ["tpu-vm ssh"]


def empty_src(tmp_path):
  (tmp_path / "src").mkdir()
  return tmp_path / "src"


RELAUNCH_VERBS = ["queued-resources delete", "queued-resources create", "queued-resources describe",
                  "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh", "tpu-vm ssh"]


def run_attempts(calls):
  """RELAUNCH_ATTEMPT of every run.sh ssh call, in order."""
  attempts = []
  for c in calls:
    if c[3] == "ssh" and "RELAUNCH_ATTEMPT=" in c[-1]:
      attempts.append(int(re.search(r"RELAUNCH_ATTEMPT=(\d+)", remote_script(c)).group(1)))
  return attempts


def test_run_relaunches_after_a_suspended_queued_resource(fake, tmp_path):
  result = fake.run("run.sh", "--relaunch", "2", "--", "sao-train", RUN_NAME="r1",
                    FAKE_SSH_RCS="255 0 0 0", FAKE_QR_STATES="SUSPENDED ACTIVE", SPOT="1",
                    SRC_DIR=str(empty_src(tmp_path)))
  assert result.returncode == 0, result.stderr
  # run fails -> state says SUSPENDED -> delete, create (+poll), copy, setup -> run again.
  assert fake.verbs() == ["tpu-vm ssh", "queued-resources describe", *RELAUNCH_VERBS]
  calls = fake.calls()
  assert calls[2] == ["compute", "tpus", "queued-resources", "delete", "sao-test-qr", *LOC,
                      "--force", "--quiet"]
  assert calls[3] == create_argv("--spot")
  assert run_attempts(calls) == [0, 1]
  assert "slice preempted: re-creating it for relaunch 1 of 2" in result.stderr


def test_relaunched_training_resumes_its_own_run(fake, tmp_path):
  """Before: the identical command ran again without --resume, sao-train refused the
  run directory ("already holds checkpoints") and the healthy slice counted as failed."""
  result = fake.run("run.sh", "--relaunch", "2", "--", "sao-train", "--config", "c.py",
                    RUN_NAME="r1", FAKE_SSH_RCS="255 0 0 0", FAKE_QR_STATES="SUSPENDED ACTIVE",
                    SRC_DIR=str(empty_src(tmp_path)))
  assert result.returncode == 0, result.stderr
  runs = [remote_script(c) for c in fake.calls() if c[3] == "ssh" and "RELAUNCH_ATTEMPT=" in c[-1]]
  assert len(runs) == 2
  assert all("sao-train --config c.py --resume auto 2>&1" in script for script in runs)
  # A program that says how to resume, or is not sao-train, is run as given.
  for program, expected in ((["sao-train", "--resume"], "sao-train --resume 2>&1"),
                            (["python", "other.py"], "python other.py 2>&1")):
    [ssh] = dry_run_commands(fake.run("run.sh", "--relaunch", "1", "--", *program, DRY_RUN="1",
                                      RUN_NAME="r2"))
    assert expected in remote_script(ssh)


def test_run_relaunches_after_a_preempted_node(fake, tmp_path):
  result = fake.run("run.sh", "--relaunch", "1", "--", "sao-train", FAKE_SSH_RCS="255 0 0 0",
                    FAKE_QR_STATES="ACTIVE", FAKE_NODE_STATE="PREEMPTED", SRC_DIR=str(empty_src(tmp_path)))
  assert result.returncode == 0, result.stderr
  assert fake.verbs() == ["tpu-vm ssh", "queued-resources describe", "tpu-vm describe",
                          *RELAUNCH_VERBS]


def test_run_stops_when_relaunches_are_used_up(fake, tmp_path):
  result = fake.run("run.sh", "--relaunch", "1", "--", "sao-train", FAKE_SSH_RCS="255 0 0 255",
                    FAKE_QR_STATES="SUSPENDED ACTIVE SUSPENDED", SRC_DIR=str(empty_src(tmp_path)))
  assert result.returncode == 1
  assert "relaunch(es) of --relaunch are used up" in result.stderr
  assert fake.verbs().count("queued-resources create") == 1
  assert run_attempts(fake.calls()) == [0, 1]


def test_logs_tail_and_fetch(fake, tmp_path):
  for i in (0, 1):
    logs = fake.worker_home(i) / "logs"
    logs.mkdir(parents=True)
    (logs / f"old-worker{i}.log").write_text("old run\n")
    (logs / f"r1-worker{i}.log").write_text("".join(f"w{i} step {s}\n" for s in range(100)))
    os.utime(logs / f"old-worker{i}.log", (1, 1))
  env = {"FAKE_WORKERS_DIR": str(fake.workers)}
  result = fake.run("logs.sh", "--worker=1", "--lines=2", **env)  # newest log
  assert result.returncode == 0, result.stderr
  assert result.stdout == "[w1] w1 step 98\n[w1] w1 step 99\n"
  assert fake.calls()[-1][5:8] == [*LOC, "--worker=1"]
  result = fake.run("logs.sh", "--lines=1", RUN_NAME="old", **env)
  assert sorted(result.stdout.splitlines()) == ["[w0] old run", "[w1] old run"]
  out = tmp_path / "fetched"
  result = fake.run("logs.sh", f"--fetch={out}", RUN_NAME="r1", **env)
  assert result.returncode == 0, result.stderr
  assert sorted(p.name for p in out.iterdir()) == ["r1-worker0.log", "r1-worker1.log"]


def test_logs_says_when_there_is_no_log(fake):
  result = fake.run("logs.sh", RUN_NAME="nope", FAKE_WORKERS_DIR=str(fake.workers))
  assert result.returncode != 0 and "no logs directory yet" in result.stderr


# --- delete ----------------------------------------------------------------


def test_delete_with_yes(fake):
  result = fake.run("delete.sh", "--yes")
  assert result.returncode == 0, result.stderr
  assert fake.calls() == [["compute", "tpus", "queued-resources", "delete", "sao-test-qr", *LOC,
                           "--force", "--quiet"]]


def test_delete_without_yes_and_no_tty_refuses(fake):
  result = fake.run("delete.sh")
  assert result.returncode == 1
  assert "stdin is not a terminal; pass --yes" in result.stderr
  assert fake.calls() == []


@pytest.mark.parametrize("answer,deleted", [("y", True), ("n", False)])
def test_delete_asks_on_a_terminal(fake, answer, deleted):
  leader, follower = pty.openpty()
  try:
    os.write(leader, f"{answer}\n".encode())
    result = fake.run("delete.sh", stdin=follower)
  finally:
    os.close(leader)
    os.close(follower)
  assert "Delete queued resource sao-test-qr" in result.stderr
  assert (result.returncode == 0) == deleted
  assert (fake.verbs() == ["queued-resources delete"]) == deleted


# --- the scripts themselves --------------------------------------------------


def test_scripts_are_strict_and_executable():
  for name in SCRIPT_NAMES:
    path = SCRIPTS / name
    assert os.access(path, os.X_OK), f"chmod +x tpu_scripts/{name}"
    assert "\nset -euo pipefail\n" in path.read_text(), name
  assert "\nset -euo pipefail\n" in (SCRIPTS / "common.sh").read_text()


def test_shellcheck_clean():
  if shutil.which("shellcheck") is None:
    pytest.skip("shellcheck not found: apt-get install shellcheck")
  scripts = sorted(SCRIPTS.glob("*.sh"))
  assert {p.name for p in scripts} >= set(SCRIPT_NAMES) | {"common.sh"}
  result = subprocess.run(["shellcheck", "--external-sources", *map(str, scripts)],
                          capture_output=True, text=True, cwd=ROOT)
  assert result.returncode == 0 and not result.stdout, result.stdout + result.stderr
