"""Signed digests of the weights a learner publishes through a shared directory.

`sampler.weights='directory'` puts each version in a directory or bucket that
more than the run's own hosts may be able to write. Without a check, whoever can
write there chooses the weights every sampler plays with: what the learner then
trains on (an off-policy correction bounds the damage per token, but the
trajectories, the rewards they reach and the behaviour the policy imitates are
theirs). So each learner host, before a version is saved, signs what it holds of
it, and a subscriber checks the arrays it restored against that, not the files:
what is checked is exactly what is used, whatever a peer swaps in the directory
while orbax reads it.

Each learner host k of n writes, for version v of the run started at T (ns, the
first host's clock when the publisher was made, later than every run a head in
the directory was signed for):

    signatures/<v>.<k>    "SAO-WEIGHTS1" | HMAC(K, "weights", payload) | payload
    signatures/<v>.head   "SAO-WEIGHTS1" | HMAC(K, "head", head) | head   (host 0 only)

`payload` is JSON {"run": T, "version": v, "process": k, "leaves": {path: {"shape",
"dtype", "boxes": [[box, sha256 hex], ...]}}}: for each leaf
(`jax.tree_util.keystr` path) the boxes ([[start, stop] per axis]) of the shards
host k holds as their replica 0, each with the SHA-256 of its bytes in C order;
over all hosts the boxes of a leaf tile it exactly once. `head` is JSON
{"run": T, "version": v, "processes": n}: a few bytes (a bigger file is refused,
`MAX_HEAD_BYTES`) that a subscriber reads at every poll to order the versions it
sees. A subscriber accepts a version when every host's file is signed by K for
that (T, v), the boxes tile every leaf of its template (shapes and dtypes equal),
and every box of the restored arrays hashes as signed. Without K nobody can make
a version pass: that needs an HMAC-SHA256 forged or a SHA-256 second preimage.
Versions order by (T, v): a version of an earlier run, validly signed and put
back, is older than every version of the current run, so a sampler never
returns to it. The learner writes and deletes signatures only through the real
`signatures` directory, opened without following a link (`write_file`,
`delete_files`): a peer's link there must not take it elsewhere on its host.
"""

from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import hmac
import json
import os
import pathlib
from typing import Any, Callable, Iterable

import jax
import numpy as np
from etils import epath

from sao_jax import bounded_json
from sao_jax.channel import sealed

MAGIC = b"SAO-WEIGHTS1"
SIGNATURES = "signatures"  # the subdirectory of the weights directory that holds them
# A signature lists a box per shard: ~120 bytes each. 64 MiB covers 500k shards (a
# 1000-leaf model over 512 devices); a peer's bigger file is refused unread.
MAX_SIGNATURE_BYTES = 64 << 20
# A head is ~60 bytes, read for every listed version at every poll: a peer's bigger file
# is refused after this many bytes (64 MiB ones cost a poll seconds and kept GBs alive).
MAX_HEAD_BYTES = 1024
MAX_DEPTH = 8  # payload -> leaves -> leaf -> boxes -> [box, hex] -> box -> [start, stop]
_HASH_THREADS = min(8, os.cpu_count() or 1)  # hashlib releases the GIL on large buffers


class DigestError(Exception):
  """A version whose signatures or arrays do not check: `reason` says which way."""

  def __init__(self, reason: str, message: str):
    super().__init__(f"{reason}: {message}")
    self.reason = reason


def signature_name(version: int, process: int | None) -> str:
  """The file name of host `process`'s signature of `version` (None: the head)."""
  return f"{version}.{'head' if process is None else process}"


def _sealed(secret: bytes, label: bytes, payload: dict) -> bytes:
  data = json.dumps(payload, separators=(",", ":")).encode()
  return MAGIC + sealed.hmac_parts(secret, label, data) + data


def _unsealed(secret: bytes, label: bytes, data: bytes | None, what: str,
              limit: int = MAX_SIGNATURE_BYTES) -> dict:
  if data is None:
    raise DigestError("unsigned", f"no {what}")
  if len(data) > limit:
    raise DigestError("bad_signature", f"{what} is over {limit} bytes")
  head = len(MAGIC) + sealed.MAC_BYTES
  if len(data) < head or not data.startswith(MAGIC) or not hmac.compare_digest(
      data[len(MAGIC):head], sealed.hmac_parts(secret, label, data[head:])):
    raise DigestError("bad_signature", f"{what} does not match the run's secret (a "
                                       "forgery, or signed with another secret)")
  try:
    payload = bounded_json.loads(data[head:], max_bytes=MAX_SIGNATURE_BYTES,
                                 max_depth=MAX_DEPTH, what=what)
  except ValueError as error:  # signed, so a learner's bug: still not to be trusted
    raise DigestError("bad_signature", str(error)) from None
  if not isinstance(payload, dict):
    raise DigestError("bad_signature", f"{what} is not a JSON object")
  return payload


def sign_head(secret: bytes, *, run: int, version: int, processes: int) -> bytes:
  """Host 0's head of `version`: the run it belongs to, and how many hosts signed it."""
  return _sealed(secret, b"head", {"run": run, "version": version, "processes": processes})


def read_head(secret: bytes, data: bytes | None, *, version: int) -> tuple[int, int]:
  """(run, processes) of `version`'s head; DigestError unless K signed it for `version`."""
  head = _unsealed(secret, b"head", data, f"head of version {version}", MAX_HEAD_BYTES)
  run, processes = head.get("run"), head.get("processes")
  if (head.get("version") != version or type(run) is not int or type(processes) is not int
      or processes < 1):
    raise DigestError("bad_signature", f"the head of version {version} reads {head}")
  return run, processes


def _digest(data: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(data).reshape(-1).view(np.uint8)).hexdigest()


def _box(index: tuple, shape: tuple[int, ...]) -> list[list[int]]:
  """[[start, stop] per axis] of a shard's `index` (slices) in an array of `shape`."""
  box = []
  for axis, size in enumerate(shape):
    part = index[axis] if axis < len(index) else slice(None)
    start, stop, step = part.indices(size)
    if step != 1:
      raise ValueError(f"a shard with stride {step} on axis {axis}: not a box")
    box.append([start, stop])
  return box


def _held(leaf: Any) -> list[tuple[list[list[int]], np.ndarray]]:
  """(box, host data) of each part of `leaf` this process signs: of a jax.Array the
  addressable shards that are their replica 0 (over all hosts, each element once); a
  host array whole, by the first host alone."""
  if isinstance(leaf, jax.Array):
    return [(_box(shard.index, leaf.shape), np.asarray(shard.data))
            for shard in leaf.addressable_shards if shard.replica_id == 0]
  if jax.process_index() == 0:
    array = np.asarray(leaf)
    return [(_box((), array.shape), array)]
  return []


def _leaves(tree: Any) -> list[tuple[str, Any]]:
  return [(jax.tree_util.keystr(path), leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def sign(secret: bytes, params: Any, *, run: int, version: int) -> bytes:
  """This process's signature file of `params` (version `version` of run `run`)."""
  parts = [(path, leaf, box, data) for path, leaf in _leaves(params)
           for box, data in _held(leaf)]
  with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS) as pool:
    digests = list(pool.map(lambda part: _digest(part[3]), parts))
  leaves: dict[str, dict] = {path: {"shape": list(np.shape(leaf)),
                                    "dtype": np.dtype(leaf.dtype).name, "boxes": []}
                             for path, leaf in _leaves(params)}
  for (path, _, box, _), digest in zip(parts, digests):
    leaves[path]["boxes"].append([box, digest])
  return _sealed(secret, b"weights", {"run": run, "version": version,
                                      "process": jax.process_index(), "leaves": leaves})


def read_signature(secret: bytes, data: bytes | None, *, version: int, process: int) -> dict:
  """The payload of host `process`'s signature of `version`; DigestError unless K signed
  it for that version and host."""
  payload = _unsealed(secret, b"weights", data, f"host {process}'s signature of {version}")
  if payload.get("version") != version or payload.get("process") != process:
    raise DigestError("bad_signature", f"host {process}'s signature of version {version} "
                      f"signs version {payload.get('version')} of host {payload.get('process')}")
  return payload


def _check_tiling(path: str, shape: tuple[int, ...], boxes: list) -> None:
  """DigestError unless `boxes` cover an array of `shape` exactly once: per axis their
  intervals partition [0, size), and the boxes are every combination of them once."""
  cuts = [sorted({tuple(box[axis]) for box in boxes}) for axis in range(len(shape))]
  for axis, (size, intervals) in enumerate(zip(shape, cuts)):
    edges = [0, *(stop for _, stop in intervals)]
    if [start for start, _ in intervals] != edges[:-1] or edges[-1] != size:
      raise DigestError("bad_digest", f"{path}: the signed boxes do not partition axis {axis} "
                                      f"of size {size} ({intervals[:4]}...)")
  distinct = {tuple(map(tuple, box)) for box in boxes}
  if len(distinct) != len(boxes) or len(boxes) != int(np.prod([len(c) for c in cuts])):
    raise DigestError("bad_digest", f"{path}: {len(boxes)} signed boxes do not tile its "
                                    f"shape {shape} exactly once")


def _well_formed(path: str, entry: Any, shape: tuple[int, ...]) -> list:
  """The (box, hex) pairs of a signed leaf, checked for form (they are from a signed
  payload, but a learner of another version may write another form)."""
  boxes = entry.get("boxes") if isinstance(entry, dict) else None
  if not isinstance(boxes, list) or not all(
      isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)
      and isinstance(item[0], list) and len(item[0]) == len(shape)
      and all(isinstance(b, list) and len(b) == 2 and all(type(x) is int for x in b)
              and (0 <= b[0] < b[1] <= size or b[0] == b[1] == size == 0)
              for b, size in zip(item[0], shape))
      for item in boxes):
    raise DigestError("bad_digest", f"{path}: malformed boxes in its signature")
  return boxes


def verify(payloads: Iterable[dict], params: Any, *, run: int) -> None:
  """DigestError unless the signed `payloads` (every host's, of run `run`) tile each leaf
  of `params` and every box of `params` hashes as signed."""
  payloads = list(payloads)
  for payload in payloads:
    if payload.get("run") != run or not isinstance(payload.get("leaves"), dict):
      raise DigestError("bad_signature", f"host {payload.get('process')} signed leaves for "
                                         f"run {payload.get('run')}, the head for run {run}")
  checks = []
  for path, leaf in _leaves(params):
    array = np.asarray(leaf)
    entries = [p["leaves"].get(path) for p in payloads]
    if any(not isinstance(e, dict) for e in entries):
      raise DigestError("bad_digest", f"{path}: not in every host's signature")
    for entry in entries:
      if entry.get("shape") != list(array.shape) or entry.get("dtype") != array.dtype.name:
        raise DigestError("bad_digest", f"{path}: signed as {entry.get('shape')} "
                          f"{entry.get('dtype')}, restored as {list(array.shape)} "
                          f"{array.dtype.name}")
    boxes = [item for entry in entries for item in _well_formed(path, entry, array.shape)]
    _check_tiling(path, array.shape, [box for box, _ in boxes])
    checks += [(path, array, box, digest) for box, digest in boxes]
  extra = {key for p in payloads for key in p["leaves"]} - {path for path, _ in _leaves(params)}
  if extra:
    raise DigestError("bad_digest", f"signed leaves the template lacks: {sorted(extra)[:3]}")

  def matches(check) -> bool:
    _, array, box, digest = check
    return hmac.compare_digest(_digest(array[tuple(slice(a, b) for a, b in box)]), digest)

  with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS) as pool:
    for check, ok in zip(checks, pool.map(matches, checks)):
      if not ok:
        raise DigestError("bad_digest", f"{check[0]}: box {check[2]} differs from what the "
                                        "learner signed (its files were changed)")


def read_file(path: pathlib.Path | epath.Path, limit: int = MAX_SIGNATURE_BYTES) -> bytes | None:
  """At most `limit` + 1 bytes of a signature file, or None when it cannot be read; a
  local one without following a link (`sealed.read_small`), a bucket's through epath."""
  if isinstance(path, pathlib.Path):
    return sealed.read_small(path, limit)
  try:
    with path.open("rb") as file:
      return file.read(limit + 1)
  except OSError:
    return None


def _open_directory(path: pathlib.Path) -> int:
  """A descriptor of the directory `path` (made if missing), opened without following a
  link: a link (or file) a peer put there is moved aside to a hidden name first. Before,
  `signatures` made a link to a host directory had the learner write there and delete
  every file of it that signed no kept version."""
  for _ in range(3):
    try:
      return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
      path.mkdir(exist_ok=True)
    except OSError as error:  # ENOTDIR for a link or file (Linux), ELOOP elsewhere
      if error.errno not in (errno.ENOTDIR, errno.ELOOP):
        raise
      path.rename(sealed.hidden_name(path, "moved"))
  raise OSError(f"{path}: not a directory after moving what was there aside twice (a peer "
                "replaces it as fast); make the weights directory writable by the run alone")


def write_file(directory: pathlib.Path | epath.Path, name: str, data: bytes) -> None:
  """Writes a signature `name` in `directory` whole: a local file through a rename in the
  directory opened without following a link (`sealed.write_atomic`); a bucket object,
  which a reader sees whole or not at all, directly."""
  if isinstance(directory, pathlib.Path):
    fd = _open_directory(directory)
    try:
      sealed.write_atomic(pathlib.Path(name), data, dir_fd=fd)
    finally:
      os.close(fd)
  else:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)


def delete_files(directory: pathlib.Path | epath.Path, doomed: Callable[[str], bool]) -> None:
  """Deletes the files of `directory` whose name is `doomed`, never through a link: a
  local directory is opened without following one and its entries unlinked by name in
  it (a link is removed, not what it names). Hidden names (a host's signature being
  written, a peer's entry moved aside) are left alone; a subdirectory signs nothing."""
  if not isinstance(directory, pathlib.Path):
    for path in directory.iterdir() if directory.exists() else ():
      if not path.name.startswith(".") and doomed(path.name):
        try:
          path.unlink()
        except (FileNotFoundError, IsADirectoryError, PermissionError):
          pass
    return
  fd = _open_directory(directory)
  try:
    for name in os.listdir(fd):
      if not name.startswith(".") and doomed(name):
        try:
          os.unlink(name, dir_fd=fd)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
          pass  # deleted meanwhile, or a peer's directory: it signs nothing
  finally:
    os.close(fd)
