"""Shard bytes are authenticated and versions are fresh (#42 item 3), against a relay
that passes the shared-secret handshake through to the real learner and then edits or
replays what the learner sends.

Before: the signed header carried each shard's crc32, so a relay rewriting a shard's
bytes while keeping its crc32 made a sampler adopt forged weights (666.0 under a valid
signature); and the `versions` reply was unsigned and a header's signature was the same
at every request, so a relay could replay a retired, validly signed version and pin a
sampler on version 1 while the learner held 3. Now each shard chunk's SHA-256 is in the
header, and every reply is signed for the nonce of the request it answers."""

import json
import socket
import threading
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.channel import weights_fetch, weights_net, weights_wire
from sao_jax.channel.weights_wire import LENGTH

SECRET = bytes(range(32))
FORGED = 666.0


def params(seed: int):
  keys = jax.random.split(jax.random.key(seed), 2)
  return {"embed": jax.random.normal(keys[0], (16, 8), jnp.float32),
          "w": jax.random.normal(keys[1], (8, 4), jnp.float32)}


def frame(payload: bytes) -> bytes:
  return LENGTH.pack(len(payload)) + payload


def recv(sock: socket.socket) -> bytes:
  return weights_wire.recv_frame(sock, 1 << 24)


def crc32_preserving(data: bytes, value_at: int, value: bytes, fix_at: int) -> bytes:
  """`data` with `value` written at byte `value_at` and the 4 bytes at `fix_at` chosen so
  that its crc32 is unchanged. crc32 is affine over GF(2): the crc of a change is linear
  in the changed bits, so the 32 bits at `fix_at` that cancel the change solve a 32x32
  linear system."""
  target = zlib.crc32(data)
  edited = bytearray(data)
  edited[value_at:value_at + len(value)] = value
  zero = zlib.crc32(bytes(len(data)))

  def effect(bits: int) -> int:  # the crc change of xoring `bits` into the 4 bytes at fix_at
    delta = bytearray(len(data))
    delta[fix_at:fix_at + 4] = bits.to_bytes(4, "little")
    return zlib.crc32(bytes(delta)) ^ zero
  need = zlib.crc32(bytes(edited)) ^ target
  # Gaussian elimination: rows (effect, bits) reduced to one pivot per effect bit.
  rows = [(effect(1 << i), 1 << i) for i in range(32)]
  solution, basis = 0, {}
  for row_effect, row_bits in rows:
    for pivot, (pivot_effect, pivot_bits) in basis.items():
      if row_effect >> pivot & 1:
        row_effect, row_bits = row_effect ^ pivot_effect, row_bits ^ pivot_bits
    if row_effect:
      pivot = row_effect.bit_length() - 1
      for other, (other_effect, other_bits) in list(basis.items()):
        if other_effect >> pivot & 1:
          basis[other] = (other_effect ^ row_effect, other_bits ^ row_bits)
      basis[pivot] = (row_effect, row_bits)
  for pivot, (pivot_effect, pivot_bits) in basis.items():
    if need >> pivot & 1:
      solution ^= pivot_bits
  fix = int.from_bytes(edited[fix_at:fix_at + 4], "little") ^ solution
  edited[fix_at:fix_at + 4] = fix.to_bytes(4, "little")
  assert zlib.crc32(bytes(edited)) == target and bytes(edited) != data
  return bytes(edited)


class Relay:
  """A man in the middle with no secret: passes the handshake through to the learner,
  then answers each request with `answer(request, forward)`, a list of frame payloads;
  `forward()` sends the request on and returns the learner's reply frames."""

  def __init__(self, target: str, answer):
    self._target, self._answer = target, answer
    self._listener = socket.create_server(("127.0.0.1", 0))
    self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
    threading.Thread(target=self._serve, daemon=True).start()

  def _serve(self) -> None:
    while True:
      try:
        client, _ = self._listener.accept()
      except OSError:
        return
      threading.Thread(target=self._relay, args=(client,), daemon=True).start()

  def _relay(self, client: socket.socket) -> None:
    upstream = socket.create_connection(self._target.split(":"))
    try:
      with client, upstream:
        for source, target in [(client, upstream), (upstream, client)] * 2:  # the handshake
          target.sendall(frame(recv(source)))
        while (request := recv(client)) is not None:
          message = json.loads(request)

          def forward():
            upstream.sendall(frame(request))
            frames = [recv(upstream)]
            reply = json.loads(frames[0])
            signed = message["op"] == "get" or weights_wire.PROTOCOL >= 3
            if signed and "error" not in reply:
              frames.append(recv(upstream))
            if message["op"] == "get" and "error" not in reply:
              frames += [recv(upstream) for _ in reply["shards"]]
            return frames
          client.sendall(b"".join(frame(f) for f in self._answer(message, forward)))
    except OSError:
      pass

  def close(self) -> None:
    self._listener.close()


def subscriber_of(address: str):
  return weights_fetch.NetworkSubscriber(
      weights_fetch.NetworkSpec((address,), params(0), timeout=5, secret=SECRET))


@pytest.fixture
def publisher():
  channel = weights_net.NetworkWeights(params(0), secret=SECRET)
  yield channel
  channel.close()


def test_a_shard_rewritten_keeping_its_crc32_is_refused(publisher):
  def rewrite(message, forward):
    frames = forward()
    if message["op"] == "get":  # the first shard (embed) starts with 666.0, same crc32
      shard = frames[2]
      frames[2] = crc32_preserving(shard, 0, np.float32(FORGED).tobytes(), len(shard) - 4)
    return frames
  relay = Relay(publisher.address, rewrite)
  subscriber = subscriber_of(relay.address)
  try:
    publisher.publish(params(1), version=1)
    assert subscriber.poll() is None, "forged weights adopted"
    assert subscriber.stats == {"checksum": 1} and subscriber.version == -1
    direct = subscriber_of(publisher.address)  # the learner's own bytes still check
    tree, version = direct.poll()
    direct.close()
    assert version == 1 and float(np.asarray(tree["embed"]).reshape(-1)[0]) != FORGED
  finally:
    subscriber.close()
    relay.close()


def test_a_retired_version_replayed_cannot_pin_a_sampler(publisher):
  """The relay records the learner's replies while it holds version 1, then, once the
  learner holds 3, answers a sampler with them: the list of versions (1) and the signed
  version 1."""
  recorded: dict[str, list[bytes]] = {}
  replaying = threading.Event()

  def replay(message, forward):
    if not replaying.is_set():
      recorded[message["op"]] = forward()
      return recorded[message["op"]]
    return recorded[message["op"]]
  relay = Relay(publisher.address, replay)
  publisher.publish(params(1), version=1)
  recorder = subscriber_of(relay.address)
  assert recorder.poll()[1] == 1  # the relay now holds version 1's signed replies
  recorder.close()
  publisher.publish(params(2), version=2)
  publisher.publish(params(3), version=3)  # version 1 retired (keep=2)
  replaying.set()
  sampler = subscriber_of(relay.address)
  try:
    assert sampler.poll() is None, "pinned on a replayed version"
    assert sampler.version == -1 and sampler.stats == {"bad_mac": 1}
  finally:
    sampler.close()
    relay.close()


def test_a_replayed_header_in_place_of_the_asked_version_is_refused(publisher):
  """The relay passes the list of versions through (the sampler asks for 3) but answers
  with version 1's header and shards, recorded earlier."""
  recorded = {}

  def swap(message, forward):
    frames = forward()
    if message["op"] == "get" and message["version"] == 1:
      recorded["v1"] = frames
    if message["op"] == "get" and message["version"] == 3:
      return recorded["v1"]
    return frames
  relay = Relay(publisher.address, swap)
  publisher.publish(params(1), version=1)
  first = subscriber_of(relay.address)
  assert first.poll()[1] == 1
  first.close()
  publisher.publish(params(3), version=3)
  sampler = subscriber_of(relay.address)
  try:
    assert sampler.poll() is None and sampler.version == -1
    assert sampler.stats == {"bad_mac": 1}
  finally:
    sampler.close()
    relay.close()


def test_versions_never_go_back_within_a_run_and_a_restarted_learner_is_followed():
  """Within the learner's run a sampler adopts only newer versions; a restarted learner
  (a new run, on the same address) numbering from a checkpoint's lower step is followed."""
  first = weights_net.NetworkWeights(params(0), secret=SECRET)
  host, port = first.address.split(":")
  subscriber = subscriber_of(first.address)
  try:
    first.publish(params(5), version=5)
    assert subscriber.poll()[1] == 5
    run = subscriber.run
    first.close()
    restarted = weights_net.NetworkWeights(params(0), secret=SECRET, port=int(port))
    try:
      restarted.publish(params(2), version=2)
      subscriber._retry_at = 0.0
      for _ in range(3):  # the first poll may find the closed connection
        got = subscriber.poll()
        if got is not None:
          break
      assert got[1] == 2 and subscriber.run != run and subscriber.run == restarted.run
      np.testing.assert_array_equal(np.asarray(got[0]["w"]), np.asarray(params(2)["w"]))
      assert subscriber.poll() is None  # nothing newer in this run
    finally:
      restarted.close()
  finally:
    subscriber.close()
