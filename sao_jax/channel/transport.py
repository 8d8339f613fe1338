"""`TrajectoryTransport`: finished trajectories from sampler processes to the learner.

Both backends are bounded: `put` blocks while `capacity` trajectories wait
unread (backpressure — a sampler far ahead of the learner pauses instead of
filling memory or disk), and `get` returns None after `timeout` seconds with
nothing to read.

- `QueueTransport`: same host; `multiprocessing` queues from a given context
  (use "spawn" with JAX). Trajectories are small host arrays, pickled once.
  Each writer process gets a queue of its own (`for_writer`, `capacity` each):
  a writer SIGKILLed in the middle of a put leaves its queue's pipe lock held
  and possibly half a message in its pipe, which on a shared queue would block
  every other writer (and its own restart) forever. With a queue per writer the
  restart gets a fresh queue, and the dead writer's queue is dropped unread,
  its trajectories counted in `drops` as `writer_died`. The learner reads each
  queue through a daemon pump thread into one small local queue: reading half a
  message blocks forever, and then only that queue's pump, never the learner.
- `DirectoryTransport`: many hosts sharing a directory (NFS, a mounted bucket).
  A writer (each unpickled copy is a new one) writes a record to a hidden
  temporary file of a random name and renames it to `<writer>-<seq>.p<prompt id>.traj`
  (atomic on POSIX; `sealed.write_atomic`), so a reader never sees a partial record;
  the reader consumes files in (time, name) order and deletes them.

  Several readers (the hosts of a multi-host learner, each loading its own rows)
  share one directory without ever reading the same record: reader `i` of `n`
  (`shard=(i, n)`) takes only the records whose key is `i` modulo `n`. The key is
  the writer's record index `<seq>` (each writer's records go round-robin to the
  readers), or, with `by_prompt=True` (GRPO groups, which must reach one reader
  whole), the trajectory's `prompt_id`. The partition is a function of the file
  name alone, so it needs no coordination and survives restarts.

  The directory is shared, so nothing in it is trusted for its name or place:
  every record, the RUN marker the learner writes when it starts a run
  (`start_run`) and the CLOSED marker it writes when the run ends are sealed
  with the run's secret and bound to that run (`sealed`). Writers write for the
  newest run a signed RUN marker named, never going back to an earlier one, and the
  learner puts its marker back whenever a peer replaced it by an older or unsigned
  one (a sampler host starting then finds it); a record without a valid seal for
  this run and its file name (a forgery, a copy renamed into another shard, an
  earlier run's) is quarantined as `bad_signature`, one this reader already
  consumed (a copy put back) as `replayed`, and an unsigned or stale CLOSED
  stops nobody. Records an earlier run left are quarantined as `earlier_run`
  when a run starts. A record that is unreadable (truncated, garbage), oversized (more than
  `records.max_record_bytes(max_tokens)`, compressed or not) or malformed (other
  members, dtypes, shapes or metadata; a prompt id that differs from its name),
  and a `.traj` file whose name is not `<writer>-<seq>.p<prompt id>.traj`, is
  moved to `quarantine/<name>.<reason>` and counted in `drops` as
  `quarantined_<reason>` (the learner passes its `pipeline.Drops`, so these reach
  the `dropped/...` metrics). `quarantine/` is bounded (`QUARANTINE_FILES`,
  `QUARANTINE_BYTES`): past either bound the files quarantined longest ago are
  deleted, counted as `quarantine_pruned`. Records are parsed by `records.from_bytes`, never
  unpickled. Only regular files are read, opened without following links and
  without blocking (a FIFO named `*.traj` would otherwise stall the reader, a
  link loop crash it); anything else is `unreadable`. When `quarantine/` is not
  a plain directory (a peer's file or link there), a bad record is deleted
  instead, and one that cannot be deleted either is skipped from then on; each
  is counted once either way; a writer's backpressure counts only regular files,
  so such leftovers never hold writers back. A file another reader takes or moves
  between listing and reading is skipped silently.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import pathlib
import queue
import re
import secrets
import stat
import threading
import time
import uuid

from sao_jax.channel import records, sealed
from sao_jax.channel import run_secret
from sao_jax.log_text import untrusted
from sao_jax.types import Trajectory


class TransportClosed(Exception):
  """Raised by `put` after `close()`."""


class QueueTransport:
  """Same-host transport over bounded multiprocessing queues, one per writer
  process (module docstring); picklable to children at spawn time."""

  def __init__(self, capacity: int, context: multiprocessing.context.BaseContext | None = None,
               *, drops: collections.Counter | None = None):
    if capacity <= 0:
      raise ValueError(f"transport capacity={capacity} must be positive")
    self.capacity = capacity
    self._context = context or multiprocessing.get_context("spawn")
    self._closed = self._context.Event()
    self.drops = collections.Counter() if drops is None else drops
    # Writer key -> its queue. The learner's object reads all of them; key None is
    # for writers in this process (tests, benchmarks); a writer's copy holds only its own.
    self._queues = {None: self._context.Queue(maxsize=capacity)}
    self._writer = None
    self._received: queue.Queue | None = None  # the pumps' output (learner side, lazily)
    self._pumps: list[threading.Thread] = []
    self._pumped: set[int] = set()  # ids of the queues that have a pump

  def __getstate__(self) -> dict:
    # Reader-side state stays with the reader (a writer's copy never drops or reads).
    return {**self.__dict__, "drops": None, "_received": None, "_pumped": set(), "_pumps": []}

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state)
    self.drops = collections.Counter()

  def for_writer(self, key) -> "QueueTransport":
    """The transport a writer process `key` (e.g. a sampler's worker id) puts to: a
    fresh queue of its own. A previous queue of `key` (a writer that died) is
    dropped unread and its trajectories counted as `writer_died`."""
    old = self._queues.pop(key, None)
    if old is not None:
      try:
        lost = old.qsize()
      except NotImplementedError:  # macOS has no sem_getvalue
        lost = 0
      if lost:
        self.drops["writer_died"] += lost
      old.cancel_join_thread()
      old.close()
    self._queues[key] = self._context.Queue(maxsize=self.capacity)
    writer = object.__new__(type(self))
    writer.__dict__.update(self.__dict__)
    writer._queues, writer._writer = {key: self._queues[key]}, key
    return writer

  def put(self, traj: Trajectory, timeout: float | None = None) -> None:
    """Blocks while this writer's queue is full; raises TransportClosed once
    closed, queue.Full after `timeout` seconds."""
    target = self._queues[self._writer]
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      if self._closed.is_set():
        raise TransportClosed("the learner closed the trajectory transport")
      wait = 0.1 if deadline is None else min(0.1, max(deadline - time.monotonic(), 0.0))
      try:
        target.put(traj, timeout=wait)
        return
      except queue.Full:
        if deadline is not None and time.monotonic() >= deadline:
          raise

  def get(self, timeout: float = 0.0) -> Trajectory | None:
    """The next trajectory of any writer, or None after `timeout` seconds (once
    closed, not before the writers' queues are drained: at most 1 s more)."""
    if self._received is None:
      # Small, so trajectories wait in the writers' bounded queues (backpressure).
      self._received, self._pumps = queue.Queue(maxsize=1), []
    for q in list(self._queues.values()):
      if id(q) not in self._pumped:
        self._pumped.add(id(q))
        self._pumps.append(threading.Thread(target=self._pump, args=(q,), daemon=True,
                                            name="sao-transport-pump"))
        self._pumps[-1].start()
    deadline = time.monotonic() + timeout
    while True:
      try:
        return self._received.get(timeout=max(0.0, min(deadline - time.monotonic(), 0.05)))
      except queue.Empty:
        pass
      now = time.monotonic()
      if now >= deadline:
        draining = self._closed.is_set() and any(t.is_alive() for t in self._pumps)
        if not draining or now >= deadline + 1.0:
          return None

  def _pump(self, source) -> None:
    """Moves `source`'s trajectories to the local queue until `source` is retired
    (`for_writer`) or the transport closes and drains. A read that never completes
    (half a message from a writer killed mid-put) blocks only this thread."""
    while any(q is source for q in self._queues.values()):
      try:
        traj = source.get(timeout=0.2)
      except queue.Empty:
        if self._closed.is_set():
          return  # closed and drained
        continue
      except (OSError, EOFError, ValueError):  # retired and closed under the pump
        return
      while True:  # hand it over; after close, only while someone still reads
        try:
          self._received.put(traj, timeout=0.2)
          break
        except queue.Full:
          if self._closed.is_set():
            return

  def close(self) -> None:
    self._closed.set()

  @property
  def closed(self) -> bool:
    return self._closed.is_set()


# <writer>-<seq>.p<prompt id>.traj, as `DirectoryTransport.put` names records.
_RECORD_NAME = re.compile(r"(?P<writer>.+)-(?P<seq>[0-9]{1,20})\.p(?P<prompt>-?[0-9]{1,20})\.traj")


class DirectoryTransport:
  """Cross-host transport through record files in a shared directory."""

  SUFFIX = ".traj"
  QUARANTINE = "quarantine"
  RUN, CLOSED = "RUN", "CLOSED"
  # Record names a reader remembers (replays). A copy of a forgotten one is older than
  # the last REMEMBER records it consumed, so the staleness filter (`data.max_lag`)
  # drops it whenever REMEMBER > (max_lag + 1) x the trajectories of a batch.
  REMEMBER = 1 << 16
  # What quarantine/ keeps (`_bound_quarantine`): evidence, not an archive; 20,000
  # stray files otherwise stayed there for good.
  QUARANTINE_FILES = 1000
  QUARANTINE_BYTES = 256 << 20

  def __init__(self, directory: str | os.PathLike, capacity: int, writer_id: str | None = None,
               *, max_tokens: int, secret: bytes, shard: tuple[int, int] = (0, 1),
               by_prompt: bool = False, drops: collections.Counter | None = None):
    """`shard=(i, n)`: this reader takes the records of key i mod n (module docstring).
    `max_tokens` (`sampler.max_seq_len`) bounds a record's size; `secret` (`run_secret`)
    seals records and markers; `drops` counts the quarantined records (a
    `pipeline.Drops` also gets an example per reason). A reader calls `start_run` first."""
    if capacity <= 0:
      raise ValueError(f"transport capacity={capacity} must be positive")
    if not 0 <= shard[0] < shard[1]:
      raise ValueError(f"transport shard={shard} must be (index, count) with 0 <= index < count")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
      raise ValueError(f"transport max_tokens={max_tokens!r} must be a positive integer "
                       "(sampler.max_seq_len)")
    run_secret.check_secret(secret, "the directory transport's secret")
    self._secret = secret
    self.directory = pathlib.Path(directory)
    try:
      self.directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file there or in its parents, no permission
      raise ValueError(f"data.transport_dir={str(directory)!r} cannot be created as a directory "
                       f"({error.strerror or error}); set it to a directory every learner and "
                       "sampler host shares") from error
    self.capacity, self.max_tokens = capacity, max_tokens
    self.drops = collections.Counter() if drops is None else drops
    self._writer_id = writer_id or uuid.uuid4().hex[:12]
    self._seq = 0
    self.shard, self.by_prompt = shard, by_prompt
    self._stuck: set[str] = set()  # bad entries that could be neither moved nor deleted
    # (files, bytes) in quarantine/ as last listed plus what this reader added since, and
    # how many it added since: set so that its first move lists the folder.
    self._quarantine_tally = (0, 0, self.QUARANTINE_FILES)
    self._reading: bytes | None = None  # the run this reader reads for (`start_run`)
    self._announced: tuple[int, bytes] | None = None  # the run this reader announced
    self._writing: tuple[int, bytes] | None = None  # the newest run a writer saw (`_run`)
    self._consumed: collections.OrderedDict[str, None] = collections.OrderedDict()

  def __getstate__(self) -> dict:
    # Reader-side state stays with the reader (a copy writes, never quarantines).
    return {**self.__dict__, "drops": None, "_reading": None, "_announced": None,
            "_consumed": collections.OrderedDict()}

  def for_writer(self, key) -> "DirectoryTransport":
    """The transport a writer process `key` puts to: this one (each copy unpickled
    in another process is a new writer already, and a killed writer leaves at most
    a `.tmp` file)."""
    del key
    return self

  def __setstate__(self, state: dict) -> None:
    """A copy in another process (a spawned sampler, or its restart) is a new writer:
    with the sender's id and counter it would overwrite the sender's unread records."""
    self.__dict__.update(state)
    self.drops = collections.Counter()
    self._writer_id = f"{state['_writer_id']}.{uuid.uuid4().hex[:8]}"
    self._seq = 0

  def _pending(self) -> int:
    """Records waiting unread: regular files only, so that entries a reader can neither
    move nor delete (a peer's directories) never count against `capacity`."""
    with os.scandir(self.directory) as entries:
      return sum(entry.name.endswith(self.SUFFIX) and entry.is_file(follow_symlinks=False)
                 for entry in entries)

  def _mine(self, match: re.Match) -> bool:
    """Whether the record named `match` belongs to this reader's shard."""
    index, count = self.shard
    return int(match["prompt" if self.by_prompt else "seq"]) % count == index

  def _quarantine(self, path: pathlib.Path, reason: str, detail: str) -> None:
    """Moves `path` aside (never read again) and counts it, unless another reader was first;
    deletes it, or skips it from now on, when it cannot be moved (module docstring)."""
    folder = self.directory / self.QUARANTINE
    try:
      try:
        folder.mkdir(exist_ok=True)
        # Moved through the folder opened without following a link: a link a peer
        # put there, before or after any check, would take the file elsewhere.
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
          os.rename(path, f"{path.name}.{reason}", dst_dir_fd=fd)
          self._bound_quarantine(fd, f"{path.name}.{reason}")
        finally:
          os.close(fd)
      except FileNotFoundError:
        raise
      except OSError as error:  # quarantine/ is a peer's file or link
        detail += f" (deleted: cannot move it to {self.QUARANTINE}/: {error})"
        path.unlink()
    except FileNotFoundError:
      return  # another reader moved or consumed it: theirs to count
    except OSError as error:  # e.g. a directory named *.traj
      self._stuck.add(path.name)
      detail += f" (left in place, ignored from now on: {error})"
    key = f"quarantined_{reason}"
    self.drops[key] += 1
    examples = getattr(self.drops, "examples", None)
    if examples is not None:
      # A name is any bytes a peer chose (escape sequences, line breaks); the log prints it.
      name = os.fsencode(path.name).decode(errors="backslashreplace")
      examples.setdefault(key, untrusted(f"{name}: {detail}"[:300]))

  def _bound_quarantine(self, fd: int, added: str) -> None:
    """Keeps `quarantine/` (opened as `fd`) within `QUARANTINE_FILES` files and
    `QUARANTINE_BYTES` bytes once `added` is in it: past either, the files
    quarantined longest ago (by change time, which the move sets) are deleted
    down to 3/4 of both bounds, counted as `quarantine_pruned`. The folder is
    listed only then, or after this reader added a quarter of the bound since
    (other readers add too): a listing per record cost O(n^2) for n strays."""
    try:
      size = os.stat(added, dir_fd=fd, follow_symlinks=False).st_size
    except OSError:
      size = 0
    files, total, since = self._quarantine_tally
    files, total, since = files + 1, total + size, since + 1
    if files <= self.QUARANTINE_FILES and total <= self.QUARANTINE_BYTES and (
        since < self.QUARANTINE_FILES // 4):
      self._quarantine_tally = (files, total, since)
      return
    kept = []
    with os.scandir(fd) as entries:
      for entry in entries:
        try:
          info = entry.stat(follow_symlinks=False)
        except OSError:
          continue
        if stat.S_ISREG(info.st_mode):
          kept.append((info.st_ctime_ns, entry.name, info.st_size))
    kept.sort()
    files, total = len(kept), sum(size for _, _, size in kept)
    if files > self.QUARANTINE_FILES or total > self.QUARANTINE_BYTES:
      pruned = 0
      for _, name, size in kept:
        if files <= self.QUARANTINE_FILES * 3 // 4 and total <= self.QUARANTINE_BYTES * 3 // 4:
          break
        try:
          os.unlink(name, dir_fd=fd)
          pruned += 1
        except FileNotFoundError:  # another reader pruned it
          pass
        except OSError:
          continue  # not ours to delete: it still counts
        files, total = files - 1, total - size
      self.drops["quarantine_pruned"] += pruned
    self._quarantine_tally = (files, total, 0)

  def _ready(self) -> list[tuple[pathlib.Path, re.Match]]:
    """This reader's records, oldest first; stray names are quarantined on the way."""
    found = []
    with os.scandir(self.directory) as entries:
      for entry in entries:
        if not entry.name.endswith(self.SUFFIX) or entry.name in self._stuck:
          continue  # a writer's .tmp, CLOSED, the quarantine folder
        path = pathlib.Path(entry.path)
        match = _RECORD_NAME.fullmatch(entry.name)
        if match is None:
          self._quarantine(path, "bad_name", "not <writer>-<seq>.p<prompt id>.traj")
          continue
        if not self._mine(match):
          continue
        try:
          found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name, path, match))
        except FileNotFoundError:
          continue  # taken by another reader since the listing
    return [(path, match) for _, _, path, match in sorted(found)]

  def _read(self, path: pathlib.Path, match: re.Match) -> Trajectory | None:
    """The record at `path`, consumed; None if it was quarantined or another reader took it."""
    limit = records.max_record_bytes(self.max_tokens) + sealed.RECORD_OVERHEAD
    try:
      data = sealed.read_regular(path, limit)  # never more than a record can be
    except FileNotFoundError:
      return None
    except OSError as error:  # a link, FIFO or directory named *.traj, an unreadable file
      self._quarantine(path, "unreadable", str(error))
      return None
    if len(data) > limit:  # before the MAC, which a cut-off read could never match
      self._quarantine(path, "oversized", f"more than {limit} bytes")
      return None
    try:
      payload = sealed.unseal(self._secret, self._reading, path.name, data)
      traj = records.from_bytes(payload, max_tokens=self.max_tokens)
    except records.RecordError as error:
      self._quarantine(path, error.reason, str(error))
      return None
    if path.name in self._consumed:
      self._quarantine(path, "replayed", "a copy of a record this reader consumed")
      return None
    if traj.prompt_id != int(match["prompt"]):
      self._quarantine(path, "malformed", f"holds prompt {traj.prompt_id}")
      return None
    try:
      path.unlink()
    except FileNotFoundError:
      return None  # another reader consumed it too: only one may keep it
    self._consumed[path.name] = None
    if len(self._consumed) > self.REMEMBER:
      self._consumed.popitem(last=False)
    return traj

  def start_run(self, nonce: bytes | None = None, *, announce: bool = True) -> None:
    """Starts a run on this directory for this reader: a fresh run nonce (or `nonce`,
    the one the first learner host drew). `announce` (one learner host does it):
    quarantine the records earlier runs left, and write the RUN marker that turns
    writers to this run (an earlier run's close marker no longer applies)."""
    self._reading = nonce or secrets.token_bytes(sealed.NONCE_BYTES)
    self._announced = None
    if not announce:
      return
    with os.scandir(self.directory) as entries:
      left = [pathlib.Path(e.path) for e in entries if e.name.endswith(self.SUFFIX)]
    for path in left:
      self._quarantine(path, "earlier_run", "written before this run started")
    # Newer than the run announced so far even if this host's clock is behind: writers
    # follow only a newer run.
    announced = sealed.read_run(self._secret, self._run_file_bytes())
    started = max(time.time_ns(), announced[0] + 1 if announced else 0)
    self._announced = (started, self._reading)
    sealed.write_atomic(self.directory / self.RUN,
                        sealed.run_marker(self._secret, self._announced))

  def _run_file_bytes(self) -> bytes | None:
    return sealed.read_small(self.directory / self.RUN, sealed.RUN_BYTES)

  def _run(self) -> bytes | None:
    """The run this writer writes for: the newest one a RUN marker signed with the secret
    named since it started. An earlier run's marker put back is ignored: following it
    would turn writers to a run nobody reads. The marker is read at every look, not
    known by its file's identity: a peer can swap the file away and back in between."""
    run = sealed.read_run(self._secret, self._run_file_bytes())
    if run is not None and (self._writing is None or run > self._writing):
      self._writing = run
    return self._writing and self._writing[1]

  def _keep_run(self) -> None:
    """Puts this reader's RUN marker back if a peer replaced it by an earlier run's (or
    anything not signed, or nothing): a sampler host starting would write for that run,
    or wait. A newer signed marker is a newer learner's, and stays."""
    if self._announced is None:
      return
    found = sealed.read_run(self._secret, self._run_file_bytes())
    if found is None or found < self._announced:
      sealed.write_atomic(self.directory / self.RUN,
                          sealed.run_marker(self._secret, self._announced))

  @property
  def closed(self) -> bool:
    """Whether the learner closed the run writers write for (a signed CLOSED marker)."""
    nonce = self._run()
    return nonce is not None and self._closes(nonce)

  @property
  def running(self) -> bool:
    """Whether a learner started a run (signed RUN marker) that it has not closed."""
    nonce = self._run()
    return nonce is not None and not self._closes(nonce)

  def _closes(self, nonce: bytes) -> bool:
    """Whether the CLOSED marker closes the run `nonce` (read once per look, like RUN)."""
    return sealed.closes(self._secret, nonce,
                         sealed.read_small(self.directory / self.CLOSED, sealed.CLOSED_BYTES))

  def put(self, traj: Trajectory, timeout: float | None = None) -> None:
    """Writes `traj` sealed for the current run; blocks while `capacity` records wait
    unread or no run has started; TransportClosed once the run is closed, queue.Full
    after `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      nonce = self._run()
      if nonce is not None and self._closes(nonce):
        raise TransportClosed(f"the learner closed {self.directory}")
      if nonce is not None and self._pending() < self.capacity:
        break
      if deadline is not None and time.monotonic() >= deadline:
        raise queue.Full(f"{self.directory} holds {self.capacity} unread trajectories" if nonce
                         else f"{self.directory} has no RUN marker signed with this secret: the "
                              "learner has not started, or its secret differs")
      time.sleep(0.05)
    name = f"{self._writer_id}-{self._seq:012d}.p{traj.prompt_id}{self.SUFFIX}"
    self._seq += 1
    sealed.write_atomic(self.directory / name,
                        sealed.seal(self._secret, nonce, name, records.to_bytes(traj)))

  def get(self, timeout: float = 0.0) -> Trajectory | None:
    if self._reading is None:
      raise RuntimeError("DirectoryTransport.get before start_run: a reader reads for a run")
    deadline = time.monotonic() + timeout
    while True:
      self._keep_run()  # before listing: a sampler host may be waiting for the marker
      for path, match in self._ready():
        traj = self._read(path, match)
        if traj is not None:
          return traj
      if time.monotonic() >= deadline:
        return None
      time.sleep(0.02)

  def close(self) -> None:
    """Ends the run this reader started: writers of it stop (a signed CLOSED marker)."""
    if self._reading is not None:
      sealed.write_atomic(self.directory / self.CLOSED,
                          sealed.closed_marker(self._secret, self._reading))
