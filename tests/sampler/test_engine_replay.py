"""The multi-host engine's seam on one process (`sao_jax.sampler.multihost`): a
`LeaderEngine` and a follower replaying its messages through a stand-in for the
runtime's key-value store. The follower's engine makes the same episodes as the
leader's; versions are adopted only once every process holds them; silence, stalls
and a call the follower cannot replay end the group. (Two real processes over one
mesh: tests/sampler/test_multihost_engine.py, slow.)"""

import threading
import time

import numpy as np
import pytest

import multihost_roles as roles
from engine_fixtures import SAMPLER, engine, params, prompts
from sao_jax.sampler import multihost


class Store:
  """The key-value store's calls the group makes, in memory (NOT_FOUND and timeouts
  raise like the runtime's)."""

  def __init__(self):
    self.values, self.changed = {}, threading.Condition()

  def key_value_set_bytes(self, key, value):
    with self.changed:
      assert key not in self.values, f"{key} written twice"
      self.values[key] = value
      self.changed.notify_all()

  key_value_set = key_value_set_bytes

  def blocking_key_value_get_bytes(self, key, timeout_ms):
    with self.changed:
      if not self.changed.wait_for(lambda: key in self.values, timeout_ms / 1000):
        raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
      return self.values[key]

  def key_value_try_get(self, key):
    with self.changed:
      if key not in self.values:
        raise KeyError(f"NOT_FOUND: {key}")
      return self.values[key]

  def key_value_delete(self, key):
    with self.changed:
      del self.values[key]


def groups(timeout_s=5.0, store=None):
  store = store or Store()
  return [multihost.Group(timeout_s=timeout_s, client=store, process_id=i, processes=2)
          for i in range(2)]


def recording(eng):
  """`eng`, its finished episodes recorded in `eng.finished` (replayed calls included)."""
  eng.finished, finish = {}, eng.finish

  def finish_and_record(episode_id):
    out = finish(episode_id)
    eng.finished[episode_id] = out
    return out

  eng.finish = finish_and_record
  return eng


def test_the_follower_makes_the_leaders_episodes():
  """The roles' scenario (prefill, decode, multi-turn, finishes, a weight update) led
  on one engine and replayed on another: the same tokens, behavior_logp and versions,
  and the same device calls."""
  lead_group, follow_group = groups(timeout_s=600)  # no beats: every message is a call's
  for group in (lead_group, follow_group):
    group.announce(0)
    group.announce(1)
  leader = recording(engine(params(0), SAMPLER))
  follower = recording(engine(params(0), SAMPLER))
  replayed = {}
  thread = threading.Thread(target=lambda: replayed.update(messages=multihost.follow(
      follower, follow_group, params_for=roles.weights)))
  thread.start()
  led = multihost.LeaderEngine(leader, lead_group)
  out = roles.scenario(led)
  led.close()
  thread.join(60)
  assert not thread.is_alive()
  assert {tuple(e["versions"]) for e in out.values()} >= {(0, 0), (1, 1)}
  assert sorted(follower.finished) == sorted(leader.finished) == sorted(out)
  for i, want in leader.finished.items():
    got = follower.finished[i]
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.behavior_logp, want.behavior_logp)
    assert got.policy_versions == want.policy_versions
  assert follower.stats == leader.stats
  assert follower.version == leader.version == 1
  assert replayed["messages"] == led.messages


def test_a_version_is_adopted_only_once_every_process_holds_it():
  lead_group, follow_group = groups(timeout_s=0.3)
  led = multihost.LeaderEngine(engine(params(0), SAMPLER), lead_group)
  lead_group.announce(2)
  with pytest.raises(multihost.GroupFailed, match="version 2: not every process"):
    led.set_params(params(1), 2)
  assert led.version == 0 and not led.held_by_all(2)
  follow_group.announce(2)
  led.set_params(params(1), 2)
  assert led.version == 2
  sent = iter(follow_group.receive, b'[["set_params", 2]]')  # beats (b"[]") until then
  assert set(sent) <= {b"[]"}


def test_a_silent_leader_ends_the_follower(monkeypatch):
  monkeypatch.setattr(multihost, "START_TIMEOUT_S", 0.2)
  _, follow_group = groups(timeout_s=0.2)
  with pytest.raises(multihost.GroupFailed, match="no engine message 0 from the leader within"):
    multihost.follow(engine(params(0), SAMPLER), follow_group, params_for=roles.weights)


def test_a_busy_leader_beats_so_its_followers_wait():
  """Nothing to send for longer than the timeout (an environment, a compile): the
  leader's beat thread sends empty messages."""
  lead_group, follow_group = groups(timeout_s=0.3)
  led = multihost.LeaderEngine(engine(params(0), SAMPLER), lead_group)
  time.sleep(0.5)
  assert follow_group.receive() == b"[]"
  led.close()


def test_a_call_the_follower_cannot_replay_ends_the_group():
  """Engines that would diverge (here the follower's lacks a version the leader
  named) end the group instead."""
  lead_group, follow_group = groups()
  led = multihost.LeaderEngine(engine(params(0), SAMPLER), lead_group)
  for group in (lead_group, follow_group):
    group.announce(3)
  led.set_params(params(1), 3)
  led.close()
  with pytest.raises(multihost.GroupFailed, match="replaying set_params failed"):
    multihost.follow(engine(params(0), SAMPLER), follow_group, params_for=lambda v: {}[v])


def test_a_stalled_call_ends_the_group():
  stalls = []
  watchdog = multihost.Watchdog(0.2, stalls.append)
  with watchdog.guard("dispatch"):
    time.sleep(0.6)
  watchdog.close()
  assert stalls == ["dispatch ran past 0.2 s"]


def test_the_leader_changes_state_only_through_its_broadcasts():
  lead_group, _ = groups()
  led = multihost.LeaderEngine(engine(params(0), SAMPLER), lead_group)
  with pytest.raises(AttributeError, match="state changes go through its broadcast methods"):
    led._cache
  with pytest.raises(ValueError, match="episode ids are ints or strings"):
    led.submit(("a", 1), prompts(1)[0], seed=0)
  led.close()
