"""One learner per run directory: `sao-train` holds an exclusive lock on it while it runs.

Two learners on one run directory interleave what they write there: orbax step
directories of the same numbers from two runs, a log each, evaluation transcripts.
A claim script killed while its `sao-train` child goes on, started again on the same
`--out`, resumes that run beside the first (it happened, and ran 50 minutes at half
speed each, both saving checkpoints into one folder; the scripts now stop their child
with them, `experiments.runner`). Now the second learner refuses at start, naming the
process that holds the directory. (A directory deleted and made again under a running
learner is a new directory to the lock: nothing here can see that.)

The lock is `flock` on `<run_dir>/.sao-train.lock.<host>` (one file per learner host,
so the hosts of one multi-host learner may share a run directory); the kernel releases
it when the process ends, however it ends, so a crashed run never leaves it held.
A bucket run directory (`gs://...`, `sao_jax.storage`) cannot hold an flock: its lock
is a local file named after the URL in this machine's temporary directory
(`LOCAL_LOCKS`), which refuses a second learner of that run on this host; learners of
one bucket run on two machines cannot see each other's locks.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import tempfile
from typing import IO

from sao_jax import storage

LOCK_FILE = ".sao-train.lock"
# Directory (under the temporary directory) of the lock files of bucket run directories.
LOCAL_LOCKS = "sao-train-locks"


def lock_path(run_dir: str | os.PathLike, host: int = 0) -> pathlib.Path:
  """The local file learner host `host` of `run_dir` locks: in the run directory, or
  for a bucket URL in the temporary directory, named by a hash of the URL."""
  if storage.is_url(run_dir):
    url = str(run_dir).rstrip("/")
    directory = pathlib.Path(tempfile.gettempdir()) / LOCAL_LOCKS
    directory.mkdir(exist_ok=True)
    return directory / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}{LOCK_FILE}.{host}"
  return pathlib.Path(run_dir) / f"{LOCK_FILE}.{host}"


def hold(run_dir: str | os.PathLike, host: int = 0) -> IO[str]:
  """The open, locked lock file of `run_dir` for learner host `host` (close it, or end
  the process, to release); ValueError naming the holder when another process has it."""
  path = lock_path(run_dir, host)
  lock = open(path, "a+", encoding="utf-8")
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    lock.seek(0)
    holder = lock.read(32).strip() or "unknown"
    lock.close()
    raise ValueError(f"run.run_dir={str(run_dir)!r} is in use by another learner (pid "
                     f"{holder}, holding {path.name}): a second one would mix its checkpoints "
                     "and logs with that run's; stop it, or set run.run_dir to another "
                     "directory") from None
  lock.seek(0)
  lock.truncate()
  lock.write(f"{os.getpid()}\n")
  lock.flush()
  return lock
