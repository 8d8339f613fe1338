"""Environment steps overlap decoding (issue #41) and change nothing but timing.

The same episodes run through a real (tiny) engine with the blocking runner and
with the overlapped one under randomised environment latencies; every
trajectory (tokens, action mask, behavior_logp, rewards) is identical per
episode. The engine keeps a parked slot's cache across engine steps that decode
other episodes; the pool bounds, times out and shuts down steps.
"""

import random
import sys
import threading
import time
import types

import jax
import numpy as np
import pytest

from sao_jax import config as C
from sao_jax.chat import chat_format
from sao_jax.envs.base import Environment, StepResult, Task
from sao_jax.models import transformer
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.sampler import scripted
from sao_jax.sampler.env_steps import EnvSteps, StepTimeout, StuckSteps
from sao_jax.sampler.episodes import EpisodeRunner, make_engine, run_to_completion

TOKENIZER = train_tokenizer(["seen chars at turn task solve the sum of numbers 0 1 2 3 4 5 6 7 8 9"] * 4,
                            vocab_size=300)
CHAT = chat_format(None, TOKENIZER)
MODEL = C.ModelConfig(vocab_size=TOKENIZER.get_vocab_size(), hidden_size=32, intermediate_size=64,
                      head_dim=8, num_attention_heads=4, num_key_value_heads=2, logits_chunk=64)
EPISODES = 8


def sampler_cfg(layout: str, **changes) -> C.SamplerConfig:
  # slots >= episodes in flight: a parked slot is never evicted (an evicted one
  # re-prefills, which may differ in the last float bits: engine docstring).
  return C.SamplerConfig(kv_layout=layout, slots=EPISODES, max_seq_len=256,
                         prefill_buckets=(16, 64), steps_per_call=4, max_new_tokens=10,
                         stop_patterns=(), **changes)


def params():
  """init_params x10: peaked distributions, so some turns end on the end token."""
  base = transformer.init_params(MODEL, jax.random.key(0))
  return jax.tree.map(lambda x: x * 10.0 if x.ndim >= 2 else x, base)


class LatencyEnv(Environment):
  """Three turns; each step sleeps a random time drawn from (`salt`, task, turn), answers
  with what it saw, and the last pays the action's length parity."""

  salt: int | None = None  # None: no sleeps
  max_sleep_s = 0.08

  def __init__(self):
    super().__init__(max_turns=3, max_observation_chars=200)

  def _reset(self, task):
    return [{"role": "user", "content": task.prompt}]

  def _step(self, action):
    if LatencyEnv.salt is not None:
      time.sleep(random.Random(f"{LatencyEnv.salt}/{self.task.id}/{self.turn}").random()
                 * LatencyEnv.max_sleep_s)
    if self.turn == 3:
      return StepResult.finish(float(len(action) % 2), "answer")
    return StepResult.next(f"seen {len(action)} chars at turn {self.turn}")


def tasks():
  i = 0
  while True:
    yield Task(id=f"t{i}", prompt=f"task {i}: solve the sum of {i} and {i + 3}", answer="",
               metadata=types.MappingProxyType({}))
    i += 1


def rollout(engine, *, overlap: bool, salt, release="finish", max_episodes=6, env_threads=4):
  LatencyEnv.salt = salt
  runner = EpisodeRunner(engine, CHAT, LatencyEnv, max_episodes=max_episodes,
                         env_threads=env_threads, overlap=overlap, release=release,
                         log=lambda text: None)
  try:
    done = run_to_completion(runner, tasks(), EPISODES, num_slots=8, seed=11)
  finally:
    runner.close()
  return done, runner


@pytest.fixture(scope="module")
def weights():
  return params()


# The paged engine with one prefill row bucket: with several, a continuation prefilled
# alone or beside others runs a different compiled program, and its behavior_logp can
# differ in the last float bits (measured: 1e-6; docs/explanation/episode-lifecycle.md).
@pytest.mark.parametrize("layout,changes", [
    ("dense", {}),
    pytest.param("paged", {"prefill_row_buckets": (4,)}, marks=pytest.mark.slow)])
def test_trajectories_do_not_depend_on_environment_latency(weights, layout, changes):
  engine = make_engine(sampler_cfg(layout, **changes), MODEL, weights, CHAT)
  engine.warmup()
  reference, _ = rollout(engine, overlap=False, salt=None)
  by_episode = {traj.info["episode"]: traj for traj in reference}
  assert sorted(by_episode) == list(range(EPISODES))
  assert all(traj.env_failure is None and traj.info["turns"] == 3 for traj in reference)
  orders = []
  for salt in (1, 2):
    done, runner = rollout(engine, overlap=True, salt=salt)
    orders.append([traj.info["episode"] for traj in done])
    assert sorted(orders[-1]) == list(range(EPISODES))
    for traj in done:
      ref = by_episode[traj.info["episode"]]
      assert traj.info["task"] == ref.info["task"]
      np.testing.assert_array_equal(traj.tokens, ref.tokens)
      np.testing.assert_array_equal(traj.action_mask, ref.action_mask)
      np.testing.assert_array_equal(traj.behavior_logp, ref.behavior_logp)
      np.testing.assert_array_equal(traj.rewards, ref.rewards)
  # The deterministic release order: start order, whatever the latencies.
  done, _ = rollout(engine, overlap=True, salt=3, release="start")
  assert [traj.info["episode"] for traj in done] == list(range(EPISODES))
  for traj in done:
    np.testing.assert_array_equal(traj.tokens, by_episode[traj.info["episode"]].tokens)


def test_a_parked_slot_keeps_its_cache_while_others_decode(weights):
  """Episode 0's turn ends; while it waits on its environment the engine decodes
  episode 1 for several steps; its continuation then prefills only the new tokens
  and samples what an immediate continuation samples."""
  cfg = sampler_cfg("dense")
  prompt = CHAT.prompt([{"role": "user", "content": "task 0: solve the sum"}])
  observation = CHAT.tokenizer.encode("seen 3 chars", add_special_tokens=False).ids

  def first_turn(engine):
    engine.submit(0, prompt, seed=5)
    while not (turns := engine.step()):
      pass
    assert [turn.episode_id for turn in turns] == [0]
    return turns[0]

  immediate = make_engine(cfg, MODEL, weights, CHAT)
  first_turn(immediate)
  immediate.submit(0, observation)
  while immediate.busy:
    immediate.step()
  expected = immediate.finish(0)

  engine = make_engine(cfg, MODEL, weights, CHAT)
  first_turn(engine)
  slot, cached = engine._episodes[0].slot, engine._episodes[0].cache_len
  engine.submit(1, prompt, seed=6, max_new_tokens=cfg.max_new_tokens)
  decodes = engine.stats["decode_calls"]
  for _ in range(3):
    engine.step()
  assert engine.stats["decode_calls"] - decodes >= 2  # episode 1 decoded meanwhile
  assert engine._owner[slot] == 0 and engine._episodes[0].cache_len == cached
  assert not engine._active_N[slot] and engine._episodes[0].state == "waiting"
  prefills = engine.stats["prefill_calls"]
  engine.submit(0, observation)
  engine.step()
  assert engine.stats["prefill_calls"] - prefills == 1  # the new tokens only (one chunk)
  while engine.busy:
    engine.step()
  got = engine.finish(0)
  np.testing.assert_array_equal(got.tokens, expected.tokens)
  np.testing.assert_array_equal(got.behavior_logp, expected.behavior_logp)


class SleepyEnv(LatencyEnv):
  """Every step sleeps `sleep_s`, counting how many run at once; "hang" tasks sleep long."""

  lock = threading.Lock()
  running = peak = 0
  sleep_s = 0.3

  def _step(self, action):
    with SleepyEnv.lock:
      SleepyEnv.running += 1
      SleepyEnv.peak = max(SleepyEnv.peak, SleepyEnv.running)
    try:
      time.sleep(30.0 if self.task.metadata.get("hang") else SleepyEnv.sleep_s)
    finally:
      with SleepyEnv.lock:
        SleepyEnv.running -= 1
    return StepResult.finish(1.0, "answer")


def scripted_runner(make_env=SleepyEnv, **kwargs):
  engine = scripted.ScriptedEngine(CHAT, lambda episode, turn: "seen")
  kwargs.setdefault("log", lambda text: None)
  return engine, EpisodeRunner(engine, CHAT, make_env, **kwargs)


def task(i, **metadata):
  return Task(id=f"t{i}", prompt=f"task {i}", answer="", metadata=types.MappingProxyType(metadata))


def test_decoding_goes_on_while_environments_step():
  """step() returns right after the engine step; it waits only when nothing can decode."""
  engine, runner = scripted_runner(max_episodes=4, env_threads=4)
  for i in range(2):
    runner.start(task(i), prompt_id=0, seed=i)
  begin = time.monotonic()
  assert runner.step() == []  # both turns handed to the step threads
  assert time.monotonic() - begin < SleepyEnv.sleep_s / 2
  assert runner.env_steps.pending == 2 and runner.in_flight == 2
  runner.start(task(2), prompt_id=0, seed=2)  # a new episode decodes meanwhile
  begin = time.monotonic()
  runner.step()
  assert time.monotonic() - begin < SleepyEnv.sleep_s / 2
  assert engine.episodes[2]["turns"] == 1 and runner.env_wait_s == 0.0
  done = runner.step()  # nothing can decode: waits for the first step to return
  while runner.in_flight:
    done += runner.step()
  assert sorted(traj.info["episode"] for traj in done) == [0, 1, 2]
  assert 0 < runner.env_wait_s < 3 * SleepyEnv.sleep_s
  runner.close()


class SlowDevice(scripted.ScriptedEngine):
  """A scripted engine whose decode calls take `call_s` on a pretend device (`ready`
  is False until then); records dispatch, complete and finish in order."""

  call_s = 1.0

  def __init__(self):
    super().__init__(CHAT, lambda episode, turn: "seen")
    self.events, self._since = [], 0.0

  def dispatch(self):
    self.events.append("dispatch")
    self._since = time.monotonic()
    return super().dispatch()

  def ready(self, step):
    return time.monotonic() - self._since >= self.call_s

  def complete(self, step):
    self.events.append("complete")
    return super().complete(step)

  def finish(self, episode_id):
    self.events.append(f"finish {episode_id}")
    return super().finish(episode_id)


def test_environment_outcomes_are_applied_while_the_decode_call_runs():
  """Host work overlaps the device: steps that return during a decode call are
  applied (here: their episodes finished) before the runner waits for the call."""
  engine = SlowDevice()
  runner = EpisodeRunner(engine, CHAT, SleepyEnv, max_episodes=4, env_threads=4,
                         log=lambda text: None)
  for i in range(2):
    runner.start(task(i), prompt_id=0, seed=i)
  runner.step()  # both turns end; their environment steps (0.3 s) start
  runner.start(task(2), prompt_id=0, seed=2)  # decodes in the next call
  done = runner.step()  # a 1 s call: both steps return within it
  last = engine.events[len(engine.events) - 1 - engine.events[::-1].index("dispatch"):]
  assert last[0] == "dispatch" and last[-1] == "complete", last
  assert sorted(last[1:-1]) == ["finish 0", "finish 1"], last
  assert sorted(traj.info["episode"] for traj in done) == [0, 1]
  while runner.in_flight:
    runner.step()
  runner.close()


def test_admission_waits_while_steps_wait_for_a_step_thread():
  SleepyEnv.peak = 0
  _, runner = scripted_runner(max_episodes=8, env_threads=2)
  for i in range(3):
    runner.start(task(i), prompt_id=0, seed=i)
  assert runner.can_start(5) and not runner.can_start(6)
  runner.step()  # three steps for two threads: one waits
  assert runner.env_steps.backlog == 1 and not runner.can_start()
  done = []
  while runner.in_flight:
    done += runner.step()
  assert len(done) == 3 and SleepyEnv.peak == 2 and runner.can_start(8)
  runner.close()


def test_a_step_past_the_timeout_fails_only_its_episode_and_frees_its_worker():
  closed = []

  class Closing(SleepyEnv):
    def close(self):
      closed.append(self.task.id)

  engine, runner = scripted_runner(Closing, max_episodes=4, env_threads=1, step_timeout_s=0.5)
  runner.start(task(0, hang=True), prompt_id=0, seed=0)
  runner.start(task(1), prompt_id=0, seed=1)
  begin = time.monotonic()
  done = []
  while runner.in_flight:
    done += runner.step()
  elapsed = time.monotonic() - begin
  by_task = {traj.info["task"]: traj for traj in done}
  hung, ok = by_task["t0"], by_task["t1"]
  assert hung.info["failure_kind"] == "StepTimeout" and "step_timeout_s=0.5" in hung.env_failure
  assert ok.env_failure is None and ok.outcome == 1.0
  # One thread: t1's step ran once the hung one was abandoned, not after its 30 s.
  assert elapsed < 0.5 + SleepyEnv.sleep_s + 1.0, elapsed
  assert runner.failures == {"StepTimeout": 1} and runner.env_steps.abandoned == 1
  assert runner.env_steps.stuck == 1 and not engine.episodes  # both slots freed
  time.sleep(0.05)  # the hung environment is closed on a thread of its own
  assert sorted(closed) == ["t0", "t1"]
  runner.close()


def test_close_ends_within_its_grace_with_steps_in_flight():
  closed = []

  class Closing(SleepyEnv):
    def close(self):
      closed.append(self.task.id)

  _, runner = scripted_runner(Closing, max_episodes=4, env_threads=4, close_grace_s=1.0)
  for i in range(3):
    runner.start(task(i, hang=i == 0), prompt_id=0, seed=i)
  runner.step()
  begin = time.monotonic()
  runner.close()
  assert time.monotonic() - begin < 2.0  # the 1 s grace; the hung step is abandoned
  time.sleep(0.05)
  assert sorted(closed) == ["t0", "t1", "t2"] and runner.in_flight == 0
  assert runner.env_steps.abandoned == 1


def test_env_steps_pool_bounds_orders_and_hands_over_what_a_step_raises():
  steps = EnvSteps(2, timeout_s=0.0)
  gate = threading.Event()
  for key in range(3):
    steps.submit(key, lambda key=key: gate.wait(5) and key * 10)
  assert steps.pending == 3 and steps.backlog == 1
  with pytest.raises(ValueError, match="already has an environment step"):
    steps.submit(0, lambda: None)
  assert steps.collect(wait=False) == []
  gate.set()
  got = []
  while steps.pending:
    got += steps.collect(wait=True)
  assert sorted(got) == [(0, 0), (1, 10), (2, 20)]
  steps.submit("bad", lambda: 1 / 0)
  [(key, error)] = steps.collect(wait=True)
  assert key == "bad" and isinstance(error, ZeroDivisionError)

  # Not Exceptions, and still the step's own (on a step thread only its code raises
  # them): the outcome of that step, never raised on the caller's thread.
  def interrupt():
    raise KeyboardInterrupt
  steps.submit("stop", interrupt)
  steps.submit("exit", lambda: sys.exit(2))
  got = []
  while steps.pending:
    got += steps.collect(wait=True)
  outcomes = dict(got)
  assert isinstance(outcomes["stop"], KeyboardInterrupt)
  assert isinstance(outcomes["exit"], SystemExit) and outcomes["exit"].code == 2
  with pytest.raises(ValueError, match="workers=0"):
    EnvSteps(0)


def test_env_steps_timeout_abandons_and_drops_a_late_result():
  steps = EnvSteps(1, timeout_s=0.2)
  release = threading.Event()
  steps.submit("slow", lambda: release.wait(5) and "late")
  steps.submit("next", lambda: "ok")
  [(key, error)] = steps.collect(wait=True)
  assert key == "slow" and isinstance(error, StepTimeout)
  assert steps.collect(wait=True) == [("next", "ok")]  # the freed worker ran it
  release.set()
  time.sleep(0.05)
  assert steps.collect(wait=False) == [] and steps.abandoned == 1 and steps.stuck == 0


def test_more_stuck_steps_than_step_threads_stop_the_process():
  """Steps that hang for good leak a thread per timeout; past the pool's own size
  `collect` raises, so the process ends and its threads with it. The pool's clock
  is the test's, moved past the timeout once each step has started on its thread
  (a step abandoned before any thread took it never runs and holds no thread)."""
  now = [0.0]
  steps = EnvSteps(2, timeout_s=1.0, clock=lambda: now[0])
  release = threading.Event()

  def hang(started):
    started.set()
    return release.wait(10)

  def time_out(key):
    started = threading.Event()
    steps.submit(key, lambda: hang(started))
    assert started.wait(10)
    now[0] += 1.0
    return steps.collect(wait=False)

  try:
    for key in range(2):
      [(got, error)] = time_out(key)
      assert got == key and isinstance(error, StepTimeout)
    assert steps.stuck == 2  # as many as the pool's threads: tolerated
    with pytest.raises(StuckSteps, match=r"3 environment steps still run past "
                       r"env.step_timeout_s=1 s.*the pool's 2 step threads"):
      time_out(2)
  finally:
    release.set()
  deadline = time.monotonic() + 10
  while steps.stuck and time.monotonic() < deadline:
    time.sleep(0.01)
  assert steps.stuck == 0  # a hang that ends frees its thread
  steps.submit(3, lambda: "ok")
  assert steps.collect(wait=True) == [(3, "ok")]


def test_release_order_and_timeouts_are_validated():
  with pytest.raises(ValueError, match="sampler.release_order='random' is invalid"):
    C.SamplerConfig(release_order="random").validate()
  with pytest.raises(ValueError, match="env.step_timeout_s=-1 is invalid"):
    C.EnvConfig(step_timeout_s=-1).validate()
  with pytest.raises(ValueError, match="release='random'"):
    scripted_runner(max_episodes=1, release="random")
