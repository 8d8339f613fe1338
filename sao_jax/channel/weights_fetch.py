"""`NetworkSubscriber`: a sampler host fetches policy weights from the learner hosts'
`NetworkWeights` publishers (`sao_jax.channel.weights_net`, which also gives the wire
protocol) over TCP.

`NetworkSubscriber.poll()` asks every learner host which versions
it holds, picks the newest version that all hosts hold and that is newer than
its own, fetches every host's shards of it, checks the header's signature and
each shard's crc32, assembles full host arrays and returns `(params, version)`;
the caller places them with its own shardings (`jax.device_put`). It never
allocates more than the model it knows (`spec.template`): a reply, a header or
a shard larger than that is refused before it is read. A peer that fails the
handshake, breaks the protocol, sends an unsigned header or a shard whose crc32
differs (`WeightChecksumError`, naming the leaf, the shard and the version) is
counted in `stats` and logged; `poll()` returns None and the subscriber keeps
its previous version; until the retry time the next polls return None at once
without touching the network, the wait doubling from `_RETRY_FIRST_S` per
consecutive failure up to `_RETRY_MAX_S` (a broken peer costs one reconnect
per wait, not one per decode step), and a clean poll resets it. It never
adopts an older version. A learner host that
cannot be reached raises ConnectionError; a learner that proved the secret but
serves another model (or is not one host of the learner) raises ValueError.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
import zlib
from typing import Any

import jax
import numpy as np

from sao_jax.channel import weights_wire as wire
from sao_jax.channel.run_secret import MIN_SECRET_BYTES
from sao_jax.channel.weights_wire import PROTOCOL, PeerError

_SHARDS_PER_LEAF = 64  # most shards of one leaf a header may list (a host's devices)
_RETRY_FIRST_S = 0.05  # the wait after a peer broke the protocol, doubled per
_RETRY_MAX_S = 5.0     # consecutive failure up to this


class WeightChecksumError(PeerError):
  """A received shard whose bytes differ from what the publisher checksummed."""

  def __init__(self, message: str):
    super().__init__("checksum", message)


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
  """What a subscriber needs: every learner host's address and the params' shapes."""

  addresses: tuple[str, ...]  # "host:port" of every learner host
  template: Any  # pytree of jax.ShapeDtypeStruct: the sampler's parameter tree
  timeout: float = 60.0  # seconds a connect or a single read may take
  secret: bytes = dataclasses.field(kw_only=True, repr=False)  # proves both ends (weights_wire)


def choose_version(held: list[list[int]], current: int) -> int | None:
  """The newest version every host holds that is newer than `current`, or None."""
  common = set(held[0]).intersection(*held[1:])
  newer = [v for v in common if v > current]
  return max(newer) if newer else None


class NetworkSubscriber:
  """Sampler side: `poll()` returns (host params, version) when a newer version exists."""

  def __init__(self, spec: NetworkSpec):
    if not spec.addresses:
      raise ValueError("weight channel: no learner addresses; set sampler.weights_addresses")
    if len(spec.secret) < MIN_SECRET_BYTES:
      raise ValueError("weight channel: no shared secret; set sampler.weights_secret_file "
                       "(or sampler.weights_secret_env) to the learner's secret")
    self._spec = spec
    self._leaves = wire.describe_leaves(spec.template)
    self._dtypes = [np.dtype(leaf.dtype) for leaf in jax.tree.leaves(spec.template)]
    self._treedef = jax.tree.structure(spec.template)
    self._connections = [wire.Connection(a, spec.timeout, spec.secret) for a in spec.addresses]
    self._model_bytes = sum(math.prod(m["shape"]) * d.itemsize
                            for m, d in zip(self._leaves, self._dtypes))
    # A header lists the leaves and at most _SHARDS_PER_LEAF shards of each (~200 bytes).
    self._header_bytes = (wire.MAX_REPLY_BYTES + 2 * len(json.dumps(self._leaves))
                          + 256 * _SHARDS_PER_LEAF * len(self._leaves))
    self.stats: collections.Counter = collections.Counter()  # connection errors by reason
    self.version = -1
    self._retry_wait = 0.0  # 0 after a clean poll; else the last wait (module docstring)
    self._retry_at = 0.0    # time.monotonic() before which poll() stays off the network

  def _check_hosts(self, replies: list[dict]) -> list[list[int]]:
    """Every host's versions, once the replies are well-formed and from one learner."""
    held = []
    for connection, reply in zip(self._connections, replies):
      if reply.get("protocol") != PROTOCOL:
        raise ValueError(f"weight channel: {connection.address} speaks protocol "
                         f"{reply.get('protocol')}, this sampler {PROTOCOL}; run the same sao_jax")
      versions = wire.field(reply, "versions", list, "versions reply")
      if len(versions) > 1024 or not all(isinstance(v, int) and not isinstance(v, bool)
                                         for v in versions):
        raise PeerError("bad_frame", f"versions reply: 'versions' is {str(versions)[:60]}")
      held.append(versions)
      for key in ("process_index", "process_count"):
        wire.field(reply, key, int, "versions reply")
    indices = sorted(r["process_index"] for r in replies)
    counts = {r["process_count"] for r in replies}
    if counts != {len(replies)} or indices != list(range(len(replies))):
      seen = {c.address: (r["process_index"], r["process_count"])
              for c, r in zip(self._connections, replies)}
      raise ValueError(f"weight channel: the addresses {list(self._spec.addresses)} are not "
                       f"every host of one learner exactly once (host: (process index, process "
                       f"count) = {seen}); list every learner host in sampler.weights_addresses")
    return held

  def poll(self) -> tuple[Any, int] | None:
    """(params, version) of a newer version, or None: nothing newer, or a peer broke the
    protocol (counted in `stats`, logged; that connection is reopened once the retry
    wait has passed: module docstring)."""
    if time.monotonic() < self._retry_at:
      return None
    try:
      replies = [c.call({"op": "versions"}) for c in self._connections]
      version = choose_version(self._check_hosts(replies), self.version)
      leaves = None if version is None else self._fetch(version)
    except PeerError as error:  # its connection is closed: the stream position is lost
      wire.count_error(self.stats, error, "subscriber")
      self._retry_wait = min(max(2 * self._retry_wait, _RETRY_FIRST_S), _RETRY_MAX_S)
      self._retry_at = time.monotonic() + self._retry_wait
      return None
    self._retry_wait = 0.0
    if leaves is None:
      return None
    self.version = version
    return jax.tree.unflatten(self._treedef, leaves), version

  def _fetch(self, version: int) -> list[np.ndarray] | None:
    """Every leaf of `version` assembled on host; None if a host no longer holds it."""
    leaves = [np.empty(m["shape"], dtype) for m, dtype in zip(self._leaves, self._dtypes)]
    covered: list[dict[tuple, int]] = [{} for _ in leaves]  # distinct shard index -> size
    announced = 0
    for connection in self._connections:
      try:
        header = connection.get_header(version, self._header_bytes)
        if "error" in header:
          return None
        difference = wire.first_leaf_difference(wire.field(header, "leaves", list, "header"),
                                       self._leaves)
        if difference:
          raise ValueError(f"weight channel: learner host {connection.address} serves "
                           f"{difference}; the learner and sampler must use the same model config")
        entries = wire.field(header, "shards", list, "header")
        if header.get("version") != version:
          raise PeerError("bad_frame", f"a header of version {header.get('version')} where "
                                       f"{version} was asked for")
        for entry in entries:
          announced += self._receive(connection, entry, leaves, covered, version)
          if announced > self._model_bytes:
            raise PeerError("oversized", f"shards of more than the model's {self._model_bytes} "
                                         "bytes")
      except BaseException:
        connection.close()  # the stream position is lost; reconnect next time
        raise
    for meta, leaf, shards in zip(self._leaves, leaves, covered):
      if sum(shards.values()) != leaf.size:
        raise ValueError(f"weight channel: version {version} leaf {meta['path']}: the learner "
                         f"hosts served {sum(shards.values())} of its {leaf.size} elements; "
                         "is every learner host in sampler.weights_addresses?")
    return leaves

  def _receive(self, connection: wire.Connection, entry: Any, leaves: list[np.ndarray],
               covered: list[dict[tuple, int]], version: int) -> int:
    """Reads one shard into its leaf; returns its size in bytes."""
    leaf_id, key, nbytes, crc32 = wire.shard_entry(entry, self._leaves)
    leaf, path = leaves[leaf_id], self._leaves[leaf_id]["path"]
    shape = tuple(stop - start for start, stop in key)
    if nbytes != math.prod(shape) * leaf.itemsize:
      raise PeerError("bad_frame", f"{connection.address} announced {nbytes} bytes for leaf "
                                   f"{path} shard {key} of shape {shape}")
    whole = shape == leaf.shape and key not in covered[leaf_id]
    buffer = leaf.reshape(-1).view(np.uint8) if whole else np.empty(nbytes, np.uint8)
    connection.recv_frame_into(buffer)
    crc = zlib.crc32(buffer)
    if crc != crc32:
      raise WeightChecksumError(
          f"weight channel: version {version} leaf {path} shard {key} from learner host "
          f"{connection.address} has crc32 {crc:#010x}, the publisher computed "
          f"{crc32:#010x}; keeping version {self.version}")
    if key not in covered[leaf_id]:
      if not whole:
        leaf[tuple(slice(start, stop) for start, stop in key)] = (
            buffer.view(leaf.dtype).reshape(shape))
      covered[leaf_id][key] = math.prod(shape)
    return nbytes

  def close(self) -> None:
    for connection in self._connections:
      connection.close()
