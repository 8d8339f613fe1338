"""Builds valid (or deliberately broken) trajectories for the data tests, and a list transport."""

import numpy as np

from sao_jax.types import Trajectory


def make_traj(length=10, prompt_id=0, versions=(5, 5), outcome=1.0, seed=0, **changes):
  rng = np.random.default_rng(seed)
  action = np.zeros(length, np.int8)
  action[length // 2:] = 1
  logp = np.where(action, -rng.uniform(0.1, 3.0, length), 0.0).astype(np.float32)
  rewards = np.zeros(length, np.float32)
  if length:
    rewards[-1] = outcome
  fields = dict(tokens=rng.integers(0, 50, length).astype(np.int32), action_mask=action,
                behavior_logp=logp, rewards=rewards, prompt_id=prompt_id,
                policy_versions=tuple(versions))
  fields.update(changes)
  return Trajectory(**fields)


class ListTransport:
  """A transport over a fixed list (closed once drained)."""

  def __init__(self, trajs):
    self.trajs = list(trajs)
    self.closed = True

  def get(self, timeout=0.0):
    return self.trajs.pop(0) if self.trajs else None
