"""Independent references shared by the GAE tests: a Python loop over action
positions (docs/algorithm.md §3) and random masked traces."""

import numpy as np


def loop_reference(rewards, values, mask, gamma, lam):
  """docs/algorithm.md §3 literally: a Python loop over the action positions t_1 < ... < t_K."""
  advantages = np.zeros(rewards.shape, np.float64)
  returns = np.zeros(rewards.shape, np.float64)
  for b in range(rewards.shape[0]):
    lam_b = lam[b] if np.ndim(lam) else lam
    positions = np.flatnonzero(mask[b])
    next_value, next_adv = 0.0, 0.0
    for t in positions[::-1]:
      delta = rewards[b, t] + gamma * next_value - values[b, t]
      next_adv = delta + gamma * lam_b * next_adv
      next_value = values[b, t]
      advantages[b, t] = next_adv
      returns[b, t] = next_adv + values[b, t]
  return advantages, returns


def random_trajectories(rng, batch, length):
  """Prompt, alternating action/observation turns (incl. single-token turns), padding."""
  mask = np.zeros((batch, length), bool)
  for b in range(batch):
    t = rng.integers(0, 4)  # prompt
    end = rng.integers(length // 2, length + 1)  # right padding after `end`
    while t < end:
      turn = rng.integers(1, 5)  # 1 = single-token turn
      mask[b, t:min(t + turn, end)] = True
      t += turn + rng.integers(0, 4)  # observation gap, possibly empty
  mask[-1] = False  # an all-masked row
  rewards = rng.normal(size=(batch, length)).astype(np.float32)
  values = rng.normal(size=(batch, length)).astype(np.float32)
  return rewards, values, mask
