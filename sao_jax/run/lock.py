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

The rule the lock enforces: nothing that does not hold it creates, deletes or renames
anything in the run directory. `sao-train` takes it before it looks at the checkpoints
there (`jobs.train.run`); readers (`sao-eval`, `sao-convert`, the `--resume auto`
decision) open the checkpoint directory read-only (`run.checkpoint.Checkpointer`), so
they never clean up a live learner's unfinished save or move a damaged step aside.

The lock file is opened without following a symbolic link and only when it is a
regular file with no other name (`_open_lock_file`): it is truncated and the pid
written into it, which through a planted link would overwrite the file it points to.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import stat
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


def _open_lock_file(path: pathlib.Path) -> IO[str]:
  """`path` opened for reading and writing (made if missing) without following a link;
  ValueError naming it when it is a symbolic link, not a regular file, or a hard link
  to another name (writing the pid into it would overwrite another file)."""
  fix = f"remove it (rm {str(path)!r}) if no learner is running there, and launch again"
  try:  # O_NONBLOCK: a FIFO planted there must not block the open (refused below)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 0o644)
  except OSError as error:
    if path.is_symlink():  # O_NOFOLLOW's ELOOP
      raise ValueError(f"the run lock {str(path)!r} is a symbolic link (to "
                       f"{os.readlink(path)!r}), which sao-train does not follow: it would "
                       f"write into the file the link points to; {fix}") from None
    raise ValueError(f"the run lock {str(path)!r} cannot be opened ({error.strerror or error}); "
                     f"{fix}") from None
  info = os.fstat(fd)
  if not stat.S_ISREG(info.st_mode):
    os.close(fd)
    raise ValueError(f"the run lock {str(path)!r} is not a regular file (mode "
                     f"{stat.filemode(info.st_mode)}), which is what sao-train writes its pid "
                     f"into; {fix}")
  if info.st_nlink != 1:
    os.close(fd)
    raise ValueError(f"the run lock {str(path)!r} is a file with {info.st_nlink} names (a hard "
                     "link): writing the pid into it would overwrite the file under its other "
                     f"names; {fix}")
  os.set_blocking(fd, True)
  return os.fdopen(fd, "r+", encoding="utf-8")


def hold(run_dir: str | os.PathLike, host: int = 0) -> IO[str]:
  """The open, locked lock file of `run_dir` for learner host `host` (close it, or end
  the process, to release); ValueError naming the holder when another process has it,
  or naming the lock file when it is a link or not a regular file (`_open_lock_file`)."""
  path = lock_path(run_dir, host)
  lock = _open_lock_file(path)
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
