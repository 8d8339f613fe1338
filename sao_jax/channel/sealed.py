"""What the directory transport writes, sealed with the run secret (`sao_jax.channel.run_secret`).

A shared directory (NFS, a mounted bucket) may be writable by more than the
run's own hosts, so nothing in it is trusted for where it sits or what it is
called. Three kinds of file, each bound by an HMAC-SHA256 under the secret K to
the run that wrote it, identified by a random 16-byte run nonce N that the
learner draws each time it starts (`DirectoryTransport.start_run`):

    RUN               "SAO-RUN2"    | N | T | HMAC(K, "run", N, T)
    CLOSED            "SAO-CLOSED1" |     HMAC(K, "closed", N)
    <name>.traj       "SAO-TRAJ1"   |     HMAC(K, "traj", N, name, payload) | payload

`payload` is `records.to_bytes(trajectory)`, `name` the file name's bytes (any bytes
a peer chose); every MAC input is a sequence of length-prefixed parts, so no two
inputs share an encoding. T (8 bytes) is when the run started, in ns, later than
any run the learner found announced: a writer follows only a run newer than the
one it knows, so an earlier run's markers, both validly signed, put back into the
directory neither turn it to that run nor close its own. Without K nobody can
inject a trajectory (a forged reward is a forged gradient), close the run (turn
every sampler away), or start a run of their own. Binding a record to its name
stops a copy being renamed into another reader's shard; binding it to N stops
a record, or a close marker, of an earlier run being replayed into this one.
A record replayed within its own run under its own name is caught by the
reader, which remembers the names it consumed (`DirectoryTransport`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pathlib
import stat
import struct
import uuid

from sao_jax.channel.records import RecordError

NONCE_BYTES = 16
MAC_BYTES = hashlib.sha256().digest_size
RUN_MAGIC, CLOSED_MAGIC, RECORD_MAGIC = b"SAO-RUN2", b"SAO-CLOSED1", b"SAO-TRAJ1"
_PART = struct.Struct("!Q")  # a MAC input part's length
_TIME = struct.Struct("!Q")  # a run's start time, ns
RUN_BYTES = len(RUN_MAGIC) + NONCE_BYTES + _TIME.size + MAC_BYTES
CLOSED_BYTES = len(CLOSED_MAGIC) + MAC_BYTES
RECORD_OVERHEAD = len(RECORD_MAGIC) + MAC_BYTES  # bytes a sealed record adds to its payload


def hmac_parts(secret: bytes, *parts: bytes) -> bytes:
  """HMAC-SHA256 under `secret` of `parts`, each length-prefixed (no two inputs collide);
  the first part labels what is signed ("run", "traj", "weights", ...)."""
  message = b"".join(_PART.pack(len(part)) + part for part in parts)
  return hmac.new(secret, message, hashlib.sha256).digest()


def run_marker(secret: bytes, run: tuple[int, bytes]) -> bytes:
  """The RUN marker of `run`, (start time in ns, nonce)."""
  started, nonce = _TIME.pack(run[0]), run[1]
  return RUN_MAGIC + nonce + started + hmac_parts(secret, b"run", nonce, started)


def read_run(secret: bytes, data: bytes | None) -> tuple[int, bytes] | None:
  """The run (start time in ns, nonce) a RUN marker's bytes announce, or None unless K
  signed them. Runs compare by start time: the greater is the newer."""
  if data is None or len(data) != RUN_BYTES or not data.startswith(RUN_MAGIC):
    return None
  nonce = data[len(RUN_MAGIC):len(RUN_MAGIC) + NONCE_BYTES]
  started, mac = data[len(RUN_MAGIC) + NONCE_BYTES:-MAC_BYTES], data[-MAC_BYTES:]
  if not hmac.compare_digest(mac, hmac_parts(secret, b"run", nonce, started)):
    return None
  return _TIME.unpack(started)[0], nonce


def closed_marker(secret: bytes, nonce: bytes) -> bytes:
  return CLOSED_MAGIC + hmac_parts(secret, b"closed", nonce)


def closes(secret: bytes, nonce: bytes, data: bytes | None) -> bool:
  """Whether a CLOSED marker's bytes close the run `nonce` (K signed them for it)."""
  return data is not None and hmac.compare_digest(data, closed_marker(secret, nonce))


def seal(secret: bytes, nonce: bytes, name: str, payload: bytes) -> bytes:
  """A record file's bytes: `payload` signed for the run `nonce` under the file `name`."""
  return RECORD_MAGIC + hmac_parts(secret, b"traj", nonce, os.fsencode(name), payload) + payload


def unseal(secret: bytes, nonce: bytes, name: str, data: bytes) -> bytes:
  """The payload of a record file `name`; RecordError('bad_signature') unless K sealed
  exactly these bytes under this name for this run."""
  if len(data) < RECORD_OVERHEAD or not data.startswith(RECORD_MAGIC):
    raise RecordError("bad_signature", "not a sealed record (no SAO-TRAJ1 header)")
  mac, payload = data[len(RECORD_MAGIC):RECORD_OVERHEAD], data[RECORD_OVERHEAD:]
  if not hmac.compare_digest(mac, hmac_parts(secret, b"traj", nonce, os.fsencode(name), payload)):
    raise RecordError("bad_signature", "its signature does not match this run's secret, run "
                                       "and file name (a forgery, a copy, or an earlier run's)")
  return payload


def read_regular(path: pathlib.Path, limit: int) -> bytes:
  """At most `limit` + 1 bytes of the regular file `path`, opened without following a
  link or waiting for a FIFO's writer; OSError when it is missing (FileNotFoundError)
  or anything else."""
  fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
  try:
    mode = os.fstat(fd).st_mode
    # Checked before open(), which refuses a directory and then never closes `fd`.
    if not stat.S_ISREG(mode):
      raise OSError(f"not a regular file (mode {mode:o})")
    with open(fd, "rb", closefd=False) as file:
      return file.read(limit + 1)
  finally:
    os.close(fd)


def read_small(path: pathlib.Path, limit: int) -> bytes | None:
  """`read_regular(path, limit)`, or None when it is missing or anything else."""
  try:
    return read_regular(path, limit)
  except OSError:
    return None


def hidden_name(path: pathlib.Path, tag: str) -> pathlib.Path:
  """A fresh, unguessable hidden name beside `path` (`.<name>.<random>.<tag>`): where a
  file is written before its rename, or what a peer put in the way is moved aside to."""
  return path.with_name(f".{path.name}.{uuid.uuid4().hex}.{tag}")


def write_atomic(path: pathlib.Path, data: bytes, *, dir_fd: int | None = None) -> None:
  """Writes `data` to `path` through a temporary file and a rename, so a reader sees the
  old file or the new one, never part of one. The temporary name is random and created
  afresh (a peer cannot guess it, and a link or FIFO it put there anyway is never
  written through); a directory a peer put at `path`, which a rename cannot replace,
  is moved aside to a hidden name first. With `dir_fd` (a directory opened without
  following a link), `path` is a name in that directory: nothing is written through a
  link a peer put in place of the directory."""
  path = pathlib.Path(path)
  tmp = hidden_name(path, "tmp")
  at = {"src_dir_fd": dir_fd, "dst_dir_fd": dir_fd}
  try:
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=dir_fd),
              "wb") as file:
      file.write(data)
    try:
      os.rename(tmp, path, **at)
    except IsADirectoryError:
      os.rename(path, hidden_name(path, "moved"), **at)
      os.rename(tmp, path, **at)
  except BaseException:
    try:
      os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
      pass
    raise
