"""`NetworkWeights`: policy weights from learner hosts to sampler hosts over TCP.

For a learner and samplers that are different JAX clusters (different TPU
slices): multi-controller JAX cannot `device_put` between disjoint meshes, so
weights travel host to host.

Publisher, one per learner host: `publish(params, version)` copies this host's
addressable shards of every leaf to host memory (`jax.Array.addressable_shards`,
only `replica_id == 0`, so across all hosts each distinct shard is served
exactly once), computes a crc32 per shard, signs the header that lists them
(`weights_wire`), and makes the snapshot the newest of the `keep` versions it
serves. A thread per connection sends snapshots; a transfer holds a reference
to its snapshot, so `publish` (which only swaps references under a lock) never
waits for a sampler and never changes bytes that are being sent. It listens
on one interface (`host`, loopback unless samplers on other hosts need this
host's own address), serves at most `max_connections` subscribers at once,
only after they prove the shared secret (`weights_wire` handshake, within a
few seconds), reads requests of at most a few hundred bytes, and disconnects a
subscriber that sends no request for `_IDLE_SECONDS` or stops reading for
`timeout` seconds. Each misbehaving connection is counted in `stats`.

Subscriber, on a sampler host: `poll()` asks every learner host which versions
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

Wire protocol (frames, handshake and signature: `weights_wire`), after the handshake:
  {"op": "versions"}          -> {"protocol", "process_index", "process_count", "versions"}
  {"op": "get", "version": v} -> a header frame, its 32-byte signature frame, then
                                 one frame of raw bytes per shard:
     {"protocol", "version", "process_index", "process_count",
      "leaves": [{"path", "shape", "dtype"}, ...],
      "shards": [{"leaf", "index": [[start, stop], ...], "nbytes", "crc32"}, ...]}
     or {"error": ...} when v is no longer held (the next poll takes a newer one).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import secrets
import socket
import socketserver
import threading
import time
import zlib
from typing import Any

import jax
import numpy as np

from sao_jax.config.sampler import SamplerConfig
from sao_jax.sampler import weights_wire as wire
from sao_jax.sampler.weights_wire import LENGTH, PROTOCOL, PeerError

_IDLE_SECONDS = 60.0  # an authenticated subscriber with no request for this long is closed
_SHARDS_PER_LEAF = 64  # most shards of one leaf a header may list (a host's devices)
_RETRY_FIRST_S = 0.05  # a subscriber's wait after a peer broke the protocol, doubled per
_RETRY_MAX_S = 5.0     # consecutive failure up to this


class WeightChecksumError(PeerError):
  """A received shard whose bytes differ from what the publisher checksummed."""

  def __init__(self, message: str):
    super().__init__("checksum", message)


def _describe(tree: Any) -> list[dict]:
  """[{path, shape, dtype}] of every leaf, in `jax.tree.leaves` order."""
  return [{"path": jax.tree_util.keystr(path), "shape": list(np.shape(leaf)),
           "dtype": np.dtype(leaf.dtype).name}
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _first_difference(got: list[dict], want: list[dict]) -> str | None:
  if len(got) != len(want):
    return f"{len(got)} leaves instead of {len(want)}"
  for g, w in zip(got, want):
    if not isinstance(g, dict) or g.keys() != w.keys():
      return f"a leaf described as {str(g)[:80]} where {w['path']} is expected"
    if g != w:
      return f"leaf {g['path']} {tuple(g['shape'])} {g['dtype']} where {w['path']} " \
             f"{tuple(w['shape'])} {w['dtype']} is expected"
  return None


@dataclasses.dataclass(frozen=True)
class _Snapshot:
  header: bytes  # the JSON header frame and its signature frame, length prefixes included
  payloads: tuple[np.ndarray, ...]  # uint8, one per header shard entry


def _snapshot(params: Any, version: int, leaves: list[dict], process: dict,
              secret: bytes) -> _Snapshot:
  """This host's shards of `params` copied to host memory, with their crc32s."""
  pieces = []  # (leaf id, index as [[start, stop]], data)
  for leaf_id, (leaf, meta) in enumerate(zip(jax.tree.leaves(params), leaves)):
    if isinstance(leaf, jax.Array):
      for shard in leaf.addressable_shards:
        if shard.replica_id == 0:
          index = [list(s.indices(d)[:2]) for s, d in zip(shard.index, meta["shape"])]
          pieces.append((leaf_id, index, shard.data))
    else:
      pieces.append((leaf_id, [[0, d] for d in meta["shape"]], leaf))
  for _, _, data in pieces:  # start every device-to-host copy before waiting for one
    if isinstance(data, jax.Array):
      data.copy_to_host_async()
  entries, payloads = [], []
  for leaf_id, index, data in pieces:
    payload = np.array(data).reshape(-1).view(np.uint8)  # a copy: the learner donates its state
    entries.append({"leaf": leaf_id, "index": index, "nbytes": payload.nbytes,
                    "crc32": zlib.crc32(payload)})
    payloads.append(payload)
  header = json.dumps({"protocol": PROTOCOL, "version": version, **process,
                       "leaves": leaves, "shards": entries}).encode()
  mac = wire.sign_header(secret, header)
  return _Snapshot(LENGTH.pack(len(header)) + header + LENGTH.pack(len(mac)) + mac,
                   tuple(payloads))


class _Server(socketserver.ThreadingTCPServer):
  daemon_threads = True
  allow_reuse_address = True
  block_on_close = False

  def verify_request(self, request, client_address) -> bool:
    """Turns a connection away (closed at once) while `max_connections` are served."""
    channel: NetworkWeights = self.channel
    with channel._lock:
      if len(channel._connections) >= channel.max_connections:
        channel._count(PeerError("too_many_connections", f"more than {channel.max_connections} "
                                 "connections at once (sampler.weights_max_connections)"),
                       client_address)
        return False
      channel._connections.add(request)
    return True


class _Handler(socketserver.BaseRequestHandler):
  """One subscriber connection: handshake, then requests until it closes, idles or stalls."""

  def handle(self) -> None:
    channel: NetworkWeights = self.server.channel
    sock = self.request
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
      wire.server_handshake(sock, channel._secret)
      while True:
        try:
          payload = wire.recv_frame(sock, wire.MAX_REQUEST_BYTES,
                                    time.monotonic() + _IDLE_SECONDS)
        except TimeoutError:
          return  # idle (e.g. held back by a full transport): it reconnects when it polls
        if payload is None:
          return  # the subscriber closed between requests
        request = wire.parse(payload, wire.MAX_REQUEST_BYTES, "request")
        sock.settimeout(channel.timeout)
        channel._answer(sock, request)
    except PeerError as error:
      channel._count(error, self.client_address)
    except TimeoutError:
      channel._count(PeerError("timeout", "no complete handshake or request in time"),
                     self.client_address)
    except OSError as error:  # reset, or closed mid-message
      channel._count(PeerError("disconnected", str(error)), self.client_address)
    finally:
      with channel._lock:
        channel._connections.discard(sock)


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
  """What a subscriber needs: every learner host's address and the params' shapes."""

  addresses: tuple[str, ...]  # "host:port" of every learner host
  template: Any  # pytree of jax.ShapeDtypeStruct: the sampler's parameter tree
  timeout: float = 60.0  # seconds a connect or a single read may take
  secret: bytes = dataclasses.field(kw_only=True, repr=False)  # proves both ends (weights_wire)


class NetworkWeights:
  """Publisher side: serves this host's shards of the newest `keep` versions."""

  def __init__(self, template: Any, *, host: str = "127.0.0.1", port: int = 0,
               addresses: tuple[str, ...] = (), keep: int = 2, timeout: float = 60.0,
               secret: bytes | None = None,
               max_connections: int = SamplerConfig.weights_max_connections):
    """Serves on host:port (port 0: any free port). `addresses` lists every learner
    host for subscribers on other hosts; empty means this one server (`self.address`).
    `secret`: what peers must prove (weights_wire); None, on a loopback `host` only,
    makes a fresh random one that reaches same-host samplers through `self.spec`."""
    if keep < 1:
      raise ValueError(f"keep={keep}: a publisher must hold at least one version")
    if secret is None:
      if not wire.is_loopback(host):
        raise ValueError(f"weight channel: serving on {host} (other hosts) needs a shared "
                         "secret; set sampler.weights_secret_file (create it with "
                         "`head -c 32 /dev/urandom > weights.secret`) or "
                         "sampler.weights_secret_env")
      secret = secrets.token_bytes(32)
    if len(secret) < wire.MIN_SECRET_BYTES:
      raise ValueError(f"weight channel: a secret of {len(secret)} bytes; it needs at least "
                       f"{wire.MIN_SECRET_BYTES} (`head -c 32 /dev/urandom > weights.secret`)")
    self._secret, self.max_connections = secret, max_connections
    self._leaves = _describe(template)
    self._snapshots: dict[int, _Snapshot] = {}
    self._lock = threading.Lock()
    self._connections: set[socket.socket] = set()
    self.stats: collections.Counter = collections.Counter()  # connection errors by reason
    self._stats_lock = threading.Lock()
    self._keep, self.timeout = keep, timeout
    # Read once here: server threads must not touch the JAX runtime.
    self._process = {"process_index": jax.process_index(), "process_count": jax.process_count()}
    try:
      self._server = _Server((host, port), _Handler)
    except OSError as error:
      raise OSError(f"weight channel: cannot listen on {host}:{port}: {error}; choose another "
                    "sampler.weights_port (or check this host's sampler.weights_addresses "
                    "entry)") from error
    self._server.channel = self
    threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                     name="sao-weights-server", daemon=True).start()
    self.address = f"{host}:{self._server.server_address[1]}"
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), template)
    self.spec = NetworkSpec(tuple(addresses) or (self.address,), abstract, timeout,
                            secret=secret)

  def _count(self, error: PeerError, client_address) -> None:
    with self._stats_lock:  # handler threads count concurrently
      wire.count_error(self.stats, error, f"subscriber {client_address[0]}:{client_address[1]}")

  @property
  def versions(self) -> list[int]:
    with self._lock:
      return sorted(self._snapshots)

  def publish(self, params: Any, version: int) -> None:
    """Serves `params` as `version` (greater than every earlier version) from now on."""
    version = int(version)
    held = self.versions
    if held and version <= held[-1]:
      raise ValueError(f"publish: version {version} is not newer than the published "
                       f"{held[-1]}; versions must increase")
    difference = _first_difference(_describe(params), self._leaves)
    if difference:
      raise ValueError(f"publish: params have {difference}; build a new channel for a new model")
    snapshot = _snapshot(params, version, self._leaves, self._process, self._secret)
    with self._lock:
      self._snapshots[version] = snapshot
      while len(self._snapshots) > self._keep:
        del self._snapshots[min(self._snapshots)]

  def _answer(self, sock: socket.socket, request: dict) -> None:
    op = request.get("op")
    with self._lock:
      versions = sorted(self._snapshots)
      snapshot = self._snapshots.get(request.get("version")) if op == "get" else None
    if op == "versions":
      wire.send_json(sock, {"protocol": PROTOCOL, **self._process, "versions": versions})
    elif op == "get" and snapshot is not None:
      sock.sendall(snapshot.header)
      for payload in snapshot.payloads:
        sock.sendall(LENGTH.pack(payload.nbytes))
        sock.sendall(payload)
    elif op == "get":
      wire.send_json(sock, {"error": f"version {request.get('version')!r} is not held "
                                     f"(holding {versions})"})
    else:
      wire.send_json(sock, {"error": f"unknown request {str(request)[:100]}"})
      raise PeerError("bad_request", f"unknown request {str(request)[:100]}")

  def close(self) -> None:
    """Stops serving and disconnects every subscriber."""
    self._server.shutdown()
    self._server.server_close()
    with self._lock:
      connections = list(self._connections)
    for sock in connections:
      try:
        sock.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass  # already closed by the peer


def from_config(cfg: SamplerConfig, template: Any) -> NetworkWeights:
  """The publisher of `cfg` (weights='network'): on loopback for same-host samplers, or,
  with `weights_addresses`, on this learner host's own entry of them (its process index)."""
  host = "127.0.0.1"
  if cfg.weights_addresses:
    host = cfg.weights_addresses[jax.process_index()].rpartition(":")[0]
  return NetworkWeights(template, host=host, port=cfg.weights_port,
                        addresses=cfg.weights_addresses, secret=wire.load_secret(cfg),
                        max_connections=cfg.weights_max_connections)


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
    if len(spec.secret) < wire.MIN_SECRET_BYTES:
      raise ValueError("weight channel: no shared secret; set sampler.weights_secret_file "
                       "(or sampler.weights_secret_env) to the learner's secret")
    self._spec = spec
    self._leaves = _describe(spec.template)
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
        difference = _first_difference(wire.field(header, "leaves", list, "header"),
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
