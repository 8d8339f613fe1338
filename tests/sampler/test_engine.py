"""The engine: continuous batching == one-at-a-time, slot refill, turn ends, no recompiles."""

import re

import jax
import numpy as np
import pytest

from sao_jax.sampler.paged_engine import PagedEngine

from engine_fixtures import (CHARS, SAMPLER, STOP, VOCAB, detokenize, engine, params, prompts,
                             run, with_sampler)

MAX_NEW = [2, 24, 5, 17, 9, 24, 3, 12]  # very different turn lengths


@pytest.fixture(scope="module")
def weights():
  return params(0)


def _submit_all(eng, n):
  for i, prompt in enumerate(prompts(n)):
    eng.submit(i, prompt, seed=100 + i, max_new_tokens=MAX_NEW[i])


def test_continuous_batching_matches_one_at_a_time(weights):
  batched = engine(weights)
  _submit_all(batched, len(MAX_NEW))  # 8 episodes on 3 slots
  turns = {t.episode_id: t for t in run(batched)}
  assert sorted(turns) == list(range(len(MAX_NEW)))

  sequential_steps = 0
  for i, prompt in enumerate(prompts(len(MAX_NEW))):
    alone = engine(weights)
    alone.submit(i, prompt, seed=100 + i, max_new_tokens=MAX_NEW[i])
    (turn,) = run(alone)
    sequential_steps += alone.stats["decode_steps"]
    np.testing.assert_array_equal(turns[i].tokens, turn.tokens, err_msg=f"episode {i}")
    np.testing.assert_array_equal(turns[i].behavior_logp, turn.behavior_logp)
    assert turns[i].finish_reason == turn.finish_reason
    trajectory = batched.finish(i)
    np.testing.assert_array_equal(trajectory.tokens, np.concatenate([prompt, turn.tokens]))
    np.testing.assert_array_equal(trajectory.action_mask, [0] * len(prompt) + [1] * len(turn.tokens))
    np.testing.assert_array_equal(trajectory.behavior_logp[len(prompt):], turn.behavior_logp)
    assert not trajectory.behavior_logp[:len(prompt)].any()
  # Finished slots were refilled while long turns kept decoding.
  assert batched.stats["decode_steps"] < sequential_steps / 2
  reasons = {t.finish_reason for t in turns.values()}
  assert reasons == {"stop_token", "max_new_tokens"}, reasons


def test_stop_token_and_max_new_tokens_end_turns(weights):
  eng = engine(weights)
  _submit_all(eng, len(MAX_NEW))
  for turn in run(eng):
    tokens = turn.tokens.tolist()
    if turn.finish_reason == "stop_token":
      assert tokens.index(STOP) == len(tokens) - 1  # kept, and only at the end
    else:
      assert turn.finish_reason == "max_new_tokens" and STOP not in tokens
      assert len(tokens) == MAX_NEW[turn.episode_id]


def test_max_seq_len_ends_the_turn(weights):
  eng = engine(weights)
  eng.submit("a", np.arange(SAMPLER.max_seq_len - 8) % VOCAB, seed=0, max_new_tokens=50)
  (turn,) = run(eng)
  assert turn.finish_reason == "max_seq_len" and len(turn.tokens) == 8
  assert eng.room("a") == -1
  with pytest.raises(ValueError, match="exceed the -1 left by sampler.max_seq_len=96"):
    eng.submit("a", [1])


def test_stop_pattern_ends_the_turn_at_the_completing_token(weights):
  free = engine(weights)
  free.submit(0, prompts(1)[0], seed=3, max_new_tokens=12)
  (reference,) = run(free)
  assert len(reference.tokens) == 12
  text = detokenize(reference.tokens)
  pattern = re.escape(text[5:7])  # completed by token 6, inside the second decode call
  expected = next(n for n in range(1, 13) if re.search(pattern, text[:n]))

  eng = engine(weights, with_sampler(stop_patterns=(pattern,)))
  eng.submit(0, prompts(1)[0], seed=3, max_new_tokens=12)
  (turn,) = run(eng)
  assert turn.finish_reason == "stop_pattern"
  np.testing.assert_array_equal(turn.tokens, reference.tokens[:expected])
  # The overshoot is gone from the trajectory and the episode continues from the cut.
  eng.submit(0, [1, 2])
  run(eng)
  trajectory = eng.finish(0)
  cut = len(prompts(1)[0]) + expected
  np.testing.assert_array_equal(trajectory.tokens[:cut + 2],
                                np.concatenate([prompts(1)[0], turn.tokens, [1, 2]]))
  assert trajectory.num_turns == 2


def test_stop_patterns_decode_each_token_a_bounded_number_of_times(weights):
  """The turn's text grows with each decode call: decoding the whole turn per call (the
  old check) cost ~n^2/2 token decodes for an n-token turn, 4,000 here."""
  decoded = []
  def counting(ids):
    decoded.append(len(ids))
    return detokenize(ids)
  eng = engine(weights, with_sampler(stop_patterns=("!",), steps_per_call=1),
               stop_token_ids=(), detokenize=counting)
  eng.submit(0, prompts(1)[0], seed=3, max_new_tokens=90)
  (turn,) = run(eng)
  assert len(turn.tokens) == 90 and turn.finish_reason == "max_new_tokens"
  assert sum(decoded) <= 4 * 90, sum(decoded)


def test_a_stop_pattern_ends_the_turn_where_the_full_decode_does_before_a_split_character(
    weights):
  """The pattern is completed by token 3, in the decode call whose last token (4) starts a
  character that a later token completes (its text alone ends in U+FFFD, as a byte-level
  BPE lead byte's does). The full-decode check ended the turn at token 4; the old
  TurnText held that whole call back and ended it a call later."""
  free = engine(weights)
  free.submit(0, prompts(1)[0], seed=3, max_new_tokens=12)
  (reference,) = run(free)
  split = int(reference.tokens[4])  # the first decode call holds tokens 1..4
  def decode(ids):
    ids = list(ids)
    return "".join(("\ufffd" if k == len(ids) - 1 else "é") if i == split else CHARS[i]
                   for k, i in enumerate(ids))
  pattern = re.escape(decode(reference.tokens[:4])[2:4])
  expected = next(n for n in range(1, 13) if re.search(pattern, decode(reference.tokens[:n])))
  assert expected == 4, expected  # the pattern is new in token 3, as the test needs

  eng = engine(weights, with_sampler(stop_patterns=(pattern,)), detokenize=decode)
  eng.submit(0, prompts(1)[0], seed=3, max_new_tokens=12)
  (turn,) = run(eng)
  assert turn.finish_reason == "stop_pattern"
  np.testing.assert_array_equal(turn.tokens, reference.tokens[:expected])


def test_parked_and_evicted_continuations_agree(weights):
  """Episode 0's second turn: from its parked cache, or re-prefilled after eviction."""
  def two_turns(evict):
    eng = engine(weights)
    eng.submit(0, prompts(3)[2], seed=9, max_new_tokens=6)  # 15 tokens: one chunk
    run(eng)
    if evict:  # three new episodes take the two empty slots and evict episode 0's
      for i in range(1, 4):
        eng.submit(i, [i], seed=i, max_new_tokens=2)
      run(eng)
    eng.submit(0, [7, 8, 9], max_new_tokens=10)
    run(eng)
    return eng.finish(0), eng.stats["prefill_calls"]

  parked, parked_prefills = two_turns(evict=False)
  evicted, evicted_prefills = two_turns(evict=True)
  np.testing.assert_array_equal(parked.tokens, evicted.tokens)
  np.testing.assert_allclose(parked.behavior_logp, evicted.behavior_logp, atol=1e-5)
  assert parked.num_turns == evicted.num_turns == 2
  # Parked: the prompt, then the 4 new tokens (last sampled + observation) in one chunk.
  # Evicted: the prompt, 3 other episodes, then all 24 tokens again in two chunks.
  assert (parked_prefills, evicted_prefills) == (2, 1 + 3 + 2)


@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_host_work_between_dispatch_and_complete_changes_nothing(weights, layout):
  """The runner's host work while a decode call runs (finishing a parked episode,
  submitting the next turn of another) gives the tokens and behavior_logp of doing
  it after the call; a weight update or finishing a decoding episode in between is
  refused."""
  def play(between: bool):
    eng = (engine(weights) if layout == "dense" else engine(
        weights, with_sampler(kv_layout="paged", slots=3, kv_page_size=8, kv_pages=36),
        engine_cls=PagedEngine))
    eng.submit(0, prompts(3)[2], seed=9, max_new_tokens=2)
    eng.submit(1, prompts(3)[1], seed=8, max_new_tokens=2)
    run(eng)  # both turns end: parked
    eng.submit(2, prompts(3)[0], seed=7, max_new_tokens=20)
    assert not eng.overlaps_host  # the CPU backend: the runner does not wait in between
    pending = eng.dispatch()  # episode 2 decodes
    host_work = lambda: (eng.finish(0), eng.submit(1, [5, 6], max_new_tokens=4))
    if between:
      finished, _ = host_work()
      with pytest.raises(RuntimeError, match="set_params while a decode call is in flight"):
        eng.set_params(weights, 1)
      with pytest.raises(RuntimeError, match=r"finish\(2\) while the decode call in flight"):
        eng.finish(2)
      with pytest.raises(RuntimeError, match="dispatch while a decode call is in flight"):
        eng.dispatch()
    turns = eng.complete(pending)
    if not between:
      finished, _ = host_work()
    with pytest.raises(RuntimeError, match="the step the last dispatch"):
      eng.complete(pending)
    turns += run(eng)
    return finished, {t.episode_id: t for t in turns}, eng.finish(1), eng.finish(2)

  after, overlapped = play(between=False), play(between=True)
  assert sorted(after[1]) == sorted(overlapped[1]) == [1, 2]
  for a, b in zip([after[0], *after[2:]], [overlapped[0], *overlapped[2:]]):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.behavior_logp, b.behavior_logp)
  np.testing.assert_array_equal(after[1][2].tokens, overlapped[1][2].tokens)


def test_no_recompilation_after_warmup(weights):
  compiles = []

  def on_event(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(kwargs.get("fun_name"))

  eng = engine(weights)
  eng.warmup()
  new_weights = jax.tree.map(lambda x: x * 1.01, weights)
  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    _submit_all(eng, len(MAX_NEW))
    for turn in run(eng):
      if turn.episode_id % 2:
        eng.submit(turn.episode_id, np.arange(turn.episode_id * 3) % VOCAB)
      else:
        eng.finish(turn.episode_id)
    run(eng)
    eng.set_params(new_weights, 1)
    eng.submit("late", np.arange(40) % VOCAB, seed=1)
    run(eng)
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
  assert compiles == []
  assert eng.stats["prefill_calls"] > len(MAX_NEW)


def test_submit_errors(weights):
  eng = engine(weights)
  with pytest.raises(ValueError, match="seed=None is invalid"):
    eng.submit("x", [1, 2])
  with pytest.raises(ValueError, match="the prompt is empty"):
    eng.submit("x", [], seed=0)
  eng.submit("x", [1, 2], seed=0)
  with pytest.raises(ValueError, match="'x' is queued"):
    eng.submit("x", [3])
  with pytest.raises(ValueError, match="unknown episode 'y'"):
    eng.finish("y")
  with pytest.raises(ValueError, match=r"ids in \[0, 64\)"):
    eng.submit("z", [VOCAB], seed=0)
  with pytest.raises(ValueError, match="max_new_tokens=0 is invalid"):
    eng.submit("z", [1], seed=0, max_new_tokens=0)
  with pytest.raises(ValueError, match="stop_patterns"):
    engine(weights, with_sampler(stop_patterns=("x",)), detokenize=None)
