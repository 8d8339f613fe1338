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
"""

from __future__ import annotations

import fcntl
import os
import pathlib
from typing import IO

LOCK_FILE = ".sao-train.lock"


def hold(run_dir: pathlib.Path, host: int = 0) -> IO[str]:
  """The open, locked lock file of `run_dir` for learner host `host` (close it, or end
  the process, to release); ValueError naming the holder when another process has it."""
  path = run_dir / f"{LOCK_FILE}.{host}"
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
