"""Clipped value loss and explained variance (docs/algorithm.md §4)."""

import jax
import numpy as np
import pytest

from sao_jax import losses


def test_clipped_value_loss_by_hand():
  values = np.array([[1.0, 0.6, 1.5, 9.0]], np.float32)
  old = np.array([[0.5, 1.0, 1.0, 0.0]], np.float32)
  returns = np.array([[0.0, 1.0, 2.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 1, 0]], bool)
  # token 0: (1-0)^2=1 vs (0.7-0)^2=.49 -> .5 ; token 1: .16 vs (.8-1)^2=.04 -> .08
  # token 2: .25 vs (1.2-2)^2=.64 -> .32, clipped branch (no gradient); token 3 off the mask.
  loss_fn = lambda v: losses.value_loss(v, old, returns, mask, clip_eps=0.2)
  (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(values)
  np.testing.assert_allclose(loss, (0.5 + 0.08 + 0.32) / 3, rtol=1e-5)
  np.testing.assert_allclose(grad, [[1.0 / 3, -0.4 / 3, 0.0, 0.0]], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["value_clip_frac"], 1 / 3, rtol=1e-6)


def test_unclipped_value_loss():
  values = np.array([[1.0, 3.0]], np.float32)
  returns = np.array([[0.0, 1.0]], np.float32)
  loss, metrics = losses.value_loss(values, values + 100, returns, np.ones((1, 2), bool),
                                    clip_eps=None)
  np.testing.assert_allclose(loss, (0.5 * 1 + 0.5 * 4) / 2)
  assert metrics["value_clip_frac"] == 0


def test_explained_variance_matches_numpy():
  rng = np.random.default_rng(0)
  returns = rng.normal(size=(3, 50)).astype(np.float32)
  values = (returns + 0.5 * rng.normal(size=(3, 50))).astype(np.float32)
  mask = rng.random((3, 50)) < 0.5
  g, v = returns[mask].astype(np.float64), values[mask].astype(np.float64)
  expected = 1 - np.var(g - v) / np.var(g)
  np.testing.assert_allclose(losses.explained_variance(values, returns, mask), expected,
                             rtol=1e-5)
  perfect = losses.explained_variance(returns, returns, mask)
  np.testing.assert_allclose(perfect, 1.0)


def test_explained_variance_is_undefined_when_returns_do_not_vary():
  assert np.isnan(losses.explained_variance(np.ones((1, 4)), np.ones((1, 4)), np.ones((1, 4))))
  # All rewards 0 with a bootstrapped critic target: returns differ only by rounding
  # noise, which used to be divided by (a -7e8 metric).
  returns = np.float32(1e-6) * np.array([[0.0, 1.0, 2.0, 3.0]], np.float32)
  values = np.array([[0.1, -0.2, 0.3, 0.0]], np.float32)
  assert np.isnan(losses.explained_variance(values, returns, np.ones((1, 4))))
  # Just above the floor it is defined again.
  returns = np.array([[0.0, 3e-4, 0.0, 3e-4]], np.float32)
  np.testing.assert_allclose(losses.explained_variance(returns, returns, np.ones((1, 4))), 1.0)


@pytest.mark.parametrize("loss_agg", losses.LOSS_AGGS)
def test_empty_mask_gives_zero_loss(loss_agg):
  loss, _ = losses.value_loss(np.ones((2, 3)), np.ones((2, 3)), np.zeros((2, 3)),
                              np.zeros((2, 3), bool), loss_agg=loss_agg)
  assert loss == 0
