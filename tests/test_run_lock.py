"""One learner per run directory (sao_jax.run.lock)."""

import os
import re
import tempfile

import pytest

from sao_jax.config import load_config
from sao_jax.jobs import train
from sao_jax.run import lock as run_lock


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
