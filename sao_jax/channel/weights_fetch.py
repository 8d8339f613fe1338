"""`NetworkSubscriber`: a sampler host fetches policy weights from the learner hosts'
`NetworkWeights` publishers (`sao_jax.channel.weights_net`, which also gives the wire
protocol) over TCP.

`NetworkSubscriber.poll()` asks every learner host which versions
it holds (a reply signed for that request: `weights_wire`), picks the newest
version that all hosts hold and that is newer than its own, fetches every host's
shards of it, checks the header's signature (for that request) and the SHA-256 of
every chunk of every shard (hashed on a few threads while the next shard
arrives, all checked before anything is adopted), assembles full host arrays
and returns `(params, version)`;
the caller places them with its own shardings (`jax.device_put`). It never
allocates more than the model it knows (`spec.template`): a reply, a header or
a shard larger than that is refused before it is read. A peer that fails the
handshake, breaks the protocol, sends a reply not signed for its request (a
forgery, or a replay of a retired version: "bad_mac") or a shard whose digest
differs (`WeightChecksumError`, naming the leaf, the shard and the version) is
counted in `stats` and logged; `poll()` returns None and the subscriber keeps
its previous version; until the retry time the next polls return None at once
without touching the network, the wait doubling from `_RETRY_FIRST_S` per
consecutive failure up to `_RETRY_MAX_S` (a broken peer costs one reconnect
per wait, not one per decode step), and a clean poll resets it.

Versions are bound to the learner's run (`run`, random per publisher, in every
signed reply and header): within a run a subscriber never adopts a version older
than or equal to its own; a learner that restarted (a new run, proven live by a
reply signed for this poll's nonce) is followed from its newest version, whatever
its number (a restart from a checkpoint numbers from that step). A learner host that
cannot be reached raises ConnectionError; a learner that proved the secret but
serves another model (or is not one host of the learner) raises ValueError.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hmac
import json
import math
import os
import time
from typing import Any

import jax
import numpy as np

from sao_jax.channel import weights_wire as wire
from sao_jax.channel.run_secret import MIN_SECRET_BYTES
from sao_jax.channel.weights_wire import PROTOCOL, PeerError

_SHARDS_PER_LEAF = 64  # most shards of one leaf a header may list (a host's devices)
_RETRY_FIRST_S = 0.05  # the wait after a peer broke the protocol, doubled per
_RETRY_MAX_S = 5.0     # consecutive failure up to this
_HASH_THREADS = min(4, os.cpu_count() or 1)  # hashlib releases the GIL on large buffers
_MAX_RUN_CHARS = 64  # of a learner's run compared or logged (a run is 32 hex digits)


class WeightChecksumError(PeerError):
  """A received shard whose bytes differ from what the publisher digested and signed."""

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
    # A header lists the SHA-256 of every chunk of every shard (~70 bytes each).
    self._header_bytes += 70 * (self._model_bytes // wire.DIGEST_CHUNK_BYTES
                                + _SHARDS_PER_LEAF * len(self._leaves))
    self.stats: collections.Counter = collections.Counter()  # connection errors by reason
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # made when first used
    self.run: str | None = None  # the learner's run of `version`
    self.version = -1
    self._retry_wait = 0.0  # 0 after a clean poll; else the last wait (module docstring)
    self._retry_at = 0.0    # time.monotonic() before which poll() stays off the network

  def _check_hosts(self, replies: list[dict]) -> tuple[str, list[list[int]]]:
    """The learner's run and every host's versions, once the replies are well-formed and
    from one learner."""
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
    runs = {wire.field(reply, "run", str, "versions reply")[:_MAX_RUN_CHARS] for reply in replies}
    if len(runs) != 1:  # a learner of several hosts restarting: the next poll sees one run
      raise PeerError("mixed_runs", f"the learner hosts serve different runs {sorted(runs)}")
    return runs.pop(), held

  def poll(self) -> tuple[Any, int] | None:
    """(params, version) of a newer version, or None: nothing newer, or a peer broke the
    protocol (counted in `stats`, logged; that connection is reopened once the retry
    wait has passed: module docstring)."""
    if time.monotonic() < self._retry_at:
      return None
    try:
      replies = [c.versions() for c in self._connections]
      run, held = self._check_hosts(replies)
      # Within a run, only newer versions; a new run (a restarted learner): its newest.
      version = choose_version(held, self.version if run == self.run else -1)
      leaves = None if version is None else self._fetch(run, version)
    except PeerError as error:  # its connection is closed: the stream position is lost
      wire.count_error(self.stats, error, "subscriber")
      self._retry_wait = min(max(2 * self._retry_wait, _RETRY_FIRST_S), _RETRY_MAX_S)
      self._retry_at = time.monotonic() + self._retry_wait
      return None
    self._retry_wait = 0.0
    if leaves is None:
      return None
    self.run, self.version = run, version
    return jax.tree.unflatten(self._treedef, leaves), version

  def _fetch(self, run: str, version: int) -> list[np.ndarray] | None:
    """Every leaf of `version` of `run` assembled on host, every chunk of every shard
    checked against its signed digest; None if a host no longer holds it."""
    leaves = [np.empty(m["shape"], dtype) for m, dtype in zip(self._leaves, self._dtypes)]
    covered: list[dict[tuple, int]] = [{} for _ in leaves]  # distinct shard index -> size
    checks: list[tuple] = []  # (digests being computed, signed digests, what it is)
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
        if header.get("version") != version or header.get("run") != run:
          raise PeerError("stale_version", f"a header of version {header.get('version')} of run "
                          f"{str(header.get('run'))[:_MAX_RUN_CHARS]} where {version} of {run} "
                          "was asked for")
        for entry in entries:
          announced += self._receive(connection, entry, leaves, covered, version, checks)
          if announced > self._model_bytes:
            raise PeerError("oversized", f"shards of more than the model's {self._model_bytes} "
                                         "bytes")
      except BaseException:
        connection.close()  # the stream position is lost; reconnect next time
        raise
    for computing, signed, (path, key, address) in checks:  # before anything is adopted
      if not all(hmac.compare_digest(got, want)
                 for got, want in zip(computing.result(), signed)):
        raise WeightChecksumError(
            f"weight channel: version {version} leaf {path} shard {key} from learner host "
            f"{address} differs from what the learner signed (SHA-256); keeping version "
            f"{self.version}")
    for meta, leaf, shards in zip(self._leaves, leaves, covered):
      if sum(shards.values()) != leaf.size:
        raise ValueError(f"weight channel: version {version} leaf {meta['path']}: the learner "
                         f"hosts served {sum(shards.values())} of its {leaf.size} elements; "
                         "is every learner host in sampler.weights_addresses?")
    return leaves

  def _receive(self, connection: wire.Connection, entry: Any, leaves: list[np.ndarray],
               covered: list[dict[tuple, int]], version: int, checks: list) -> int:
    """Reads one shard into its leaf and starts hashing it (onto `checks`); returns its
    size in bytes."""
    leaf_id, key, nbytes, digests = wire.shard_entry(entry, self._leaves)
    leaf, path = leaves[leaf_id], self._leaves[leaf_id]["path"]
    shape = tuple(stop - start for start, stop in key)
    if nbytes != math.prod(shape) * leaf.itemsize:
      raise PeerError("bad_frame", f"{connection.address} announced {nbytes} bytes for leaf "
                                   f"{path} shard {key} of shape {shape}")
    whole = shape == leaf.shape and key not in covered[leaf_id]
    buffer = leaf.reshape(-1).view(np.uint8) if whole else np.empty(nbytes, np.uint8)
    connection.recv_frame_into(buffer)
    if self._pool is None:
      self._pool = concurrent.futures.ThreadPoolExecutor(_HASH_THREADS, "sao-weights-check")
    checks.append((self._pool.submit(wire.chunk_digests, buffer), digests,
                   (path, key, connection.address)))
    if key not in covered[leaf_id]:
      if not whole:
        leaf[tuple(slice(start, stop) for start, stop in key)] = (
            buffer.view(leaf.dtype).reshape(shape))
      covered[leaf_id][key] = math.prod(shape)
    return nbytes

  def close(self) -> None:
    for connection in self._connections:
      connection.close()
    if self._pool is not None:
      self._pool.shutdown(wait=False)
      self._pool = None
