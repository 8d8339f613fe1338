"""The directory weight channel (`sampler.weights='directory'`, `weights.py`).

Each version is an orbax checkpoint in a shared directory or bucket, signed by
every learner host before it is saved (`weights_digest`); a subscriber restores
the newest version that checks. The directory may be writable by more than the
run's own hosts, so neither side trusts what it finds there: the learner never
reads a peer's entries through orbax (which reads every step's metadata file),
deletes versions itself without following a link (`_remove`), and touches
signatures only through the real `signatures` directory; a subscriber lists the
directory itself, opens only the heads listed (1 KiB at most), takes only
versions orbax committed, skips a local version holding anything but regular
files and directories unread, and bounds how often it retries one that failed.
What a peer can still do is in docs/explanation/data-path.md ("The directory channel is signed").
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import secrets
import shutil
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from sao_jax.channel import sealed
from sao_jax.channel import weights_digest
from sao_jax.sharding import distributed
from sao_jax.storage import storage_path

COMMITTED = "commit_success.txt"  # what orbax writes last into a version it saved


@dataclasses.dataclass(frozen=True)
class DirectorySpec:
  directory: str
  template: Any  # pytree of jax.ShapeDtypeStruct
  secret: bytes = dataclasses.field(kw_only=True, repr=False)  # checks signatures (weights_digest)


def _run_start(after: int) -> int:
  """This run's start (ns), the first learner host's clock on every host, and later than
  `after` (host 0's: the newest run a head in the directory is signed for), so a run's
  versions are newer than those of the runs before even when this clock is behind
  theirs. It orders the versions a subscriber sees (`weights_digest`). All hosts call it."""
  started = max(time.time_ns(), after + 1).to_bytes(8, "big")
  return int.from_bytes(distributed.from_first_host(started) if jax.process_count() > 1
                        else started, "big")


def _names(directory: pathlib.Path | epath.Path) -> list[str]:
  """The entries of `directory` (none if it is missing), listed without reading them."""
  try:
    return (os.listdir(directory) if isinstance(directory, pathlib.Path)
            else [path.name for path in directory.iterdir()])
  except (FileNotFoundError, NotADirectoryError):
    return []


def _newest_run(signatures: pathlib.Path | epath.Path, secret: bytes) -> int:
  """The newest run a head in `signatures` is signed for by `secret`; -1 if none."""
  newest = -1
  for name in _names(signatures):
    version, _, kind = name.partition(".")
    if kind == "head" and version.isascii() and version.isdigit():
      data = weights_digest.read_file(signatures / name, weights_digest.MAX_HEAD_BYTES)
      try:
        newest = max(newest, weights_digest.read_head(secret, data, version=int(version))[0])
      except weights_digest.DigestError:
        continue
  return newest


def _versions(directory: pathlib.Path | epath.Path) -> list[int]:
  """The versions in `directory`: its entries named by a canonical decimal number (what
  orbax names a step), listed without reading any of them. Orbax's own listing read
  every step's metadata file: a FIFO a peer put there hung it for good, a link to
  /dev/zero was read without end, and 3000 bare step directories cost 3.5 s a poll."""
  return sorted(int(name) for name in _names(directory)
                if name.isascii() and name.isdigit() and name == str(int(name)))


def _remove(path: pathlib.Path | epath.Path) -> None:
  """Removes a version's entry `path`, whatever a peer made of it, without following a
  link: a local one is renamed to a hidden name first (a rename moves a link, not what
  it names), then unlinked, or removed by `shutil.rmtree`, which walks by descriptor
  and never follows a link (`shutil.rmtree.avoids_symlink_attacks`); what a peer made
  undeletable stays under the hidden name. Before, orbax's deleter (4+ cores) listed a
  step that was a link and deleted every file of the directory it named."""
  if not isinstance(path, pathlib.Path):
    if path.exists():  # a bucket: no links
      path.rmtree()
    return
  hidden = sealed.hidden_name(path, "deleted")
  try:
    os.rename(path, hidden)
  except FileNotFoundError:
    return
  if not hidden.is_symlink() and hidden.is_dir():
    shutil.rmtree(hidden, ignore_errors=True)
  try:
    os.unlink(hidden)  # a link, a file, or a directory rmtree refused as a link
  except OSError:
    pass


class DirectoryWeights:
  """Publisher: one orbax checkpoint per version under `directory` (keeps the last 2),
  each signed by every learner host before it is saved (`weights_digest`).

  `secret` is the run's (`run_secret.for_run`; every learner host must hold the same),
  else a fresh one, which same-host samplers inherit through `spec`. Made, it deletes
  the versions an earlier run left in the directory: orbax would keep those, if
  numbered higher, in place of this run's new ones. It deletes versions itself
  (`_remove`), never through a link a peer put in their place, and writes and deletes
  signatures only in the real `signatures` directory (`weights_digest.write_file`).
  """

  KEEP = 2  # versions kept: the newest, and the one a subscriber may be restoring

  def __init__(self, directory: str | pathlib.Path, template: Any, secret: bytes | None = None):
    if secret is None and jax.process_count() > 1:
      raise ValueError("DirectoryWeights: a learner of several hosts needs the run's secret "
                       "(run_secret.for_run), the same on every host")
    self._secret = secret or secrets.token_bytes(32)
    self._directory = storage_path(directory)
    self._signatures = self._directory / weights_digest.SIGNATURES
    newest = -1
    if jax.process_index() == 0:  # before orbax lists them: it reads each one's metadata
      newest = _newest_run(self._signatures, self._secret)
      for version in _versions(self._directory):
        _remove(self._directory / str(version))
    self._run = _run_start(newest)  # on several hosts also a barrier: after the deletions
    # Orbax deletes nothing (max_to_keep=None): `_remove` does, safely.
    self._manager = ocp.CheckpointManager(
        self._directory, options=ocp.CheckpointManagerOptions(
            create=True, enable_async_checkpointing=False))
    self._kept: list[int] = []  # the versions this publisher saved and keeps, oldest first
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), template)
    self.spec = DirectorySpec(str(self._directory), abstract, secret=self._secret)

  def publish(self, params: Any, version: int) -> None:
    signature = weights_digest.sign(self._secret, params, run=self._run, version=version)
    weights_digest.write_file(self._signatures,
                              weights_digest.signature_name(version, jax.process_index()),
                              signature)
    if jax.process_index() == 0:
      weights_digest.write_file(
          self._signatures, weights_digest.signature_name(version, None),
          weights_digest.sign_head(self._secret, run=self._run, version=version,
                                   processes=jax.process_count()))
      _remove(self._directory / str(version))  # a peer's entry there: orbax would rmtree it
    self._manager.save(version, args=ocp.args.StandardSave(params), force=True)
    self._kept.append(version)
    if jax.process_index() == 0:
      for old in self._kept[:-self.KEEP]:
        _remove(self._directory / str(old))
    del self._kept[:-self.KEEP]
    self._forget_signatures()

  def _forget_signatures(self) -> None:
    """Deletes this host's signatures of versions no longer kept (host 0: every file
    there that signs no kept version, whoever put it)."""
    kept = {str(step) for step in self._kept}
    mine = {str(jax.process_index()), "head"}

    def doomed(name: str) -> bool:
      version, _, owner = name.partition(".")
      return version not in kept and (owner in mine or jax.process_index() == 0)

    weights_digest.delete_files(self._signatures, doomed)

  def close(self) -> None:
    self._manager.close()


def _plain_files(directory: pathlib.Path) -> None:
  """OSError unless `directory` and everything under it are regular files and
  directories, none a link: orbax opens a FIFO and waits for a writer for good."""
  if not os.path.isdir(directory) or os.path.islink(directory):
    raise OSError(f"{directory}: not a directory")
  pending = [directory]
  while pending:
    with os.scandir(pending.pop()) as entries:
      for entry in entries:
        if entry.is_dir(follow_symlinks=False):
          pending.append(entry.path)
        elif not entry.is_file(follow_symlinks=False):
          raise OSError(f"{entry.path}: not a regular file or directory (a link, FIFO or "
                        "device put into the version)")


class DirectorySubscriber:
  """Restores the newest version in the directory that restores and checks.

  The directory is shared (a bucket several jobs write to), so a version there
  may not restore (damaged files, a bare directory named like a step) or not
  check (unsigned, signed without the run's secret, arrays other than the learner
  signed: `weights_digest`). Such a version is skipped (`skipped`, version -> why)
  for as long as its head stays the same, and the newest other one newer than ours
  is taken, so the sampler keeps sampling instead of failing each poll. One that
  failed to restore or check is tried again, at most every `RETRY_S`, once the entry
  of its directory changed: a learner saving over a directory a peer put at its
  next version's name replaces that entry (before, a poll between the learner's
  signing and its save skipped that version for good), and a peer touching it
  makes a sampler restore and hash it no more often than that. A local version
  whose files hold anything but regular files and directories (a FIFO hung the
  restore, a link names any file of the host) is skipped unread.
  Versions order by (run start, version): a restarted learner's version 0 is newer
  than every version of the run before. A validly signed version no newer than the
  one adopted that appears in the directory after it (a retired version, or an
  earlier run's, put back) is never taken and is counted in `stats["stale_version"]`.
  A poll lists the directory once and reads at most `weights_digest.MAX_HEAD_BYTES`
  of each version's head.
  """

  RETRY_S = 5.0

  def __init__(self, spec: DirectorySpec):
    self._spec = spec
    self._clock = time.monotonic
    self._directory = storage_path(spec.directory)
    self._signatures = self._directory / weights_digest.SIGNATURES
    # Restored onto this process's first device, sharded as the sampler then places it.
    # A target without shardings restores only what the same topology saved: a learner
    # of several hosts' versions failed with "Topology mismatch" (skipped, every one).
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    self._target = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), spec.template)
    self.run, self.version = -1, -1
    self.stats: collections.Counter = collections.Counter()  # refused versions by reason
    self._listed: set[int] = set()  # the versions the last poll listed
    self.skipped: dict[int, str] = {}  # version -> why it did not restore or check
    self._skipped_as: dict[int, tuple] = {}  # the (head, entry, clock) it had then
    self._checkpointer = ocp.StandardCheckpointer()

  def _read(self, version: int, process: int | None) -> bytes | None:
    name = weights_digest.signature_name(version, process)
    limit = (weights_digest.MAX_HEAD_BYTES if process is None
             else weights_digest.MAX_SIGNATURE_BYTES)
    return weights_digest.read_file(self._signatures / name, limit)

  def _entry(self, step: int) -> tuple | None:
    """What identifies version `step`'s directory entry: locally its inode and times (a
    learner's save renames a finished one into place), in a bucket the time of its
    commit file (written last); None without one."""
    try:
      if isinstance(self._directory, pathlib.Path):
        entry = os.lstat(self._directory / str(step))
        return entry.st_ino, entry.st_mtime_ns, entry.st_ctime_ns
      return (self._directory / str(step) / COMMITTED).stat().mtime,
    except OSError:
      return None

  def _committed(self, step: int) -> bool:
    """Whether orbax finished saving `step` (as orbax's own listing decides: a bucket's
    version is written in place, its commit file last)."""
    try:
      return (epath.Path(self._directory) / str(step) / COMMITTED).exists()
    except OSError:
      return False

  def poll(self) -> tuple[Any, int] | None:
    listed = _versions(self._directory)
    heads = {name for name in _names(self._signatures) if name.endswith(".head")}
    for step in set(self.skipped) - set(listed):  # gone: forget it (a peer may churn names)
      del self.skipped[step], self._skipped_as[step]
    candidates = []
    for step in listed:
      # Only the heads listed are opened: a peer's bare versions cost no read.
      head = (self._read(step, None)
              if weights_digest.signature_name(step, None) in heads else None)
      seen = self._skipped_as.get(step)
      if seen is not None and seen[0] == head and (
          seen[1] is None or self._clock() < seen[2] + self.RETRY_S
          or seen[1] == self._entry(step)):
        continue
      try:
        run, processes = weights_digest.read_head(self._spec.secret, head, version=step)
      except weights_digest.DigestError as error:
        self._skip(step, (head, None, None), str(error))
        continue
      if (run, step) > (self.run, self.version):
        if self._committed(step):
          candidates.append((run, step, processes, head))
      elif self.version >= 0 and step not in self._listed:  # put back after we moved on
        self.stats["stale_version"] += 1
    self._listed = set(listed)
    for run, step, processes, head in sorted(candidates, reverse=True):
      entry = self._entry(step)  # before the restore: a save that lands later is retried
      try:
        params = self._restore(step, run, processes)
      except weights_digest.DigestError as error:
        self._skip(step, (head, entry, self._clock()), str(error))
        continue
      # TensorStore, orbax, the filesystem: damaged files, a bare step directory.
      except (ValueError, KeyError, OSError) as error:
        self._skip(step, (head, entry, self._clock()),
                   f"{type(error).__name__}: {str(error)[:300]}")
        continue
      self.skipped.pop(step, None)
      self._skipped_as.pop(step, None)
      self.run, self.version = run, step
      return params, step
    return None

  def _skip(self, step: int, seen: tuple, why: str) -> None:
    self.skipped[step], self._skipped_as[step] = why, seen

  def _restore(self, step: int, run: int, processes: int) -> Any:
    """Version `step`, restored and checked against every host's signature."""
    payloads = [weights_digest.read_signature(self._spec.secret, self._read(step, k),
                                              version=step, process=k)
                for k in range(processes)]
    if isinstance(self._directory, pathlib.Path):  # a bucket holds no FIFO nor link
      _plain_files(self._directory / str(step))
    # Restored by a checkpointer, not a manager: a manager lists (reads) every step.
    params = self._checkpointer.restore(epath.Path(self._directory) / str(step) / "default",
                                        self._target)
    weights_digest.verify(payloads, params, run=run)
    return params

  def close(self) -> None:
    self._checkpointer.close()
