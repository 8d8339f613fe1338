"""The network weight channel's wire: bounded frames, a shared-secret handshake, signed headers.

Everything a peer sends is untrusted until it proves the secret, and bounded
after: a frame is an 8-byte big-endian length and a payload, and every reader
names the most it accepts *before* allocating (`recv_frame(sock, max_bytes)`);
JSON goes through `bounded_json` (size and depth capped, no recursion).

Handshake (both sides prove the secret `K`, neither sends it; nonces are 32
fresh random bytes from `secrets`, so a recorded exchange cannot be replayed):
  subscriber -> {"op": "hello", "protocol", "nonce": hex(Nc)}
  publisher  -> {"protocol", "nonce": hex(Ns), "proof": hex(HMAC(K, "publisher" | Nc | Ns))}
  subscriber -> {"op": "auth", "proof": hex(HMAC(K, "subscriber" | Nc | Ns))}
  publisher  -> {"authenticated": true}
Proofs are compared with `hmac.compare_digest`. The publisher serves nothing
before the last step; the subscriber trusts nothing before the second.

After the handshake a relay that passed it through to the real learner still
sits between the two, so every reply that decides what a sampler adopts is
signed for the request it answers: each `versions` and `get` request carries a
fresh 32-byte nonce N, and its reply is followed by a 32-byte frame
HMAC(K, label | N | reply bytes) (`sign_reply`; label "versions" or "header").
A reply recorded earlier (a retired version's header, an old list of versions)
does not check against a new nonce, so a relay can neither forge nor replay
one. A header names the learner's `run` (random, fixed when the publisher is
made) and its version, and lists for each shard the SHA-256 of every
`DIGEST_CHUNK_BYTES` chunk of its bytes (`chunk_digests`): the shard bytes are
authenticated through the signed header (before, a crc32 there let a relay
rewrite a shard keeping its crc32). What a relay can still do is stall or cut
the connection: a wait for the sampler (`sampler.worker`), never other weights.

Every violation raises `PeerError` with a short `reason`, which each side
counts in its `stats` (`count_error`, logged at 1, 2, 4, 8, ... occurrences so
a hostile peer cannot flood the log, with what the peer sent escaped).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import struct
import time
from typing import Any, Callable

import jax
import numpy as np

from sao_jax import bounded_json
from sao_jax.log_text import logged_at, untrusted

PROTOCOL = 3  # 3: nonce-signed replies, SHA-256 chunk digests, the learner's run
LENGTH = struct.Struct("!Q")
MAC_BYTES = hashlib.sha256().digest_size
MAX_REQUEST_BYTES = 512  # the largest request a subscriber sends (the auth step: ~100 bytes)
MAX_REPLY_BYTES = 1 << 16  # handshake, versions and error replies
MAX_JSON_DEPTH = 6  # a header: {"shards": [{"index": [[start, stop]]}]}
HANDSHAKE_SECONDS = 5.0  # the whole handshake, however the peer drips its bytes
NONCE_BYTES = 32
# A shard's bytes are digested per chunk of this size: chunks hash in parallel, and
# a subscriber hashes each one while it receives the next.
DIGEST_CHUNK_BYTES = 4 << 20

log = logging.getLogger(__name__)


class PeerError(Exception):
  """A peer that broke the protocol or failed to prove the secret; `reason` is a counter key."""

  def __init__(self, reason: str, message: str):
    super().__init__(message)
    self.reason = reason


def count_error(stats: collections.Counter, error: PeerError, peer: str) -> None:
  """Counts `error` under its reason; logs the 1st, 2nd, 4th, 8th, ... of each reason,
  its message escaped (`log_text.untrusted`): it quotes what the peer sent."""
  stats[error.reason] += 1
  count = stats[error.reason]
  if logged_at(count):
    log.warning("weight channel: %s: %s (%s #%d)", peer, untrusted(error, 500), error.reason,
                count)


def _mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
  return hmac.new(secret, b"|".join((label,) + parts), hashlib.sha256).digest()


def sign_reply(secret: bytes, label: bytes, nonce: bytes, reply: bytes) -> bytes:
  """The MAC frame that follows `reply` to the request that carried `nonce`."""
  return _mac(secret, label, nonce, reply)


def check_reply(secret: bytes, label: bytes, nonce: bytes, reply: bytes,
                mac: bytes | None) -> None:
  if mac is None or len(mac) != MAC_BYTES or not hmac.compare_digest(
      sign_reply(secret, label, nonce, reply), mac):
    raise PeerError("bad_mac", f"a {label.decode()} reply the learner did not sign for this "
                               "request (a forgery, a replay of an earlier reply, or the wrong "
                               "secret)")


def chunk_count(nbytes: int) -> int:
  """How many digests a shard of `nbytes` bytes has (an empty one: one, of no bytes)."""
  return max(1, -(-nbytes // DIGEST_CHUNK_BYTES))


def chunk_digests(payload: np.ndarray, pool=None) -> list[bytes]:
  """SHA-256 of each `DIGEST_CHUNK_BYTES` chunk of `payload` (uint8, 1-D), on `pool` (a
  concurrent.futures executor; hashlib releases the GIL) when given."""
  chunks = [payload[i * DIGEST_CHUNK_BYTES:(i + 1) * DIGEST_CHUNK_BYTES]
            for i in range(chunk_count(payload.nbytes))]
  digest = lambda chunk: hashlib.sha256(chunk).digest()
  return list(pool.map(digest, chunks)) if pool is not None else [digest(c) for c in chunks]


def new_nonce() -> bytes:
  return secrets.token_bytes(NONCE_BYTES)


def request_nonce(request: dict) -> bytes:
  """The nonce of a subscriber's request (hex); PeerError without one."""
  return _hex(request, "nonce", NONCE_BYTES, "request")


def recv_exact(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
  """Fills `view`; with `deadline` (time.monotonic) the whole read must end by then."""
  while view.nbytes:
    if deadline is not None:
      sock.settimeout(max(deadline - time.monotonic(), 1e-3))
    received = sock.recv_into(view)
    if not received:
      raise ConnectionError("the peer closed the connection mid-message")
    view = view[received:]


def recv_frame(sock: socket.socket, max_bytes: int, deadline: float | None = None) -> bytes | None:
  """One frame's payload; None if the peer closed between frames. PeerError('oversized')
  for a frame longer than `max_bytes`, before anything of its size is allocated."""
  header = bytearray(LENGTH.size)
  if deadline is not None:
    sock.settimeout(max(deadline - time.monotonic(), 1e-3))
  first = sock.recv_into(header)
  if not first:
    return None
  recv_exact(sock, memoryview(header)[first:], deadline)
  length = LENGTH.unpack(header)[0]
  if length > max_bytes:
    raise PeerError("oversized", f"a frame of {length} bytes where at most {max_bytes} can come")
  payload = bytearray(length)
  recv_exact(sock, memoryview(payload), deadline)
  return bytes(payload)


def parse(payload: bytes | None, max_bytes: int, what: str) -> dict:
  """A JSON object from a frame payload (None: the peer closed)."""
  if payload is None:
    raise ConnectionError(f"the peer closed the connection instead of sending {what}")
  try:
    message = bounded_json.loads(payload, max_bytes=max_bytes, max_depth=MAX_JSON_DEPTH, what=what)
  except ValueError as error:
    raise PeerError("bad_frame", str(error)) from None
  if not isinstance(message, dict):
    raise PeerError("bad_frame", f"{what}: expected a JSON object, got {str(message)[:80]}")
  return message


def field(message: dict, key: str, kind: type, what: str) -> Any:
  """message[key], which must be a `kind` (never a bool); PeerError otherwise."""
  value = message.get(key)
  if isinstance(value, bool) or not isinstance(value, kind):
    raise PeerError("bad_frame", f"{what}: {key!r} is {str(value)[:60]}, not {kind}")
  return value


def send_json(sock: socket.socket, message: dict) -> None:
  payload = json.dumps(message).encode()
  sock.sendall(LENGTH.pack(len(payload)) + payload)


def _hex(message: dict, key: str, size: int, what: str) -> bytes:
  text = field(message, key, str, what)
  try:
    value = bytes.fromhex(text)
  except ValueError:
    value = b""
  if len(value) != size:
    raise PeerError("bad_frame", f"{what}: {key!r} is not {size} hex-encoded bytes")
  return value


def server_handshake(sock: socket.socket, secret: bytes, admit: Callable[[], None]) -> None:
  """The publisher's side; returns once the subscriber proved the secret. `admit()` runs
  between the proof and telling the subscriber it passed, so a subscriber that was told
  is already admitted; it raises PeerError to turn the subscriber away instead."""
  deadline = time.monotonic() + HANDSHAKE_SECONDS
  hello = parse(recv_frame(sock, MAX_REQUEST_BYTES, deadline), MAX_REQUEST_BYTES, "hello")
  if hello.get("op") != "hello" or hello.get("protocol") != PROTOCOL:
    send_json(sock, {"protocol": PROTOCOL, "error": f"expected a protocol {PROTOCOL} hello"})
    raise PeerError("bad_hello", f"a request before the handshake: {str(hello)[:80]}")
  client_nonce = _hex(hello, "nonce", NONCE_BYTES, "hello")
  nonce = secrets.token_bytes(NONCE_BYTES)
  send_json(sock, {"protocol": PROTOCOL, "nonce": nonce.hex(),
                   "proof": _mac(secret, b"publisher", client_nonce, nonce).hex()})
  auth = parse(recv_frame(sock, MAX_REQUEST_BYTES, deadline), MAX_REQUEST_BYTES, "auth")
  proof = _hex(auth, "proof", MAC_BYTES, "auth")
  if auth.get("op") != "auth" or not hmac.compare_digest(
      proof, _mac(secret, b"subscriber", client_nonce, nonce)):
    raise PeerError("auth_failed", "the subscriber did not prove the shared secret")
  admit()
  send_json(sock, {"authenticated": True})


def client_handshake(sock: socket.socket, secret: bytes, timeout: float) -> None:
  """The subscriber's side; returns once the publisher proved the secret."""
  deadline = time.monotonic() + timeout
  nonce = secrets.token_bytes(NONCE_BYTES)
  send_json(sock, {"op": "hello", "protocol": PROTOCOL, "nonce": nonce.hex()})
  reply = parse(recv_frame(sock, MAX_REPLY_BYTES, deadline), MAX_REPLY_BYTES, "hello reply")
  if reply.get("protocol") != PROTOCOL:
    raise PeerError("protocol", f"the peer speaks protocol {str(reply.get('protocol'))[:20]}, "
                                f"this sampler {PROTOCOL}; run the same sao_jax on both sides")
  server_nonce = _hex(reply, "nonce", NONCE_BYTES, "hello reply")
  proof = _hex(reply, "proof", MAC_BYTES, "hello reply")
  if not hmac.compare_digest(proof, _mac(secret, b"publisher", nonce, server_nonce)):
    raise PeerError("auth_failed", "the peer did not prove the shared secret: not the learner, "
                                   "or the two sides hold different sampler.weights_secret_*")
  send_json(sock, {"op": "auth", "proof": _mac(secret, b"subscriber", nonce, server_nonce).hex()})
  done = parse(recv_frame(sock, MAX_REPLY_BYTES, deadline), MAX_REPLY_BYTES, "auth reply")
  if done.get("authenticated") is not True:
    raise PeerError("auth_failed", f"the learner refused this sampler's proof: {str(done)[:80]}")


def is_loopback(host: str) -> bool:
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return host == "localhost"


def shard_entry(entry: Any, leaves: list[dict]) -> tuple[int, tuple, int, list[bytes]]:
  """(leaf id, index ((start, stop), ...), nbytes, chunk SHA-256s) of a header entry,
  checked against the leaf of `leaves` ({path, shape, dtype}) it names."""
  if not isinstance(entry, dict):
    raise PeerError("bad_frame", f"header: a shard entry {str(entry)[:60]}")
  leaf_id = field(entry, "leaf", int, "shard entry")
  if not 0 <= leaf_id < len(leaves):
    raise PeerError("bad_frame", f"header: a shard of leaf {leaf_id} of {len(leaves)}")
  shape = leaves[leaf_id]["shape"]
  index = field(entry, "index", list, "shard entry")
  try:
    key = tuple((int(start), int(stop)) for start, stop in index)
  except (TypeError, ValueError):
    key = None
  if (key is None or len(key) != len(shape)
      or not all(0 <= start <= stop <= dim for (start, stop), dim in zip(key, shape))):
    raise PeerError("bad_frame", f"header: index {str(index)[:60]} outside leaf "
                                 f"{leaves[leaf_id]['path']} {tuple(shape)}")
  nbytes = field(entry, "nbytes", int, "shard entry")
  digests = field(entry, "sha256", list, "shard entry")
  if nbytes < 0 or len(digests) != chunk_count(nbytes):
    raise PeerError("bad_frame", f"header: {len(digests)} digests for a shard of {nbytes} bytes")
  try:
    digests = [bytes.fromhex(d) for d in digests]
  except (TypeError, ValueError):
    digests = []
  if len(digests) != chunk_count(nbytes) or any(len(d) != MAC_BYTES for d in digests):
    raise PeerError("bad_frame", "header: a shard's digests are not SHA-256 hex")
  return leaf_id, key, nbytes, digests


class Connection:
  """A subscriber's persistent, authenticated connection to one learner host, reopened
  after any failure. Every failure closes it and names the host: ConnectionError or
  TimeoutError for the network, PeerError for what the host sent."""

  def __init__(self, address: str, timeout: float, secret: bytes):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
      raise ValueError(f"weight channel address {address!r} is not host:port")
    self.address, self._target, self._timeout = address, (host, int(port)), timeout
    self._secret = secret
    self._sock: socket.socket | None = None

  def _open(self) -> socket.socket:
    if self._sock is None:
      try:
        sock = socket.create_connection(self._target, timeout=self._timeout)
      except OSError as error:
        raise ConnectionError(f"weight channel: learner host {self.address} is unreachable "
                              f"({error}); is the learner running and sampler.weights_addresses "
                              "right?") from error
      sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      self._sock = sock
      self._guard(lambda: client_handshake(sock, self._secret, self._timeout), "the handshake")
      sock.settimeout(self._timeout)
    return self._sock

  def _guard(self, action, what: str):
    """`action()`; on any failure closes the connection and names the host and `what`."""
    try:
      return action()
    except PeerError as error:
      self.close()
      raise PeerError(error.reason, f"learner host {self.address}, {what}: {error}") from None
    except TimeoutError as error:
      self.close()
      raise TimeoutError(f"weight channel: learner host {self.address} stalled for "
                         f"{self._timeout} s in {what}") from error
    except OSError as error:
      self.close()
      raise ConnectionError(f"weight channel: learner host {self.address} dropped the "
                            f"connection in {what} ({error})") from error

  def versions(self) -> dict:
    """The learner host's signed {"protocol", "run", "process_index", "process_count",
    "versions"}. A kept-open connection the learner has since closed (idle timeout,
    restart) is reopened once."""
    reused = self._sock is not None
    try:
      return self._versions()
    except ConnectionError:
      if not reused:
        raise
      return self._versions()

  def _versions(self) -> dict:
    sock = self._open()

    def exchange():
      nonce = new_nonce()
      send_json(sock, {"op": "versions", "nonce": nonce.hex()})
      raw = recv_frame(sock, MAX_REPLY_BYTES)
      reply = parse(raw, MAX_REPLY_BYTES, "versions reply")
      check_reply(self._secret, b"versions", nonce, raw, recv_frame(sock, MAC_BYTES))
      return reply
    return self._guard(exchange, "the reply to {'op': 'versions'}")

  def get_header(self, version: int, max_bytes: int) -> dict:
    """Requests `version`: its header, once its signature for this request checks out (at
    most `max_bytes`), or the publisher's {"error": ...} when it no longer holds it."""
    sock = self._open()

    def get():
      nonce = new_nonce()
      send_json(sock, {"op": "get", "version": version, "nonce": nonce.hex()})
      raw = recv_frame(sock, max_bytes)
      header = parse(raw, max_bytes, "header")
      if "error" not in header:
        check_reply(self._secret, b"header", nonce, raw, recv_frame(sock, MAC_BYTES))
      return header
    return self._guard(get, f"the header of version {version}")

  def recv_frame_into(self, buffer: Any) -> None:
    """Reads one frame of exactly `buffer.nbytes` bytes into `buffer` (uint8 numpy)."""
    sock = self._open()

    def receive():
      length = bytearray(LENGTH.size)
      recv_exact(sock, memoryview(length))
      if LENGTH.unpack(length)[0] != buffer.nbytes:
        raise PeerError("bad_frame", f"a frame of {LENGTH.unpack(length)[0]} bytes where "
                                     f"{buffer.nbytes} were announced")
      recv_exact(sock, memoryview(buffer))
    self._guard(receive, "a transfer")

  def close(self) -> None:
    if self._sock is not None:
      self._sock.close()
      self._sock = None


def describe_leaves(tree: Any) -> list[dict]:
  """[{path, shape, dtype}] of every leaf, in `jax.tree.leaves` order: how a header names
  the model, so a subscriber refuses a learner that serves another one."""
  return [{"path": jax.tree_util.keystr(path), "shape": list(np.shape(leaf)),
           "dtype": np.dtype(leaf.dtype).name}
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def first_leaf_difference(got: list[dict], want: list[dict]) -> str | None:
  """Why a header's leaf descriptions `got` are not `want` (None: they match)."""
  if len(got) != len(want):
    return f"{len(got)} leaves instead of {len(want)}"
  for g, w in zip(got, want):
    if not isinstance(g, dict) or g.keys() != w.keys():
      return f"a leaf described as {str(g)[:80]} where {w['path']} is expected"
    if g != w:
      return f"leaf {g['path']} {tuple(g['shape'])} {g['dtype']} where {w['path']} " \
             f"{tuple(w['shape'])} {w['dtype']} is expected"
  return None
