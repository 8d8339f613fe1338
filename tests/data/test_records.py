"""Trajectory validation and the record encoding."""

import numpy as np
import pytest

from sao_jax.data import records
from traj_factory import make_traj


def test_valid_trajectory_has_no_problems():
  assert records.problems(make_traj(), vocab_size=50) == []


@pytest.mark.parametrize("change,reason", [
    (lambda t: t.behavior_logp.__setitem__(-1, np.nan), "nan_logp"),
    (lambda t: t.behavior_logp.__setitem__(0, -1.0), "bad_logp"),
    (lambda t: t.rewards.__setitem__(0, 1.0), "reward_off_action"),
    (lambda t: t.rewards.__setitem__(-1, np.inf), "nan_reward"),
    (lambda t: t.action_mask.__setitem__(slice(None), 0), "no_action_tokens"),
    (lambda t: t.tokens.__setitem__(0, 99), "token_out_of_range"),
])
def test_malformed_trajectories_are_named(change, reason):
  traj = make_traj()
  change(traj)
  assert reason in records.problems(traj, vocab_size=50)


def test_shape_mismatch_and_empty():
  traj = make_traj()
  traj.rewards = traj.rewards[:-1]
  assert records.problems(traj) == ["bad_shape"]
  empty = make_traj(length=0)
  assert records.problems(empty) == ["empty"]
  assert "bad_versions" in records.problems(make_traj(versions=(3, 2)))


def test_bytes_round_trip():
  traj = make_traj(prompt_id=7, versions=(2, 5), env_failure=None, info={"task": "t-1", "turns": 3})
  back = records.from_bytes(records.to_bytes(traj))
  for name in records.ARRAYS:
    np.testing.assert_array_equal(getattr(back, name), getattr(traj, name))
    assert getattr(back, name).dtype == getattr(traj, name).dtype
  assert (back.prompt_id, back.policy_versions, back.info) == (7, (2, 5), traj.info)
  assert back.outcome == traj.outcome == 1.0
