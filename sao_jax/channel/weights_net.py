"""`NetworkWeights`: policy weights from learner hosts to sampler hosts over TCP, the
publisher side (the subscriber: `sao_jax.channel.weights_fetch`).

For a learner and samplers that are different JAX clusters (different TPU
slices): multi-controller JAX cannot `device_put` between disjoint meshes, so
weights travel host to host.

Publisher, one per learner host: `publish(params, version)` copies this host's
addressable shards of every leaf to host memory (`jax.Array.addressable_shards`,
only `replica_id == 0`, so across all hosts each distinct shard is served
exactly once), computes the SHA-256 of every chunk of every shard (on a few
threads), builds the header that lists them, and makes the snapshot the newest
of the `keep` versions it serves; each header is signed when a subscriber asks
for it, for that request (`weights_wire`). A thread per connection sends
snapshots; a transfer holds a reference to its snapshot, so `publish` (which
only swaps references under a lock) never waits for a sampler and never
changes bytes that are being sent. It listens
on one interface (`host`, loopback unless samplers on other hosts need this
host's own address), serves at most `max_connections` subscribers at once,
only after they prove the shared secret (`weights_wire` handshake, within a
few seconds), reads requests of at most a few hundred bytes, and disconnects a
subscriber that sends no request for `_IDLE_SECONDS` or stops reading for
`timeout` seconds. Each misbehaving connection is counted in `stats`.

Unauthenticated peers cannot lock subscribers out: connections still in their
handshake are held apart from authenticated ones, at most `max_connections` of
them, and a new connection at that cap cuts the oldest pending one of the peer
host that holds the most (`handshake_evicted`) instead of being turned away.
Holding every slot for the handshake's few seconds, restarting as each times
out, thus takes no slot from a subscriber, and a host that opens connections
faster than a subscriber's handshake cuts only its own: only a flood from the
subscriber's own host, or spread over so many hosts that none holds more pending
handshakes than that host, can cut it (a network-level attack: keep the channel
on a private network). A subscriber leaves the pending handshakes when its
proof checks out, before it is told so, so a flood can never cut one that was
told it passed; one that proves the secret while `max_connections` others are
served is refused (`too_many_connections`). The listen queue holds
`2 * max_connections` connections, so a burst of that many waits to be accepted
instead of losing seconds to retransmits.

Wire protocol (frames, handshake and signatures: `weights_wire`), after the handshake;
N is the request's fresh nonce (hex), `run` the learner's (random, the same on
every learner host, new for every publisher):
  {"op": "versions", "nonce": N}
      -> {"protocol", "run", "process_index", "process_count", "versions"}, then its
         32-byte signature frame HMAC(K, "versions" | N | reply)
  {"op": "get", "version": v, "nonce": N}
      -> a header frame, its signature frame HMAC(K, "header" | N | header), then one
         frame of raw bytes per shard:
     {"protocol", "run", "version", "process_index", "process_count",
      "leaves": [{"path", "shape", "dtype"}, ...],
      "shards": [{"leaf", "index": [[start, stop], ...], "nbytes",
                  "sha256": [hex per DIGEST_CHUNK_BYTES chunk]}, ...]}
     or {"error": ...} when v is no longer held (the next poll takes a newer one).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import secrets
import socket
import socketserver
import threading
import time
from typing import Any

import jax
import numpy as np

from sao_jax.channel import run_secret
from sao_jax.channel import weights_wire as wire
from sao_jax.channel.weights_fetch import NetworkSpec
from sao_jax.channel.weights_wire import LENGTH, PROTOCOL, PeerError
from sao_jax.config.sampler import SamplerConfig

_IDLE_SECONDS = 60.0  # an authenticated subscriber with no request for this long is closed
_HASH_THREADS = min(8, os.cpu_count() or 1)  # hashlib releases the GIL on large buffers


@dataclasses.dataclass(frozen=True)
class _Snapshot:
  header: bytes  # the JSON header (signed per request)
  payloads: tuple[np.ndarray, ...]  # uint8, one per header shard entry


def _run_id() -> str:
  """A new publisher's run: random, the first learner host's on every host. All hosts
  call it."""
  run = secrets.token_bytes(16)
  if jax.process_count() > 1:
    from sao_jax.sharding import distributed
    run = distributed.from_first_host(run)
  return run.hex()


def _snapshot(params: Any, version: int, leaves: list[dict], process: dict,
              pool: concurrent.futures.Executor) -> _Snapshot:
  """This host's shards of `params` copied to host memory, with their chunk digests."""
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
  # A copy: the learner donates its state.
  payloads = [np.array(data).reshape(-1).view(np.uint8) for _, _, data in pieces]
  digests = [pool.submit(wire.chunk_digests, payload) for payload in payloads]
  entries = [{"leaf": leaf_id, "index": index, "nbytes": payload.nbytes,
              "sha256": [d.hex() for d in digest.result()]}
             for (leaf_id, index, _), payload, digest in zip(pieces, payloads, digests)]
  header = json.dumps({"protocol": PROTOCOL, "version": version, **process,
                       "leaves": leaves, "shards": entries}).encode()
  return _Snapshot(header, tuple(payloads))


class _Server(socketserver.ThreadingTCPServer):
  daemon_threads = True
  allow_reuse_address = True
  block_on_close = False

  def __init__(self, address: tuple[str, int], max_connections: int):
    # The listen queue holds as many connections as are served at once (subscribers and
    # handshakes), so every sampler reconnecting at once waits to be accepted; a connect
    # past the queue is dropped and retried after 1 s, 3 s, 7 s, ... (the socketserver
    # default of 5 did that to bursts). No longer: under a flood, a connect queued
    # behind it waits for all of it to be accepted.
    self.request_queue_size = 2 * max_connections
    super().__init__(address, _Handler)

  def verify_request(self, request, client_address) -> bool:
    """Admits every connection to the handshake; at `max_connections` pending
    handshakes one is cut, the oldest of the busiest peer host (module docstring)."""
    channel: NetworkWeights = self.channel
    with channel._lock:
      if len(channel._pending) >= channel.max_connections:
        victim = _oldest_of_busiest_host(channel._pending)
        peer = channel._pending.pop(victim)
        channel._evicted.add(victim)
        _cut(victim)
        channel._count(PeerError("handshake_evicted", "a newer connection needed the slot of "
                                 "this unfinished handshake"), peer)
      channel._pending[request] = client_address
    return True


def _oldest_of_busiest_host(pending: collections.OrderedDict) -> socket.socket:
  """The oldest of the `pending` handshakes (oldest first, each with its peer's address)
  from the peer host that holds the most of them: a host that floods the cap cuts its
  own connections, not a sampler's on another host (ties: the oldest of all)."""
  per_host = collections.Counter(peer[0] for peer in pending.values())
  most = max(per_host.values())
  return next(sock for sock, peer in pending.items() if per_host[peer[0]] == most)


def _cut(sock: socket.socket) -> None:
  """Ends `sock` for both sides; its handler's next read sees the close."""
  try:
    sock.shutdown(socket.SHUT_RDWR)
  except OSError:
    pass  # already closed by the peer


class _Handler(socketserver.BaseRequestHandler):
  """One subscriber connection: handshake, then requests until it closes, idles or stalls."""

  def handle(self) -> None:
    channel: NetworkWeights = self.server.channel
    sock = self.request
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def admit() -> None:
      """Moves `sock` from the pending handshakes to the subscribers, under one lock
      hold and before the subscriber is told it passed: a flood can no longer cut it."""
      with channel._lock:
        if channel._pending.pop(sock, None) is None:  # cut meanwhile, and counted then
          raise PeerError("handshake_evicted", "cut while its proof was being checked")
        if len(channel._connections) >= channel.max_connections:
          raise PeerError("too_many_connections", f"more than {channel.max_connections} "
                          "subscribers at once (sampler.weights_max_connections)")
        channel._connections.add(sock)

    try:
      wire.server_handshake(sock, channel._secret, admit)
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
    except (PeerError, OSError) as error:  # TimeoutError: no handshake or request in time
      with channel._lock:
        evicted = sock in channel._evicted
      if not evicted:  # an evicted handshake was counted when it was cut
        if isinstance(error, TimeoutError):
          error = PeerError("timeout", "no complete handshake or request in time")
        elif not isinstance(error, PeerError):  # reset, or closed mid-message
          error = PeerError("disconnected", str(error))
        channel._count(error, self.client_address)
    finally:
      with channel._lock:
        channel._connections.discard(sock)
        channel._pending.pop(sock, None)
        channel._evicted.discard(sock)


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
                         f"`{run_secret.CREATE_HINT}`) or "
                         "sampler.weights_secret_env")
      secret = secrets.token_bytes(32)
    run_secret.check_secret(secret, "the weight channel's secret")
    self._secret, self.max_connections = secret, max_connections
    self._leaves = wire.describe_leaves(template)
    self._snapshots: dict[int, _Snapshot] = {}
    self._lock = threading.Lock()
    self._connections: set[socket.socket] = set()  # authenticated subscribers
    # Connections in their handshake, oldest first, and their peers' addresses.
    self._pending: collections.OrderedDict[socket.socket, tuple] = collections.OrderedDict()
    self._evicted: set[socket.socket] = set()  # cut handshakes whose handlers still run
    self.stats: collections.Counter = collections.Counter()  # connection errors by reason
    self._stats_lock = threading.Lock()
    self._keep, self.timeout = keep, timeout
    # Read once here: server threads must not touch the JAX runtime.
    self.run = _run_id()
    self._process = {"run": self.run, "process_index": jax.process_index(),
                     "process_count": jax.process_count()}
    self._pool = concurrent.futures.ThreadPoolExecutor(_HASH_THREADS, "sao-weights-digest")
    try:
      self._server = _Server((host, port), max_connections)
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
    difference = wire.first_leaf_difference(wire.describe_leaves(params), self._leaves)
    if difference:
      raise ValueError(f"publish: params have {difference}; build a new channel for a new model")
    snapshot = _snapshot(params, version, self._leaves, self._process, self._pool)
    with self._lock:
      self._snapshots[version] = snapshot
      while len(self._snapshots) > self._keep:
        del self._snapshots[min(self._snapshots)]

  def _answer(self, sock: socket.socket, request: dict) -> None:
    op = request.get("op")
    get = op == "get" and type(request.get("version")) is int  # else an unknown request
    if op in ("versions", "get"):
      try:
        nonce = wire.request_nonce(request)
      except PeerError:
        nonce, op, get = None, None, False  # answered as an unknown request
    with self._lock:
      versions = sorted(self._snapshots)
      snapshot = self._snapshots.get(request["version"]) if get else None
    if op == "versions":
      reply = json.dumps({"protocol": PROTOCOL, **self._process, "versions": versions}).encode()
      self._send_signed(sock, b"versions", nonce, reply)
    elif get and snapshot is not None:
      self._send_signed(sock, b"header", nonce, snapshot.header)
      for payload in snapshot.payloads:
        sock.sendall(LENGTH.pack(payload.nbytes))
        sock.sendall(payload)
    elif get:
      wire.send_json(sock, {"error": f"version {request.get('version')!r} is not held "
                                     f"(holding {versions})"})
    else:
      wire.send_json(sock, {"error": f"unknown request {str(request)[:100]}"})
      raise PeerError("bad_request", f"unknown request {str(request)[:100]}")

  def _send_signed(self, sock: socket.socket, label: bytes, nonce: bytes, reply: bytes) -> None:
    mac = wire.sign_reply(self._secret, label, nonce, reply)
    sock.sendall(LENGTH.pack(len(reply)) + reply + LENGTH.pack(len(mac)) + mac)

  def close(self) -> None:
    """Stops serving and disconnects every subscriber."""
    self._server.shutdown()
    self._server.server_close()
    self._pool.shutdown(wait=False)
    with self._lock:
      connections = [*self._connections, *self._pending]
    for sock in connections:
      _cut(sock)


def from_config(cfg: SamplerConfig, template: Any) -> NetworkWeights:
  """The publisher of `cfg` (weights='network'): on loopback for same-host samplers, or,
  with `weights_addresses`, on this learner host's own entry of them (its process index)."""
  host = "127.0.0.1"
  if cfg.weights_addresses:
    host = cfg.weights_addresses[jax.process_index()].rpartition(":")[0]
  return NetworkWeights(template, host=host, port=cfg.weights_port,
                        addresses=cfg.weights_addresses, secret=run_secret.load_secret(cfg),
                        max_connections=cfg.weights_max_connections)
