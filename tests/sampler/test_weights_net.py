"""Network weight channel: exact round trips, sharded leaves, checksums, versions,
in-flight snapshots, unreachable learners, config. Attacks and faults (the
shared-secret handshake, signed headers, bounded frames, connection caps,
hostile servers): tests/sampler/test_weights_wire.py. (Two real clusters:
tests/distributed/test_two_clusters.py.)"""

import logging
import re
import socket
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from sao_jax.channel import run_secret
from sao_jax.channel import weights, weights_fetch, weights_net, weights_wire
from sao_jax.config import SamplerConfig


SECRET = bytes(range(32))  # a fixed test secret


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def params(seed: int):
  """Random values in every leaf, so a misplaced byte changes the result."""
  keys = jax.random.split(jax.random.key(seed), 3)
  return {"embed": jax.random.normal(keys[0], (16, 8), jnp.float32),
          "layers": {0: {"w": jax.random.normal(keys[1], (8, 4), jnp.bfloat16)}},
          "scale": jax.random.normal(keys[2], (), jnp.float32)}


def assert_exact(tree, reference):
  assert jax.tree.structure(tree) == jax.tree.structure(reference)
  for got, want in zip(jax.tree.leaves(tree), jax.tree.leaves(reference)):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got).reshape(-1).view(np.uint8),
                                  np.asarray(want).reshape(-1).view(np.uint8))


@pytest.fixture
def channel():
  publisher = weights_net.NetworkWeights(params(0))
  subscriber = weights.subscribe(publisher.spec)
  yield publisher, subscriber
  subscriber.close()
  publisher.close()


def test_versions_round_trip_exactly(channel):
  publisher, subscriber = channel
  assert isinstance(subscriber, weights_fetch.NetworkSubscriber)
  assert subscriber.poll() is None  # nothing published yet
  publisher.publish(params(1), version=1)
  tree, version = subscriber.poll()
  assert version == 1
  assert_exact(tree, params(1))
  assert subscriber.poll() is None  # nothing newer
  publisher.publish(params(2), version=2)
  publisher.publish(params(3), version=5)
  tree, version = subscriber.poll()
  assert version == 5  # the newest only
  assert_exact(tree, params(3))


def test_sharded_leaves_are_served_once_and_assembled():
  mesh = jax.make_mesh((2, 4), ("x", "y"))
  layout = {"embed": P("x", "y"), "layers": {0: {"w": P(None, "y")}}, "scale": P()}
  sharded = jax.tree.map(lambda leaf, spec: jax.device_put(leaf, NamedSharding(mesh, spec)),
                         params(1), layout)
  publisher = weights_net.NetworkWeights(params(0))
  subscriber = weights.subscribe(publisher.spec)
  try:
    publisher.publish(sharded, version=1)
    tree, _ = subscriber.poll()
    assert_exact(tree, params(1))
    served = sum(p.nbytes for p in publisher._snapshots[1].payloads)
    assert served == sum(x.nbytes for x in jax.tree.leaves(params(1)))  # no replica twice
    assert len(publisher._snapshots[1].payloads) == 8 + 4 + 1
  finally:
    subscriber.close()
    publisher.close()


def test_checksum_mismatch_names_leaf_and_version_and_keeps_weights(channel, caplog):
  publisher, subscriber = channel
  publisher.publish(params(1), version=1)
  assert subscriber.poll()[1] == 1
  publisher.publish(params(2), version=2)
  publisher._snapshots[2].payloads[1][3] ^= 0xFF  # a flipped byte in leaf 1 (the bf16 one)
  with caplog.at_level(logging.WARNING):
    assert subscriber.poll() is None  # counted and logged, not raised
  assert re.search(r"version 2 leaf \['layers'\]\[0\]\['w'\].*keeping version 1", caplog.text)
  assert subscriber.stats == {"checksum": 1} and subscriber.version == 1
  publisher.publish(params(3), version=3)
  assert subscriber.poll() is None  # within the retry wait: off the network
  time.sleep(weights_fetch._RETRY_FIRST_S * 1.5)
  tree, version = subscriber.poll()  # the connection recovers; the next version is adopted
  assert version == 3
  assert_exact(tree, params(3))


def test_versions_must_increase(channel):
  publisher, _ = channel
  publisher.publish(params(1), version=2)
  for version in (2, 1):
    with pytest.raises(ValueError, match=f"version {version} is not newer than the published 2"):
      publisher.publish(params(1), version=version)
  with pytest.raises(ValueError, match=r"leaf \['embed'\] \(2, 8\) float32"):
    publisher.publish({**params(1), "embed": jnp.zeros((2, 8))}, version=3)


def test_choose_version_takes_the_newest_every_host_holds():
  assert weights_fetch.choose_version([[3, 4], [4, 5]], current=2) == 4
  assert weights_fetch.choose_version([[3, 4], [4, 5]], current=4) is None  # never older or same
  assert weights_fetch.choose_version([[1], [2]], current=-1) is None  # no common version yet


def test_evicted_version_is_refused_not_mixed(channel):
  publisher, _ = channel
  for version in (1, 2, 3):  # keep=2: version 1 is dropped
    publisher.publish(params(version), version=version)
  connection = weights_wire.Connection(publisher.address, 10, publisher.spec.secret)
  try:
    reply = connection.get_header(1, 1 << 16)
    assert "error" in reply and "holding [2, 3]" in reply["error"]
  finally:
    connection.close()


def test_in_flight_transfer_keeps_its_version_and_publish_never_waits():
  """A subscriber that stops reading mid-transfer (32 MB, far more than the socket
  buffers) must not block `publish`, and must still receive the version it asked for."""
  big = lambda value: {"w": np.full((8, 1 << 20), value, np.float32)}
  publisher = weights_net.NetworkWeights(big(0.0), timeout=30)
  connection = weights_wire.Connection(publisher.address, 30, publisher.spec.secret)
  try:
    publisher.publish(big(1.0), version=1)
    header = connection.get_header(1, 1 << 16)  # then read nothing for a while
    time.sleep(0.2)
    start = time.monotonic()
    publisher.publish(big(2.0), version=2)
    publisher.publish(big(3.0), version=3)  # version 1 leaves the publisher (keep=2)
    assert time.monotonic() - start < 10, "publish waited for a stalled subscriber"
    assert publisher.versions == [2, 3]
    (entry,) = header["shards"]
    buffer = np.empty(entry["nbytes"], np.uint8)
    connection.recv_frame_into(buffer)
    assert [d.hex() for d in weights_wire.chunk_digests(buffer)] == entry["sha256"]
    assert np.all(buffer.view(np.float32) == 1.0)
  finally:
    connection.close()
    publisher.close()


def test_unreachable_learner_is_named():
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
  spec = weights_fetch.NetworkSpec((f"127.0.0.1:{port}",), params(0), timeout=5, secret=SECRET)
  subscriber = weights.subscribe(spec)
  with pytest.raises(ConnectionError, match=f"learner host 127.0.0.1:{port} is unreachable"):
    subscriber.poll()


def test_learner_that_goes_away_is_named(channel):
  publisher, subscriber = channel
  publisher.publish(params(1), version=1)
  subscriber.poll()
  publisher.close()
  with pytest.raises(ConnectionError, match=f"learner host {publisher.address}"):
    subscriber.poll()


def test_other_model_is_named():
  publisher = weights_net.NetworkWeights(params(0))
  spec = weights_fetch.NetworkSpec(publisher.spec.addresses,
                                 {**params(0), "embed": jax.ShapeDtypeStruct((16, 9), jnp.float32)},
                                 secret=publisher.spec.secret)
  subscriber = weights.subscribe(spec)
  try:
    publisher.publish(params(1), version=1)
    with pytest.raises(ValueError, match=r"serves leaf \['embed'\] \(16, 8\) float32 where "
                                         r"\['embed'\] \(16, 9\) float32 is expected"):
      subscriber.poll()
    assert subscriber.version == -1
  finally:
    subscriber.close()
    publisher.close()


def test_every_learner_host_exactly_once():
  """Two servers that both say "process 0 of 1" are not a two-host learner."""
  first, second = (weights_net.NetworkWeights(params(0), secret=SECRET) for _ in range(2))
  subscriber = weights.subscribe(weights_fetch.NetworkSpec(
      (first.address, second.address), first.spec.template, secret=SECRET))
  try:
    with pytest.raises(ValueError, match="not every host of one learner exactly once"):
      subscriber.poll()
  finally:
    subscriber.close()
    first.close()
    second.close()


def test_config_selects_the_network_channel_on_its_own_interface(tmp_path):
  """A learner host listens on its entry of weights_addresses (process 0: the first), not
  on every interface (0.0.0.0), and its subscribers need the secret from the file."""
  secret = tmp_path / "weights.secret"
  secret.write_bytes(SECRET)
  port = free_port()
  cfg = SamplerConfig(weights="network", weights_addresses=(f"127.0.0.1:{port}", "10.0.0.3:5617"),
                      weights_port=port, weights_secret_file=str(secret))
  cfg.validate()
  publisher = weights.make_publisher(cfg, params(0))
  try:
    assert isinstance(publisher, weights_net.NetworkWeights)
    assert publisher.address == f"127.0.0.1:{port}"
    assert publisher.spec.addresses == cfg.weights_addresses
    assert publisher.spec.secret == SECRET and SECRET.hex() not in repr(publisher.spec)
  finally:
    publisher.close()
  local = weights.make_publisher(SamplerConfig(weights="network"), params(0))
  try:  # same-host samplers: loopback, and a fresh secret they get through the spec
    assert local.address.startswith("127.0.0.1:") and len(local.spec.secret) == 32
  finally:
    local.close()


def test_secret_from_the_environment_and_bad_secrets_are_named(tmp_path, monkeypatch):
  monkeypatch.setenv("SAO_WEIGHTS_SECRET", SECRET.hex())
  assert run_secret.load_secret(SamplerConfig(weights_secret_env="SAO_WEIGHTS_SECRET")) == (
      SECRET.hex().encode())
  short = tmp_path / "short"
  short.write_bytes(b"1234")
  for cfg, message in [
      (SamplerConfig(weights_secret_env="SAO_NO_SUCH_VARIABLE"),
       "weights_secret_env='SAO_NO_SUCH_VARIABLE': the environment variable is unset"),
      (SamplerConfig(weights_secret_file=str(tmp_path / "missing")), "cannot be read.*head -c 32"),
      (SamplerConfig(weights_secret_file=str(short)), "holds 4 bytes; a secret needs at least 16")]:
    with pytest.raises(ValueError, match=message):
      run_secret.load_secret(cfg)
  with pytest.raises(ValueError, match="serving on 0.0.0.0 .* needs a shared secret"):
    weights_net.NetworkWeights(params(0), host="0.0.0.0")
  with pytest.raises(ValueError, match="secret holds 4 bytes; a secret needs at least 16"):
    weights_net.NetworkWeights(params(0), secret=b"1234")


@pytest.mark.parametrize("fields, message", [
    (dict(weights="tcp"), "sampler.weights='tcp' is invalid: allowed values are"),
    (dict(weights="directory"), "sampler.weights_dir='' is invalid"),
    (dict(weights_port=70000), "sampler.weights_port=70000 is invalid"),
    (dict(weights_addresses=("10.0.0.2",)), "'10.0.0.2' is not host:port"),
    (dict(weights="network", weights_addresses=("10.0.0.2:5617",)),
     r"sampler.weights_secret_file='' is invalid: weights_addresses .* needs a shared secret: "
     r"create one with `head -c 32 /dev/urandom > weights.secret`"),
    (dict(weights_secret_file="a", weights_secret_env="B"), "not both"),
    (dict(weights_max_connections=0), "sampler.weights_max_connections=0 is invalid"),
])
def test_bad_weight_config_is_named(fields, message):
  with pytest.raises(ValueError, match=message):
    SamplerConfig(**fields).validate()
