"""The exactness check the engine tests share: two rollouts ({episode: Trajectory}) hold
the same episodes with the same tokens and action masks, and behaviour log-probs within
1e-5 (float32), each episode of `turns` turns."""

import numpy as np


def assert_same_trajectories(got: dict, want: dict, episodes: int, turns: int) -> None:
  assert sorted(got) == sorted(want) == list(range(episodes))
  for i in want:
    np.testing.assert_array_equal(got[i].tokens, want[i].tokens, err_msg=f"episode {i}")
    np.testing.assert_array_equal(got[i].action_mask, want[i].action_mask)
    np.testing.assert_allclose(got[i].behavior_logp, want[i].behavior_logp, rtol=0, atol=1e-5,
                               err_msg=f"episode {i}")
    assert got[i].num_turns == want[i].num_turns == turns
