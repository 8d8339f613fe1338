"""Recorded behavior_logp == the learner's policy_forward(temperature=T); weight versions."""

import re

import jax
import numpy as np
import pytest

from engine_fixtures import MODEL, detokenize, engine, params, prompts, run, with_sampler
from sao_jax.models import forward

PAD_TO = 96  # one learner shape for every trajectory: one compilation
policy_forward = jax.jit(forward.policy_forward, static_argnums=1)


@pytest.fixture(scope="module")
def weights():
  return params(0)


def _learner_logp(weights, trajectory, temperature):
  tokens = np.zeros((1, PAD_TO), np.int32)
  mask = np.zeros((1, PAD_TO), np.int32)
  t = len(trajectory.tokens)
  tokens[0, :t], mask[0, :t] = trajectory.tokens, 1
  out = policy_forward(weights, MODEL, tokens, mask, np.float32(temperature))
  return np.asarray(out.logp_BxT)[0, :t]


# T = 0.7 also truncates (top-k, top-p): behavior_logp stays the untruncated log-prob.
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 12, 0.9)])
def test_multi_turn_behavior_logp_matches_policy_forward(weights, temperature, top_k, top_p):
  pattern = re.escape(detokenize([9]))  # a one-token "tool call" stop
  eng = engine(weights, with_sampler(temperature=temperature, top_k=top_k, top_p=top_p,
                                     stop_patterns=(pattern,)))
  for i, prompt in enumerate(prompts(4)):
    eng.submit(i, prompt, seed=i, max_new_tokens=10)
  trajectories = []
  observations = {i: [[1, 2, 3], list(range(20, 40)), []] for i in range(4)}
  while eng.busy:  # up to 4 turns each, observations appended between turns
    for turn in eng.step():
      left = observations[turn.episode_id]
      if left:
        eng.submit(turn.episode_id, left.pop(0))
      else:
        trajectories.append(eng.finish(turn.episode_id))
  assert {t.num_turns for t in trajectories} == {4}
  for trajectory in trajectories:
    learner = _learner_logp(weights, trajectory, temperature)
    on = trajectory.action_mask == 1
    np.testing.assert_allclose(trajectory.behavior_logp[on], learner[on], atol=1e-4)
    assert not trajectory.behavior_logp[~on].any()


def test_in_flight_weight_update_records_both_versions(weights):
  eng = engine(weights, with_sampler(max_new_tokens=13))
  eng.submit(0, prompts(2)[1], seed=5)  # prompt 8 tokens; no stop token among the first 5
  assert eng.step() == []  # prefill samples 1 token, one decode call samples 4
  new_weights = params(1)
  eng.set_params(new_weights, 1)
  (turn,) = run(eng)
  assert turn.policy_versions == (0, 1) and len(turn.tokens) > 5
  trajectory = eng.finish(0)
  assert trajectory.policy_versions == (0, 1)
  # The first 5 sampled tokens came from version 0 and are scored by its weights; later
  # ones are not (version 1 read a cache version 0 wrote: the usual in-flight mix).
  first5 = slice(8, 13)
  np.testing.assert_allclose(trajectory.behavior_logp[first5],
                             _learner_logp(weights, trajectory, 1.0)[first5], atol=1e-4)
  assert not np.allclose(trajectory.behavior_logp[13:],
                         _learner_logp(weights, trajectory, 1.0)[13:], atol=1e-2)
