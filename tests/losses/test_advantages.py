"""GRPO and running-mean baselines (docs/algorithm.md §5)."""

import jax
import numpy as np

from sao_jax import losses


def outcome_batch(outcomes, length=5):
  """Trajectories whose outcome sits on their last action token."""
  rewards = np.zeros((len(outcomes), length), np.float32)
  mask = np.zeros((len(outcomes), length), bool)
  mask[:, 1:4] = True
  rewards[:, 3] = outcomes
  rewards[:, 4] = 7.0  # off the mask: never counted
  return rewards, mask


def test_grpo_by_hand():
  rewards, mask = outcome_batch([1, 0, 0, 1, 2, 2, 5])
  group_ids = np.array([0, 0, 0, 0, 1, 1, 6])
  adv = np.asarray(jax.jit(losses.grpo_advantages)(rewards, mask, group_ids))
  std = np.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
  expected_B = np.array([0.5, -0.5, -0.5, 0.5, 0, 0, 0]) / np.array([std + 1e-6] * 4 + [1] * 3)
  np.testing.assert_allclose(adv[:, 1:4], np.repeat(expected_B[:, None], 3, 1), rtol=1e-6)
  assert np.all(adv[:, [0, 4]] == 0)
  assert np.all(adv[6] == 0)  # a group of one has no baseline signal


def test_running_mean_per_prompt_window():
  state = losses.init_running_mean(num_slots=3, window=2)
  step = jax.jit(losses.running_mean_advantages, static_argnames="scope")
  rewards, mask = outcome_batch([1, 0, 4])
  adv, state = step(rewards, mask, np.array([0, 0, 2]), state, scope="prompt")
  # Empty windows: baseline 0 for everyone in the first batch.
  np.testing.assert_allclose(np.asarray(adv)[:, 2], [1, 0, 4])
  rewards, mask = outcome_batch([1, 1, 1, 0])
  adv, state = step(rewards, mask, np.array([0, 2, 1, 0]), state, scope="prompt")
  # prompt 0 window [1, 0] -> 0.5 ; prompt 2 [4] -> 4 ; prompt 1 empty -> 0
  np.testing.assert_allclose(np.asarray(adv)[:, 2], [0.5, -3, 1, -0.5])
  # prompt 0 saw 1, 0, 1, 0: the window of 2 keeps the last two (1, 0), ring order aside.
  np.testing.assert_allclose(sorted(np.asarray(state.window_PxW)[0]), [0, 1])
  np.testing.assert_array_equal(state.count_P, [4, 1, 2])


def test_running_mean_global_window_wraps():
  state = losses.init_running_mean(num_slots=1, window=3)
  for outcomes in ([1, 2], [3, 4]):
    rewards, mask = outcome_batch(outcomes)
    adv, state = losses.running_mean_advantages(rewards, mask, np.array([5, 9]), state,
                                                scope="global")
  # Second batch baseline: mean(1, 2) = 1.5; then the window holds the last 3: 2, 3, 4.
  np.testing.assert_allclose(np.asarray(adv)[:, 1], [1.5, 2.5])
  rewards, mask = outcome_batch([0])
  adv, _ = losses.running_mean_advantages(rewards, mask, np.array([0]), state, scope="global")
  np.testing.assert_allclose(np.asarray(adv)[0, 1], -3.0)


def test_running_mean_ignores_padding_rows():
  state = losses.init_running_mean(num_slots=2, window=4)
  rewards, mask = outcome_batch([1, 0])
  mask[1] = False  # an empty padding row, with a negative id as the pipeline writes it
  adv, state = losses.running_mean_advantages(rewards, mask, np.array([1, -2]), state)
  np.testing.assert_array_equal(state.count_P, [0, 1])
  assert np.all(np.asarray(adv)[1] == 0)
