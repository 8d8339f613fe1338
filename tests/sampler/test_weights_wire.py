"""The weight channel against hostile and broken peers: the shared-secret handshake,
signed headers, bounded frames, connection caps and timeouts. Each case names what
the channel did before it had them."""

import json
import logging
import socket
import threading
import time
import tracemalloc

import jax
import jax.numpy as jnp
import pytest

from sao_jax.channel import weights_fetch, weights_net, weights_wire
from sao_jax.channel.weights_wire import LENGTH

SECRET = bytes(range(32))


def params(seed: int):
  keys = jax.random.split(jax.random.key(seed), 2)
  return {"embed": jax.random.normal(keys[0], (16, 8), jnp.float32),
          "w": jax.random.normal(keys[1], (8, 4), jnp.bfloat16)}


def frame(payload: bytes) -> bytes:
  return LENGTH.pack(len(payload)) + payload


def wait_for(condition, seconds=5.0) -> bool:
  deadline = time.monotonic() + seconds
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.02)
  return condition()


def closed_by_peer(sock: socket.socket, seconds: float) -> bool:
  """Whether the other end closes `sock` within `seconds`."""
  sock.settimeout(seconds)
  try:
    while sock.recv(4096):
      pass
    return True
  except (TimeoutError, OSError) as error:
    return not isinstance(error, TimeoutError)


@pytest.fixture
def publisher():
  channel = weights_net.NetworkWeights(params(0), secret=SECRET)
  channel.publish(params(1), version=1)
  yield channel
  channel.close()


def subscriber_of(address: str, secret: bytes = SECRET):
  return weights_fetch.NetworkSubscriber(
      weights_fetch.NetworkSpec((address,), params(0), timeout=5, secret=secret))


def test_a_client_without_the_secret_gets_nothing(publisher):
  """Before: {"op": "versions"} and {"op": "get"} were answered to anyone who connected."""
  with socket.create_connection(publisher.address.split(":")) as sock:
    sock.sendall(frame(json.dumps({"op": "get", "version": 1}).encode()))
    reply = weights_wire.recv_frame(sock, 1 << 16, time.monotonic() + 5)
    assert json.loads(reply).keys() == {"protocol", "error"}  # no header, no weights
    assert closed_by_peer(sock, 5)
  with socket.create_connection(publisher.address.split(":")) as sock:  # a guessed proof
    hello = {"op": "hello", "protocol": weights_wire.PROTOCOL, "nonce": "00" * 32}
    sock.sendall(frame(json.dumps(hello).encode()))
    assert "proof" in json.loads(weights_wire.recv_frame(sock, 1 << 16, time.monotonic() + 5))
    sock.sendall(frame(json.dumps({"op": "auth", "proof": "11" * 32}).encode()))
    assert closed_by_peer(sock, 5)
  wrong = subscriber_of(publisher.address, secret=b"not the learner's secret")
  try:  # rejects the learner's proof, and hangs up
    assert wrong.poll() is None and wrong.version == -1
  finally:
    wrong.close()
  assert wrong.stats == {"auth_failed": 1}
  assert wait_for(lambda: publisher.stats == {"bad_hello": 1, "auth_failed": 1,
                                              "disconnected": 1}), publisher.stats
  right = subscriber_of(publisher.address)
  try:
    assert right.poll()[1] == 1
  finally:
    right.close()


def test_impostor_server_with_valid_checksums_is_rejected(caplog):
  """Before: any server speaking the protocol with matching crc32s had its weights adopted."""
  impostor = weights_net.NetworkWeights(params(0), secret=b"an impostor's own secret bytes")
  impostor.publish(params(7), version=9)
  subscriber = subscriber_of(impostor.address)
  try:
    with caplog.at_level(logging.WARNING):
      assert subscriber.poll() is None
    assert subscriber.version == -1 and subscriber.stats == {"auth_failed": 1}
    assert "did not prove the shared secret" in caplog.text and SECRET.hex() not in caplog.text
  finally:
    subscriber.close()
    impostor.close()


def test_relayed_handshake_with_a_substituted_header_is_rejected(publisher):
  """A relay passes the handshake through to the real learner, then serves its own
  version (valid crc32s) in place of the learner's: the header signature catches it."""
  forged = weights_net.NetworkWeights(params(0), secret=b"a relay's key, not the learner's")
  forged.publish(params(7), version=1)
  listener = socket.create_server(("127.0.0.1", 0))

  def relay():
    client, _ = listener.accept()
    upstream = socket.create_connection(publisher.address.split(":"))
    with client, upstream:
      for source, target in [(client, upstream), (upstream, client)] * 2:  # the handshake
        target.sendall(frame(weights_wire.recv_frame(source, 1 << 16)))
      while (request := weights_wire.recv_frame(client, 1 << 16)) is not None:
        message = json.loads(request)
        if message["op"] == "get":  # the forged snapshot: header, signature, shards
          header = forged._snapshots[1].header
          client.sendall(frame(header) + frame(weights_wire.sign_reply(
              forged._secret, b"header", bytes.fromhex(message["nonce"]), header)))
          for payload in forged._snapshots[1].payloads:
            client.sendall(LENGTH.pack(payload.nbytes) + payload.tobytes())
        else:  # the versions reply and its signature
          upstream.sendall(frame(request))
          for _ in range(2):
            client.sendall(frame(weights_wire.recv_frame(upstream, 1 << 16)))

  thread = threading.Thread(target=relay, daemon=True)
  thread.start()
  subscriber = subscriber_of(f"127.0.0.1:{listener.getsockname()[1]}")
  try:
    assert subscriber.poll() is None
    assert subscriber.version == -1 and subscriber.stats == {"bad_mac": 1}
  finally:
    subscriber.close()
    forged.close()
    listener.close()


def test_oversized_request_is_refused_without_allocating_it(publisher):
  """Before: one 8-byte length made the learner allocate and zero the declared size."""
  tracemalloc.start()
  try:
    with socket.create_connection(publisher.address.split(":")) as sock:
      sock.sendall(LENGTH.pack(1 << 30))  # "a 1 GiB request follows"
      assert closed_by_peer(sock, 5)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 16 << 20, f"the learner allocated {peak} bytes for a refused request"
  assert wait_for(lambda: publisher.stats == {"oversized": 1}), publisher.stats
  subscriber = subscriber_of(publisher.address)  # still serving
  try:
    assert subscriber.poll()[1] == 1
  finally:
    subscriber.close()


def test_idle_connections_are_cut_and_excess_handshakes_cut_the_oldest(monkeypatch):
  """Before: no cap, and every idle connection held a learner thread for 600 s."""
  monkeypatch.setattr(weights_wire, "HANDSHAKE_SECONDS", 0.5)
  publisher = weights_net.NetworkWeights(params(0), secret=SECRET, max_connections=3)
  address = publisher.address.split(":")
  held = [socket.create_connection(address) for _ in range(3)]
  extra = []
  try:
    assert wait_for(lambda: len(publisher._pending) == 3)
    extra = [socket.create_connection(address) for _ in range(2)]
    assert all(closed_by_peer(sock, 2) for sock in held[:2]), "the oldest handshakes stay open"
    extra[0].sendall(LENGTH.pack(40) + b"{")  # a slow drip is cut at the same deadline
    start = time.monotonic()
    assert all(closed_by_peer(sock, 5) for sock in held[2:] + extra), "idle connections stay open"
    assert time.monotonic() - start < 3
    assert wait_for(lambda: publisher.stats == {"handshake_evicted": 2, "timeout": 3}), (
        publisher.stats)
    assert not publisher._pending and not publisher._evicted
    subscriber = subscriber_of(publisher.address)
    try:
      publisher.publish(params(1), version=1)
      assert subscriber.poll()[1] == 1
    finally:
      subscriber.close()
  finally:
    for sock in held + extra:
      sock.close()
    publisher.close()


def test_unauthenticated_connections_cannot_lock_a_subscriber_out():
  """Before: connections that never finish the handshake held every one of the
  `max_connections` slots (each for the handshake's 5 s, renewed as it timed out),
  and a subscriber with the secret was turned away (`too_many_connections`)."""
  publisher = weights_net.NetworkWeights(params(0), secret=SECRET, max_connections=3)
  publisher.publish(params(1), version=1)
  address = publisher.address.split(":")
  squatters = [socket.create_connection(address) for _ in range(3)]
  try:
    assert wait_for(lambda: len(publisher._pending) == 3)
    subscriber = subscriber_of(publisher.address)
    try:
      got = subscriber.poll()
      assert got is not None and got[1] == 1, subscriber.stats
    finally:
      subscriber.close()
    assert publisher.stats["handshake_evicted"] == 1
  finally:
    for sock in squatters:
      sock.close()
    publisher.close()


def test_subscribers_past_the_cap_are_refused_after_their_handshake():
  publisher = weights_net.NetworkWeights(params(0), secret=SECRET, max_connections=2)
  publisher.publish(params(1), version=1)
  subscribers = [subscriber_of(publisher.address) for _ in range(3)]
  try:
    assert [s.poll() is not None for s in subscribers[:2]] == [True, True]
    assert wait_for(lambda: len(publisher._connections) == 2)
    with pytest.raises(ConnectionError, match="dropped the connection"):  # as if unreachable
      subscribers[2].poll()
    assert wait_for(lambda: publisher.stats == {"too_many_connections": 1}), publisher.stats
    subscribers[0].close()  # a slot frees up
    assert wait_for(lambda: len(publisher._connections) == 1)
    assert subscribers[2].poll()[1] == 1
  finally:
    for subscriber in subscribers:
      subscriber.close()
    publisher.close()


def test_a_flood_cannot_cut_a_subscriber_that_proved_the_secret(monkeypatch):
  """Before: a subscriber stayed a pending handshake after it was told it was
  authenticated, until its handler took the lock; a flood in that moment cut it
  (the sampler's next request failed: ConnectionError)."""
  publisher = weights_net.NetworkWeights(params(0), secret=SECRET, max_connections=2)
  publisher.publish(params(1), version=1)
  address = publisher.address.split(":")
  squatters = []
  handshake = weights_wire.server_handshake

  def handshake_then_a_flood(*args):
    handshake(*args)
    squatters.extend(socket.create_connection(address) for _ in range(2))
    names = {sock.getsockname() for sock in squatters}
    assert wait_for(lambda: set(publisher._pending.values()) == names)

  monkeypatch.setattr(weights_wire, "server_handshake", handshake_then_a_flood)
  subscriber = subscriber_of(publisher.address)
  try:
    assert subscriber.poll()[1] == 1
  finally:
    subscriber.close()
    for sock in squatters:
      sock.close()
    publisher.close()
  assert "handshake_evicted" not in publisher.stats


def test_a_flood_from_one_host_cannot_cut_a_handshake_from_another():
  """Before: a new connection at the cap cut the oldest pending handshake whoever
  made it, so one host opening connections faster than a subscriber's handshake
  cut the subscriber (its poll raised ConnectionError)."""
  publisher = weights_net.NetworkWeights(params(0), secret=SECRET, max_connections=3)
  publisher.publish(params(1), version=1)
  address = publisher.address.split(":")
  sampler = socket.create_connection(address)  # from 127.0.0.1
  squatters = []
  try:
    assert wait_for(lambda: len(publisher._pending) == 1)
    squatters = [socket.create_connection(address, source_address=("127.0.0.2", 0))
                 for _ in range(6)]
    assert wait_for(lambda: publisher.stats["handshake_evicted"] == 4), publisher.stats
    weights_wire.client_handshake(sampler, SECRET, 5)
    weights_wire.send_json(sampler, {"op": "versions", "nonce": "ab" * 32})
    reply = json.loads(weights_wire.recv_frame(sampler, 1 << 16, time.monotonic() + 5))
    assert reply["versions"] == [1]
    assert all(closed_by_peer(sock, 2) for sock in squatters[:4]), "the flood's oldest stay"
    assert set(publisher._pending.values()) == {sock.getsockname() for sock in squatters[4:]}
  finally:
    sampler.close()
    for sock in squatters:
      sock.close()
    publisher.close()


def listen_overflows():
  """TcpExt ListenOverflows from /proc/net/netstat: connections this network namespace
  dropped because a listen queue was full."""
  with open("/proc/net/netstat") as f:
    lines = [line.split() for line in f if line.startswith("TcpExt:")]
  return int(dict(zip(lines[0], lines[1]))["ListenOverflows"])


def test_a_burst_of_connections_is_queued_not_dropped():
  """Before: a listen backlog of 5: connections arriving faster than the server
  accepts them (samplers reconnecting at once, or a flood) overflowed the kernel's
  queue, and each dropped connect waited out a 1 s (then 3 s, 7 s, ...) retransmit."""
  publisher = weights_net.NetworkWeights(params(0), secret=SECRET, max_connections=32)
  publisher.publish(params(1), version=1)
  host, port = publisher.address.split(":")
  burst = [socket.socket() for _ in range(63)]  # with the subscriber: the 2 * 32 queued
  subscriber = subscriber_of(publisher.address)
  overflows_before = listen_overflows()
  try:
    for sock in burst:
      sock.setblocking(False)
      sock.connect_ex((host, int(port)))
    assert subscriber.poll()[1] == 1
    # The kernel's count of connections dropped at a full listen queue, not a wall-clock
    # bound: a dropped handshake costs a 1 s retransmit, but so can a busy machine.
    assert listen_overflows() == overflows_before, "connections were dropped and retried"
  finally:
    subscriber.close()
    for sock in burst:
      sock.close()
    publisher.close()


def test_a_get_without_an_integer_version_is_answered_and_counted(publisher):
  """Before: a subscriber's {"op": "get", "version": [1]} raised TypeError (unhashable)
  in the learner's handler: a traceback, no reply and no count."""
  for version in ([1], {"v": 1}):
    with socket.create_connection(publisher.address.split(":")) as sock:
      weights_wire.client_handshake(sock, SECRET, 5)
      weights_wire.send_json(sock, {"op": "get", "version": version})
      reply = json.loads(weights_wire.recv_frame(sock, 1 << 16, time.monotonic() + 5))
      assert reply.keys() == {"error"} and "unknown request" in reply["error"]
      assert closed_by_peer(sock, 5)
  assert wait_for(lambda: publisher.stats == {"bad_request": 2}), publisher.stats


@pytest.mark.parametrize("reply, reason", [
    (LENGTH.pack(1 << 62), "oversized"),  # before: MemoryError
    (frame(b"[" * 20_000 + b"]" * 20_000), "bad_frame"),  # before: RecursionError
    (frame(b'{"protocol": 1, "versions": [1]}'), "protocol"),  # before: KeyError
    (frame(b'{"protocol": %d, "nonce": "zz", "proof": 5}' % weights_wire.PROTOCOL), "bad_frame"),
    (frame(b"\xff\xfe garbage"), "bad_frame"),
], ids=["huge_length", "nested", "missing_keys", "bad_types", "garbage"])
def test_hostile_server_is_counted_not_a_crash(reply, reason):
  listener = socket.create_server(("127.0.0.1", 0))

  def serve():
    while True:
      try:
        client, _ = listener.accept()
      except OSError:
        return  # the test closed the listener
      with client:
        weights_wire.recv_frame(client, 1 << 16)
        client.sendall(reply)
        time.sleep(0.2)

  threading.Thread(target=serve, daemon=True).start()
  subscriber = subscriber_of(f"127.0.0.1:{listener.getsockname()[1]}")
  try:
    assert subscriber.poll() is None and subscriber.poll() is None
    # Before: every poll (each decode step) reconnected to the broken peer. Now the
    # second poll waits out the backoff without touching the network ...
    assert subscriber.stats == {reason: 1} and subscriber.version == -1
    time.sleep(weights_fetch._RETRY_FIRST_S * 1.5)
    assert subscriber.poll() is None  # ... and the next one after it retries,
    assert subscriber.stats == {reason: 2}
    assert subscriber.poll() is None  # with the wait doubled.
    assert subscriber.stats == {reason: 2}
    assert subscriber._retry_wait == 2 * weights_fetch._RETRY_FIRST_S
  finally:
    subscriber.close()
    listener.close()


def test_what_an_unauthenticated_peer_sends_reaches_the_learner_log_escaped(publisher, caplog):
  """Before: anyone who could reach the port sent a JSON string as its hello, and the
  learner's warning quoted it raw: an OSC 52 clipboard write, an erased line and a
  forged progress line on the operator's terminal."""
  hello = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\r\nstep 1000/1000 | reward 1.000"
  with caplog.at_level(logging.WARNING):
    with socket.create_connection(publisher.address.split(":")) as sock:
      sock.sendall(frame(json.dumps(hello).encode()))
      assert closed_by_peer(sock, 5)
    assert wait_for(lambda: publisher.stats == {"bad_frame": 1}), publisher.stats
  [message] = [r.getMessage() for r in caplog.records if "weight channel" in r.getMessage()]
  assert message.isprintable() and "\\x1b]52;c;" in message and "\\nstep 1000" in message
