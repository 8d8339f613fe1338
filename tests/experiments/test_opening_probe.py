"""The opening probe's arithmetic: the forced tokens become actions, and its bias
column is the lambda-weighted critic error along the path (module docstring)."""

import numpy as np
import jax
import jax.numpy as jnp

from experiments import opening_probe
from sao_jax import config as C
from sao_jax.data.records import Trajectory
from sao_jax.learner import state as state_lib

MODEL = C.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, logits_chunk=8)


def traj(seed: int, prompt: int, turns: tuple[int, ...], outcome: float) -> Trajectory:
  """`prompt` tokens, then action turns separated by 2 observation tokens."""
  rng = np.random.default_rng(seed)
  mask = [0] * prompt
  for i, n in enumerate(turns):
    mask += ([0, 0] if i else []) + [1] * n
  mask = np.array(mask, np.int8)
  rewards = np.zeros(mask.size, np.float32)
  rewards[np.flatnonzero(mask)[-1]] = outcome
  return Trajectory(rng.integers(0, 64, mask.size).astype(np.int32), mask,
                    np.zeros(mask.size, np.float32), rewards, 0, (0, 0))


def test_forced_tokens_before_the_first_action_become_actions():
  t = traj(0, 6, (3,), 1.0)
  forced = opening_probe._with_forced_actions(t, 2)
  np.testing.assert_array_equal(forced.action_mask, [0, 0, 0, 0, 1, 1, 1, 1, 1])
  assert forced.outcome == 1.0


def test_bias_is_the_lambda_weighted_critic_error_along_the_path():
  cfg = C.Config(model=MODEL, algorithm=C.AlgorithmConfig.for_variant("sao"),
                 learner=C.LearnerConfig(batch_trajectories=4)).validate()
  state = state_lib.init_state(cfg, jax.random.key(0))
  trajs = [traj(1, 4, (5,), 1.0), traj(2, 3, (2, 4), 0.0), traj(3, 5, (3, 1, 2), 1.0)]
  got = opening_probe.opening_advantages(cfg, state, trajs)
  from sao_jax.models.forward import value_forward
  forward = jax.jit(lambda params, tokens: value_forward(params, cfg.model, tokens,
                                                        jnp.ones(tokens.shape, jnp.int32)))
  for i, t in enumerate(trajs):
    values = np.asarray(forward(state.value_params, t.tokens[None]))[0]
    v = values[t.action_mask.astype(bool)]  # V_k over the action tokens, k = 0..K-1
    lam = 1 - 1 / (cfg.algorithm.lam_alpha * v.size)  # SAO.md §3
    g = t.outcome
    want = (1 - lam) * sum(lam ** (k - 1) * (v[k] - g) for k in range(1, v.size))
    np.testing.assert_allclose(got["a_gae"][i] - got["a_mc"][i], want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["a_mc"][i], g - v[0], rtol=1e-5)
    assert got["g"][i] == g
