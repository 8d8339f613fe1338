"""`NetworkWeights`: policy weights from learner hosts to sampler hosts over TCP.

For a learner and samplers that are different JAX clusters (different TPU
slices): multi-controller JAX cannot `device_put` between disjoint meshes, so
weights travel host to host.

Publisher, one per learner host: `publish(params, version)` copies this host's
addressable shards of every leaf to host memory (`jax.Array.addressable_shards`,
only `replica_id == 0`, so across all hosts each distinct shard is served
exactly once), computes a crc32 per shard, and makes the snapshot the newest of
the `keep` versions it serves. A thread per connection sends snapshots; a
transfer holds a reference to its snapshot, so `publish` (which only swaps
references under a lock) never waits for a sampler and never changes bytes that
are being sent. A subscriber that stops reading for `timeout` seconds is
disconnected.

Subscriber, on a sampler host: `poll()` asks every learner host which versions
it holds, picks the newest version that all hosts hold and that is newer than
its own, fetches every host's shards of it, checks each shard's crc32,
assembles full host arrays and returns `(params, version)`; the caller places
them with its own shardings (`jax.device_put`). A checksum mismatch raises
`WeightChecksumError` naming the leaf, the shard and the version; the
subscriber keeps its previous version. It never adopts an older version.

Wire protocol: each message is a frame (8-byte big-endian length, payload).
  {"op": "versions"}          -> {"protocol", "process_index", "process_count", "versions"}
  {"op": "get", "version": v} -> a header frame, then one frame of raw bytes per shard:
     {"protocol", "version", "process_index", "process_count",
      "leaves": [{"path", "shape", "dtype"}, ...],
      "shards": [{"leaf", "index": [[start, stop], ...], "nbytes", "crc32"}, ...]}
     or {"error": ...} when v is no longer held (the next poll takes a newer one).
"""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import socketserver
import struct
import threading
import zlib
from typing import Any

import jax
import numpy as np

PROTOCOL = 1
_LENGTH = struct.Struct("!Q")
_IDLE_SECONDS = 600.0  # a subscriber connection with no request for this long is closed


class WeightChecksumError(ValueError):
  """A received shard whose bytes differ from what the publisher checksummed."""


def _send_json(sock: socket.socket, message: dict) -> None:
  payload = json.dumps(message).encode()
  sock.sendall(_LENGTH.pack(len(payload)) + payload)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
  while view.nbytes:
    received = sock.recv_into(view)
    if not received:
      raise ConnectionError("the peer closed the connection mid-message")
    view = view[received:]


def _recv_length(sock: socket.socket) -> int:
  header = bytearray(_LENGTH.size)
  _recv_into(sock, memoryview(header))
  return _LENGTH.unpack(header)[0]


def _recv_json(sock: socket.socket) -> dict:
  payload = bytearray(_recv_length(sock))
  _recv_into(sock, memoryview(payload))
  message = json.loads(payload)
  if not isinstance(message, dict):
    raise ValueError(f"expected a JSON object, got {message!r:.100}")
  return message


def _describe(tree: Any) -> list[dict]:
  """[{path, shape, dtype}] of every leaf, in `jax.tree.leaves` order."""
  return [{"path": jax.tree_util.keystr(path), "shape": list(np.shape(leaf)),
           "dtype": np.dtype(leaf.dtype).name}
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _first_difference(got: list[dict], want: list[dict]) -> str | None:
  if len(got) != len(want):
    return f"{len(got)} leaves instead of {len(want)}"
  for g, w in zip(got, want):
    if g != w:
      return f"leaf {g['path']} {tuple(g['shape'])} {g['dtype']} where {w['path']} " \
             f"{tuple(w['shape'])} {w['dtype']} is expected"
  return None


@dataclasses.dataclass(frozen=True)
class _Snapshot:
  header: bytes  # the JSON header frame, length prefix included
  payloads: tuple[np.ndarray, ...]  # uint8, one per header shard entry


def _snapshot(params: Any, version: int, leaves: list[dict], process: dict) -> _Snapshot:
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
  return _Snapshot(_LENGTH.pack(len(header)) + header, tuple(payloads))


class _Server(socketserver.ThreadingTCPServer):
  daemon_threads = True
  allow_reuse_address = True
  block_on_close = False


class _Handler(socketserver.BaseRequestHandler):
  """One subscriber connection: answers requests until it closes, idles or stalls."""

  def handle(self) -> None:
    channel: NetworkWeights = self.server.channel
    sock = self.request
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with channel._lock:
      channel._connections.add(sock)
    try:
      while True:
        sock.settimeout(_IDLE_SECONDS)
        request = _recv_json(sock)
        sock.settimeout(channel.timeout)
        channel._answer(sock, request)
    except (OSError, ValueError):  # closed, idle, stalled or garbled: drop this subscriber only
      return
    finally:
      with channel._lock:
        channel._connections.discard(sock)


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
  """What a subscriber needs: every learner host's address and the params' shapes."""

  addresses: tuple[str, ...]  # "host:port" of every learner host
  template: Any  # pytree of jax.ShapeDtypeStruct: the sampler's parameter tree
  timeout: float = 60.0  # seconds a connect or a single read may take


class NetworkWeights:
  """Publisher side: serves this host's shards of the newest `keep` versions."""

  def __init__(self, template: Any, *, host: str = "127.0.0.1", port: int = 0,
               addresses: tuple[str, ...] = (), keep: int = 2, timeout: float = 60.0):
    """Serves on host:port (port 0: any free port). `addresses` lists every learner
    host for subscribers on other hosts; empty means this one server (`self.address`)."""
    if keep < 1:
      raise ValueError(f"keep={keep}: a publisher must hold at least one version")
    self._leaves = _describe(template)
    self._snapshots: dict[int, _Snapshot] = {}
    self._lock = threading.Lock()
    self._connections: set[socket.socket] = set()
    self._keep, self.timeout = keep, timeout
    # Read once here: server threads must not touch the JAX runtime.
    self._process = {"process_index": jax.process_index(), "process_count": jax.process_count()}
    try:
      self._server = _Server((host, port), _Handler)
    except OSError as error:
      raise OSError(f"weight channel: cannot listen on {host}:{port}: {error}; choose another "
                    "sampler.weights_port") from error
    self._server.channel = self
    threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                     name="sao-weights-server", daemon=True).start()
    self.address = f"{host}:{self._server.server_address[1]}"
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), template)
    self.spec = NetworkSpec(tuple(addresses) or (self.address,), abstract, timeout)

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
    snapshot = _snapshot(params, version, self._leaves, self._process)
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
      _send_json(sock, {"protocol": PROTOCOL, **self._process, "versions": versions})
    elif op == "get" and snapshot is not None:
      sock.sendall(snapshot.header)
      for payload in snapshot.payloads:
        sock.sendall(_LENGTH.pack(payload.nbytes))
        sock.sendall(payload)
    elif op == "get":
      _send_json(sock, {"error": f"version {request.get('version')!r} is not held "
                                 f"(holding {versions})"})
    else:
      _send_json(sock, {"error": f"unknown request {request!r}"})

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


class _Connection:
  """A persistent connection to one learner host (reopened after any failure)."""

  def __init__(self, address: str, timeout: float):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
      raise ValueError(f"weight channel address {address!r} is not host:port")
    self.address, self._target, self._timeout = address, (host, int(port)), timeout
    self._sock: socket.socket | None = None

  def _open(self) -> socket.socket:
    if self._sock is None:
      try:
        self._sock = socket.create_connection(self._target, timeout=self._timeout)
      except OSError as error:
        raise ConnectionError(f"weight channel: learner host {self.address} is unreachable "
                              f"({error}); is the learner running and sampler.weights_addresses "
                              "right?") from error
      self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return self._sock

  def call(self, request: dict) -> dict:
    """Sends a request and reads its JSON reply. A kept-open connection the learner
    has since closed (idle timeout, restart) is reopened once."""
    reused = self._sock is not None
    try:
      return self._exchange(request)
    except ConnectionError:
      if not reused:
        raise
      return self._exchange(request)

  def _exchange(self, request: dict) -> dict:
    sock = self._open()
    try:
      _send_json(sock, request)
      return _recv_json(sock)
    except TimeoutError as error:
      self.close()
      raise TimeoutError(f"weight channel: learner host {self.address} did not answer "
                         f"{request} within {self._timeout} s") from error
    except OSError as error:
      self.close()
      raise ConnectionError(f"weight channel: learner host {self.address} dropped the "
                            f"connection ({error})") from error

  def recv_frame_into(self, buffer: np.ndarray) -> None:
    """Reads one frame of exactly `buffer.nbytes` bytes into `buffer` (uint8)."""
    sock = self._open()
    try:
      length = _recv_length(sock)
      if length != buffer.nbytes:
        raise ConnectionError(f"a frame of {length} bytes where {buffer.nbytes} were announced")
      _recv_into(sock, memoryview(buffer))
    except TimeoutError as error:
      raise TimeoutError(f"weight channel: learner host {self.address} stalled for "
                         f"{self._timeout} s mid-transfer") from error
    except OSError as error:
      raise ConnectionError(f"weight channel: transfer from learner host {self.address} "
                            f"failed ({error})") from error

  def close(self) -> None:
    if self._sock is not None:
      self._sock.close()
      self._sock = None


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
    self._spec = spec
    self._leaves = _describe(spec.template)
    self._dtypes = [np.dtype(leaf.dtype) for leaf in jax.tree.leaves(spec.template)]
    self._treedef = jax.tree.structure(spec.template)
    self._connections = [_Connection(a, spec.timeout) for a in spec.addresses]
    self.version = -1

  def _check_hosts(self, replies: list[dict]) -> None:
    for connection, reply in zip(self._connections, replies):
      if reply.get("protocol") != PROTOCOL:
        raise ValueError(f"weight channel: {connection.address} speaks protocol "
                         f"{reply.get('protocol')}, this sampler {PROTOCOL}; run the same sao_jax")
    indices = sorted(r["process_index"] for r in replies)
    counts = {r["process_count"] for r in replies}
    if counts != {len(replies)} or indices != list(range(len(replies))):
      seen = {c.address: (r["process_index"], r["process_count"])
              for c, r in zip(self._connections, replies)}
      raise ValueError(f"weight channel: the addresses {list(self._spec.addresses)} are not "
                       f"every host of one learner exactly once (host: (process index, process "
                       f"count) = {seen}); list every learner host in sampler.weights_addresses")

  def poll(self) -> tuple[Any, int] | None:
    replies = [c.call({"op": "versions"}) for c in self._connections]
    self._check_hosts(replies)
    version = choose_version([r["versions"] for r in replies], self.version)
    if version is None:
      return None
    leaves = self._fetch(version)
    if leaves is None:
      return None
    self.version = version
    return jax.tree.unflatten(self._treedef, leaves), version

  def _fetch(self, version: int) -> list[np.ndarray] | None:
    """Every leaf of `version` assembled on host; None if a host no longer holds it."""
    leaves = [np.empty(m["shape"], dtype) for m, dtype in zip(self._leaves, self._dtypes)]
    covered: list[dict[tuple, int]] = [{} for _ in leaves]  # distinct shard index -> size
    for connection in self._connections:
      header = connection.call({"op": "get", "version": version})
      if "error" in header:
        return None
      difference = _first_difference(header["leaves"], self._leaves)
      if difference:
        raise ValueError(f"weight channel: learner host {connection.address} serves {difference}; "
                         "the learner and sampler must use the same model config")
      try:
        for entry in header["shards"]:
          self._receive(connection, entry, leaves, covered, version)
      except BaseException:
        connection.close()  # the stream position is lost; reconnect next time
        raise
    for meta, leaf, shards in zip(self._leaves, leaves, covered):
      if sum(shards.values()) != leaf.size:
        raise ValueError(f"weight channel: version {version} leaf {meta['path']}: the learner "
                         f"hosts served {sum(shards.values())} of its {leaf.size} elements; "
                         "is every learner host in sampler.weights_addresses?")
    return leaves

  def _receive(self, connection: _Connection, entry: dict, leaves: list[np.ndarray],
               covered: list[dict[tuple, int]], version: int) -> None:
    leaf_id = entry["leaf"]
    leaf, path = leaves[leaf_id], self._leaves[leaf_id]["path"]
    key = tuple(map(tuple, entry["index"]))
    shape = tuple(stop - start for start, stop in key)
    if entry["nbytes"] != math.prod(shape) * leaf.itemsize:
      raise ValueError(f"weight channel: {connection.address} announced {entry['nbytes']} bytes "
                       f"for leaf {path} shard {key} of shape {shape}")
    whole = shape == leaf.shape and key not in covered[leaf_id]
    buffer = leaf.reshape(-1).view(np.uint8) if whole else np.empty(entry["nbytes"], np.uint8)
    connection.recv_frame_into(buffer)
    crc = zlib.crc32(buffer)
    if crc != entry["crc32"]:
      raise WeightChecksumError(
          f"weight channel: version {version} leaf {path} shard {key} from learner host "
          f"{connection.address} has crc32 {crc:#010x}, the publisher computed "
          f"{entry['crc32']:#010x}; keeping version {self.version}")
    if key not in covered[leaf_id]:
      if not whole:
        leaf[tuple(slice(start, stop) for start, stop in key)] = (
            buffer.view(leaf.dtype).reshape(shape))
      covered[leaf_id][key] = math.prod(shape)

  def close(self) -> None:
    for connection in self._connections:
      connection.close()
