"""Skip-observation GAE against independent references (docs/algorithm.md §3)."""

import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from gae_reference import loop_reference, random_trajectories
from sao_jax import losses


@pytest.mark.parametrize("method", ["auto", "associative", "scan"])
@pytest.mark.parametrize("gamma", [1.0, 0.95])
def test_matches_python_loop_on_masked_traces(method, gamma):
  rng = np.random.default_rng(0)
  rewards, values, mask = random_trajectories(rng, batch=6, length=40)
  lam = losses.length_adaptive_lam(jnp.asarray(mask), alpha=1.5)
  adv, ret = jax.jit(losses.gae, static_argnames="method")(
      rewards, values, mask, gamma=gamma, lam=lam, method=method)
  ref_adv, ref_ret = loop_reference(rewards, values, mask, gamma, np.asarray(lam))
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(adv)[~mask] == 0) and np.all(np.asarray(ret)[~mask] == 0)
  assert np.all(np.asarray(adv)[-1] == 0)  # the all-masked row


@pytest.mark.parametrize("method", ["auto", "associative", "scan"])
def test_all_ones_mask_matches_rlax(method):
  rng = np.random.default_rng(1)
  batch, length, gamma, lam = 4, 33, 0.97, 0.9
  rewards = rng.normal(size=(batch, length)).astype(np.float32)
  values = rng.normal(size=(batch, length)).astype(np.float32)
  adv, ret = losses.gae(rewards, values, np.ones((batch, length), bool), gamma=gamma, lam=lam,
                        method=method)
  for b in range(batch):
    # rlax wants V_0..V_T; the terminal value is 0.
    ref = rlax.truncated_generalized_advantage_estimation(
        rewards[b], jnp.full((length,), gamma), lam, jnp.append(values[b], 0.0))
    np.testing.assert_allclose(adv[b], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret[b], ref + values[b], rtol=1e-5, atol=1e-5)


@hypothesis.settings(deadline=None, max_examples=40)
@hypothesis.given(
    mask=hnp.arrays(bool, st.integers(1, 24)),
    seed=st.integers(0, 2**16),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_equals_plain_gae_on_compacted_sequence(mask, seed, gamma, lam):
  """The defining property: observations behave as if they were not there."""
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=mask.shape).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  adv, ret = losses.gae(rewards[None], values[None], mask[None], gamma=gamma, lam=lam)
  if not mask.any():
    assert np.all(np.asarray(adv) == 0)
    return
  compact = lambda x: x[mask][None]
  plain_adv, plain_ret = losses.gae(compact(rewards), compact(values),
                                    np.ones((1, mask.sum()), bool), gamma=gamma, lam=lam)
  np.testing.assert_allclose(np.asarray(adv)[0][mask], plain_adv[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ret)[0][mask], plain_ret[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch,length", [(8, 4096), (2, 32768), (1, 131072)])
def test_scan_and_associative_agree_on_long_traces(batch, length):
  rng = np.random.default_rng(length)
  mask = rng.random((batch, length)) < 0.3  # ~70% observation tokens
  values = rng.uniform(0, 1, (batch, length)).astype(np.float32)
  rewards = np.zeros((batch, length), np.float32)
  last = length - 1 - np.argmax(mask[:, ::-1], axis=1)
  rewards[np.arange(batch), last] = rng.integers(0, 2, batch)  # outcome on last action
  lam = losses.length_adaptive_lam(jnp.asarray(mask), alpha=1.5)
  run = jax.jit(losses.gae, static_argnames="method")
  adv_scan, ret_scan = run(rewards, values, mask, gamma=1.0, lam=lam, method="scan")
  adv_assoc, ret_assoc = run(rewards, values, mask, gamma=1.0, lam=lam, method="associative")
  np.testing.assert_allclose(adv_assoc, adv_scan, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret_assoc, ret_scan, rtol=1e-5, atol=1e-5)


def test_gap_costs_no_discount():
  # Action, 3 observation tokens, action with the outcome: the first action's
  # advantage sees the second value discounted once, not four times.
  rewards = np.array([[0.0, 0, 0, 0, 1.0]], np.float32)
  values = np.array([[0.2, 9, 9, 9, 0.5]], np.float32)
  mask = np.array([[1, 0, 0, 0, 1]], bool)
  adv, ret = losses.gae(rewards, values, mask, gamma=0.5, lam=1.0)
  # A_2 = 1 - 0.5 = 0.5 ; A_1 = (0 + 0.5 * 0.5 - 0.2) + 0.5 * 1 * 0.5 = 0.3
  np.testing.assert_allclose(adv, [[0.3, 0, 0, 0, 0.5]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0.5, 0, 0, 0, 1.0]], atol=1e-6)


def test_critic_targets_with_gamma_one_are_the_outcome():
  rng = np.random.default_rng(3)
  _, values, mask = random_trajectories(rng, batch=4, length=30)
  rewards = np.zeros_like(values)
  for b in range(3):
    rewards[b, np.flatnonzero(mask[b])[-1]] = 1.0
  _, ret = losses.gae(rewards, values, mask, gamma=1.0, lam=1.0)
  np.testing.assert_allclose(np.asarray(ret)[mask], 1.0, atol=1e-5)


def test_length_adaptive_lam():
  mask = np.zeros((3, 10), bool)
  mask[0, :2] = True
  mask[1, :] = True
  lam = losses.length_adaptive_lam(jnp.asarray(mask), alpha=1.5)
  np.testing.assert_allclose(lam, [1 - 1 / 3, 1 - 1 / 15, 0.0], rtol=1e-6)


def test_bad_inputs_name_the_problem():
  x = np.zeros((2, 5), np.float32)
  with pytest.raises(ValueError, match="method='fast'"):
    losses.gae(x, x, x, gamma=1.0, lam=1.0, method="fast")
  with pytest.raises(ValueError, match=r"\(2, 4\)"):
    losses.gae(x, x[:, :4], x, gamma=1.0, lam=1.0)
  with pytest.raises(ValueError, match=r"lam has shape \(3,\)"):
    losses.gae(x, x, x, gamma=1.0, lam=jnp.ones(3))
