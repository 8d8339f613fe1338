"""Network faults on the weight channel are waits, not deaths (#42 item 2).

A learner that accepts connections and never answers (stalled, or a partition in the
middle of a transfer) makes `weights_wire.Connection` raise TimeoutError after the
channel's deadline. The worker caught only ConnectionError, so that TimeoutError ended
the sampler process, and after `max_restarts` such deaths the supervisor stopped the
run. Now every timeout or reset is a wait with a doubling backoff, counted, while the
sampler keeps sampling on the weights it has; it adopts the next version once the
learner answers again."""

import dataclasses
import socket
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.channel import weights, weights_net
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.models.transformer import init_params
from sao_jax.sampler import worker


class StallProxy:
  """A relay in front of a learner's publisher. It forwards both ways until `stall()`;
  from then on it accepts connections and reads what either side sends, but forwards
  nothing (a learner that accepts and never answers), until `resume()`, after which it
  forwards again. `stall(after=n)` first lets n more bytes through towards the subscriber
  (a partition in the middle of a transfer)."""

  def __init__(self, target: str):
    host, _, port = target.rpartition(":")
    self._target = (host, int(port))
    self._listener = socket.create_server(("127.0.0.1", 0))
    self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
    self._lock = threading.Condition()
    self._budget: int | None = None  # bytes still let through towards the subscriber
    self._sockets: list[socket.socket] = []
    threading.Thread(target=self._accept, daemon=True).start()

  def stall(self, after: int = 0) -> None:
    with self._lock:
      self._budget = after

  def resume(self) -> None:
    with self._lock:
      self._budget = None
      self._lock.notify_all()

  def _accept(self) -> None:
    while True:
      try:
        client, _ = self._listener.accept()
      except OSError:
        return
      upstream = socket.create_connection(self._target)
      self._sockets += [client, upstream]
      threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
      threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

  def _pump(self, source: socket.socket, sink: socket.socket, downstream: bool) -> None:
    try:
      while data := source.recv(1 << 16):
        with self._lock:
          if downstream and self._budget:
            through = data[:self._budget]
            self._budget -= len(through)
            sink.sendall(through)
            data = data[len(through):]
          while self._budget == 0:  # stalled: hold the bytes
            self._lock.wait()
        sink.sendall(data)
    except OSError:
      pass
    finally:
      for sock in (source, sink):
        try:
          sock.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass

  def close(self) -> None:
    self.resume()
    self._listener.close()
    for sock in self._sockets:
      sock.close()


def big_params(seed: int):
  """Random values, 1 MiB in one leaf: a transfer long enough to cut in the middle."""
  keys = jax.random.split(jax.random.key(seed), 2)
  return {"w": jax.random.normal(keys[0], (512, 512), jnp.float32),
          "b": jax.random.normal(keys[1], (8,), jnp.float32)}


@pytest.mark.parametrize("where", ["handshake", "request", "mid_transfer"])
def test_a_stalled_learner_is_a_wait_and_its_next_version_is_adopted(where):
  publisher = weights_net.NetworkWeights(big_params(0))
  proxy = StallProxy(publisher.address)
  spec = dataclasses.replace(publisher.spec, addresses=(proxy.address,), timeout=0.3)
  subscriber = weights.subscribe(spec)
  now, lines = [0.0], []
  reconnect = worker._Reconnect(lines.append, clock=lambda: now[0])
  try:
    publisher.publish(big_params(0), 1)
    assert reconnect.poll(subscriber)[1] == 1
    publisher.publish(big_params(1), 2)
    if where == "handshake":
      subscriber.close()  # the next poll opens a new connection, which the learner never answers
      proxy.stall()
    elif where == "request":
      proxy.stall()
    else:  # the versions reply and the header pass, then the shard stops in its middle
      proxy.stall(after=300 << 10)
    start = time.monotonic()
    assert reconnect.poll(subscriber) is None  # before: the TimeoutError ended the worker
    assert time.monotonic() - start < 2.0
    assert reconnect.waits == {"timeout": 1} and subscriber.version == 1
    assert "polling again in 1 s" in lines[-1] and "stalled" in lines[-1]
    assert ("a transfer" if where == "mid_transfer" else "handshake" if where == "handshake"
            else "the reply to") in lines[-1]
    now[0] = reconnect._retry_at - 1e-3  # within the wait: no network, no busy retry
    start = time.monotonic()
    assert reconnect.poll(subscriber) is None and time.monotonic() - start < 0.05
    now[0] = reconnect._retry_at  # a second timeout doubles the wait
    assert reconnect.poll(subscriber) is None and reconnect._retry_at - now[0] == 2.0
    proxy.resume()  # the learner answers again
    now[0] = reconnect._retry_at
    params, version = reconnect.poll(subscriber)
    assert version == 2 and reconnect.waits == {"timeout": 2}
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(big_params(1))):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  finally:
    subscriber.close()
    proxy.close()
    publisher.close()


def test_a_reset_connection_is_a_wait_too():
  publisher = weights_net.NetworkWeights(big_params(0))
  subscriber = weights.subscribe(dataclasses.replace(publisher.spec, timeout=0.3))
  reconnect = worker._Reconnect(lambda line: None, clock=lambda: 0.0)
  publisher.publish(big_params(0), 1)
  assert reconnect.poll(subscriber)[1] == 1
  publisher.close()  # the learner goes away: refused
  assert reconnect.poll(subscriber) is None and reconnect.waits == {"connection": 1}
  subscriber.close()


class Transport:
  def __init__(self):
    self.trajectories = []

  def put(self, traj, timeout=None):
    self.trajectories.append(traj)


@pytest.mark.slow  # ~20 s: the worker compiles its engine
def test_a_sampler_samples_through_a_stalled_learner_and_adopts_its_next_version(
    tmp_path, monkeypatch):
  """The whole worker (`run_sampler`) against a real publisher behind a relay that
  stalls: it hands over trajectories of version 1 while the learner does not answer,
  then adopts version 2; before, its first poll of the stalled learner raised
  TimeoutError out of `run_sampler` (the process died)."""
  tokenizer = tmp_path / "tokenizer.json"
  train_tokenizer(["Solve 12 + 30 = 42. \\boxed{42}"] * 4, vocab_size=300).save(str(tokenizer))
  model = C.ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, head_dim=8,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        logits_chunk=512, max_position_embeddings=1024)
  sampler = C.SamplerConfig(slots=2, max_seq_len=600, prefill_buckets=(512,),
                            max_new_tokens=8, stop_tokens=(), stop_patterns=())
  cfg = C.Config(model=model, sampler=sampler, mesh=C.MeshConfig(fsdp=1),
                 env=C.EnvConfig(name="math_tool", max_turns=1))
  first, second = init_params(model, jax.random.key(0)), init_params(model, jax.random.key(1))
  publisher = weights_net.NetworkWeights(first)
  publisher.publish(first, 1)
  proxy = StallProxy(publisher.address)
  monkeypatch.setattr(worker, "_RECONNECT_FIRST_S", 0.05)
  monkeypatch.setattr(worker, "_RECONNECT_MAX_S", 0.2)
  transport = Transport()
  spec = worker.WorkerSpec(
      cfg=cfg, tokenizer_path=str(tokenizer), transport=transport, worker_id=0,
      weights=dataclasses.replace(publisher.spec, addresses=(proxy.address,), timeout=0.2))
  state = {"stalled_at": None, "resumed": False, "deadline": time.monotonic() + 300}

  def alive() -> bool:
    """Scripts the learner from the worker's loop: stall once version 1 is sampled, resume
    after 3 more trajectories and a poll timed out, stop once one of version 2 is handed
    over."""
    done = transport.trajectories
    if state["stalled_at"] is None and done:
      proxy.stall()
      publisher.publish(second, 2)
      state["stalled_at"] = len(done)
    elif not state["resumed"] and state["stalled_at"] is not None and (
        len(done) >= state["stalled_at"] + 3
        and sum(t.info["weight_waits"] for t in done) >= 1):  # stalled past the deadline
      proxy.resume()
      state["resumed"] = True
    return time.monotonic() < state["deadline"] and not any(
        t.policy_versions[0] == 2 for t in done)

  try:
    worker.run_sampler(spec, alive)
  finally:
    proxy.close()
    publisher.close()
  done = transport.trajectories
  assert state["resumed"] and done[-1].policy_versions[0] == 2, "version 2 never adopted"
  during = done[state["stalled_at"]:state["stalled_at"] + 3]
  assert all(t.policy_versions == (1, 1) for t in during)  # sampled on through the stall
  waits = sum(t.info["weight_waits"] for t in done)
  assert waits >= 1 and all(t.info["weight_errors"] == 0 for t in done)


class BlockingSubscriber:
  """A subscriber whose polls after the first block until `answer` is set (a poll of a
  learner that does not answer, within the channel's deadline)."""

  def __init__(self):
    self.answer, self.polls, self.stats = threading.Event(), 0, {}

  def poll(self):
    self.polls += 1
    if self.polls == 1:
      return "weights 1", 1
    self.answer.wait(10)
    if self.polls == 2:
      raise TimeoutError("weight channel: learner host 10.0.0.2:5617 stalled for 10 s")
    return ("weights 2", 2) if self.polls == 3 else None

  def close(self):
    self.answer.set()


def test_a_poll_blocked_on_a_stalled_learner_never_holds_the_sampling_loop(monkeypatch):
  """The channel is polled on a thread of its own (`worker._Poller`): while a poll waits
  for a learner that does not answer (up to the channel's 60 s deadline by default),
  `take()` returns at once, so the sampler keeps stepping its engine."""
  monkeypatch.setattr(worker, "_RECONNECT_FIRST_S", 0.01)
  subscriber = BlockingSubscriber()
  poller = worker._Poller(subscriber, worker._Reconnect(lambda line: None), worker._SkipLog(print))
  try:
    deadline = time.monotonic() + 5
    while (got := poller.take()) is None and time.monotonic() < deadline:
      time.sleep(0.01)
    assert got == ("weights 1", 1)
    assert wait_until(lambda: subscriber.polls == 2)  # the poll now blocks
    start = time.monotonic()
    assert poller.take() is None and time.monotonic() - start < 0.05
    subscriber.answer.set()  # the stalled poll times out, and the next one answers
    assert wait_until(lambda: poller.counts == (1, 0))
    taken = []
    assert wait_until(lambda: taken.append(poller.take()) or ("weights 2", 2) in taken)
  finally:
    poller.close()


def wait_until(condition, seconds: float = 5.0) -> bool:
  deadline = time.monotonic() + seconds
  while not condition():
    if time.monotonic() > deadline:
      return False
    time.sleep(0.01)
  return True


def test_an_error_that_is_no_network_fault_still_ends_the_worker():
  class Broken:
    stats = {}

    def poll(self):
      raise ValueError("weight channel: learner host 10.0.0.2:5617 serves another model")

    def close(self):
      pass
  poller = worker._Poller(Broken(), worker._Reconnect(lambda line: None), worker._SkipLog(print))
  try:
    assert wait_until(lambda: poller._error is not None)
    with pytest.raises(ValueError, match="another model"):
      poller.take()
  finally:
    poller.close()
