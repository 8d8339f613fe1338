"""One learner per run directory (sao_jax.run.lock)."""

import os
import re
import tempfile
import typing

import pytest

from sao_jax.cli import train as train_cli
from sao_jax.config import load_config
from sao_jax.jobs import train
from sao_jax.run import lock as run_lock


class _State(typing.NamedTuple):  # what Checkpointer.save needs of a train state
  policy_version: typing.Any
  weights: typing.Any


def test_a_second_learner_on_a_run_directory_is_refused_naming_the_first(tmp_path):
  first = run_lock.hold(tmp_path)
  with pytest.raises(ValueError, match=f"in use by another learner \\(pid {os.getpid()}"):
    run_lock.hold(tmp_path)
  other_host = run_lock.hold(tmp_path, host=1)  # the hosts of one learner may share it
  other_host.close()
  first.close()  # released: (a crashed learner's is released by the kernel)
  run_lock.hold(tmp_path).close()


def test_sao_train_refuses_a_run_directory_another_learner_holds(tmp_path):
  # Before: two learners ran side by side in one run directory, saving checkpoints of the
  # same step numbers into one folder.
  cfg = load_config("configs/demo_cpu.py", [f"run.run_dir={tmp_path}"])
  held = run_lock.hold(tmp_path)
  try:
    with pytest.raises(ValueError, match="in use by another learner"):
      train.run(cfg, resume=True)
  finally:
    held.close()
  assert not (tmp_path / "config.json").exists()  # refused before it wrote anything


def test_a_bucket_run_directory_is_locked_on_this_host(tmp_path, monkeypatch):
  # flock needs a local file: a bucket run's lock is one in the temporary directory
  # (before: pathlib made gs://bucket/run a local gs:/bucket/run directory to lock in).
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
  (tmp_path / "tmp").mkdir()
  monkeypatch.chdir(tmp_path)
  first = run_lock.hold("gs://bucket/run")
  with pytest.raises(ValueError, match="run.run_dir='gs://bucket/run/' is in use by another "
                     f"learner \\(pid {os.getpid()}"):
    run_lock.hold("gs://bucket/run/")  # the same run, however it is written
  run_lock.hold("gs://bucket/other").close()  # another run
  run_lock.hold("gs://bucket/run", host=1).close()
  first.close()
  assert sorted(os.listdir(tmp_path)) == ["tmp"]
  assert run_lock.lock_path("gs://bucket/run").parent == tmp_path / "tmp" / run_lock.LOCAL_LOCKS


def _tree(root) -> dict:
  """Every path under `root` with its bytes (None for a directory): what must not change."""
  return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
          for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "directory"])
def test_a_lock_file_that_is_a_link_or_not_a_file_is_refused_and_left_alone(tmp_path, kind):
  # Before: open(path, "a+") followed a planted link, truncated the file it points to and
  # wrote the pid into it.
  victim = tmp_path / "precious.txt"
  victim.write_text("keep me\n")
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  path = run_lock.lock_path(run_dir)
  {"symlink": lambda: path.symlink_to(victim), "hardlink": lambda: os.link(victim, path),
   "fifo": lambda: os.mkfifo(path), "directory": path.mkdir}[kind]()
  what = {"symlink": f"is a symbolic link \\(to {re.escape(repr(str(victim)))}\\)",
          "hardlink": "is a file with 2 names \\(a hard link\\)",
          "fifo": "is not a regular file", "directory": "cannot be opened"}[kind]
  with pytest.raises(ValueError, match=f"the run lock {re.escape(repr(str(path)))} {what}.*"
                     f"remove it \\(rm {re.escape(repr(str(path)))}\\)"):
    run_lock.hold(run_dir)
  assert victim.read_text() == "keep me\n"
  assert path.is_symlink() == (kind == "symlink")  # left where it was


@pytest.mark.parametrize("mode", ["auto", "never", "always"])
def test_a_second_launch_leaves_a_live_learners_run_untouched(tmp_path, mode):
  """A learner is running (it holds the lock) and is saving step 4 (orbax's temporary
  directory). Before, `--resume auto` opened an orbax manager before taking the lock,
  which deleted that directory, and only then was the launch refused; "never" was refused
  for the checkpoints, not for the learner using them."""
  import jax.numpy as jnp

  from sao_jax.run.checkpoint import Checkpointer

  cfg = load_config("configs/demo_cpu.py", [f"run.run_dir={tmp_path}", f"run.resume={mode}"])
  checkpointer = Checkpointer(cfg.with_run_paths(), writer=True)
  checkpointer.save(2, _State(jnp.array(1), jnp.zeros(3)), {"position": 2}, force=True)
  checkpointer.close()
  saving = tmp_path / "checkpoints" / "4.orbax-checkpoint-tmp-1234" / "state"
  saving.mkdir(parents=True)
  (saving / "partial").write_bytes(b"\x01half a step")
  held = run_lock.hold(tmp_path)
  before = _tree(tmp_path)
  try:
    with pytest.raises(ValueError, match=f"in use by another learner \\(pid {os.getpid()}"):
      train.run(cfg, resume=None)
    train_cli.main(["--config", "configs/demo_cpu.py", "--set", f"run.run_dir={tmp_path}",
                    "--resume", mode, "--check"])
  finally:
    held.close()
  assert _tree(tmp_path) == before
