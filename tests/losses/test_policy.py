"""DIS and PPO-clip policy losses (docs/algorithm.md §2, §5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import losses


def random_batch(seed, batch=4, length=12, spread=0.6):
  rng = np.random.default_rng(seed)
  behavior = rng.normal(-2.0, 0.5, (batch, length)).astype(np.float32)
  logp = (behavior + rng.normal(0, spread, (batch, length))).astype(np.float32)
  adv = rng.normal(size=(batch, length)).astype(np.float32)
  mask = rng.random((batch, length)) < 0.7
  return logp, np.where(mask, behavior, 0.0).astype(np.float32), adv, mask


@pytest.mark.parametrize("loss_agg", losses.LOSS_AGGS)
def test_dis_gradient_is_the_explicit_formula(loss_agg):
  logp, behavior, adv, mask = random_batch(0)
  eps_low, eps_high = 0.3, 0.5
  grad = jax.grad(lambda lp: losses.dis_policy_loss(
      lp, behavior, adv, mask, eps_low=eps_low, eps_high=eps_high, loss_agg=loss_agg)[0])(logp)
  ratio = np.exp(logp.astype(np.float64) - behavior)
  keep = mask & (ratio > 1 - eps_low) & (ratio < 1 + eps_high)
  assert 0 < keep.sum() < mask.sum(), "the batch should exercise both kept and masked tokens"
  if loss_agg == "token_mean":
    denom = np.full(mask.shape, mask.sum())
  elif loss_agg == "token_mean_kept":
    denom = np.full(mask.shape, keep.sum())
  else:
    denom = mask.sum(1, keepdims=True) * (mask.any(1) * 1).sum() * np.ones(mask.shape)
  expected = np.where(keep, -ratio * adv / denom, 0.0)
  np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_dis_masks_both_sides_whatever_the_advantage_sign():
  behavior = np.zeros((1, 4), np.float32) - 1.0
  # ratios 0.5 (below), 2.0 (inside), 8.0 (above), 1.0 (inside)
  logp = behavior + np.log(np.array([[0.5, 2.0, 8.0, 1.0]], np.float32))
  mask = np.ones((1, 4), bool)
  for sign in (1.0, -1.0):
    adv = np.full((1, 4), sign, np.float32)
    loss_fn = lambda lp: losses.dis_policy_loss(lp, behavior, adv, mask, eps_low=0.3,
                                                eps_high=5.0)[0]
    grad = np.asarray(jax.grad(loss_fn)(logp))
    assert grad[0, 0] == 0.0 and grad[0, 2] == 0.0
    np.testing.assert_allclose(grad[0, [1, 3]], [-sign * 2.0 / 4, -sign * 1.0 / 4], rtol=1e-5)
  _, metrics = losses.dis_policy_loss(logp, behavior, adv, mask, eps_low=0.3, eps_high=5.0)
  np.testing.assert_allclose(metrics["mask_low_frac"], 0.25)
  np.testing.assert_allclose(metrics["mask_high_frac"], 0.25)
  np.testing.assert_allclose(metrics["kept_frac"], 0.5)
  np.testing.assert_allclose(metrics["ratio_max"], 8.0, rtol=1e-5)
  np.testing.assert_allclose(metrics["ratio_mean"], 11.5 / 4, rtol=1e-5)


def _log_ratio_hitting(edge):
  """Float32 log-ratios: d with jnp.exp(d) == edge exactly, and the nearest d' whose
  ratio lies strictly inside the band (exp is flat at the ulp level, so d' may be
  a few floats away)."""
  up, down = np.float32(np.inf), np.float32(-np.inf)
  d = np.float32(np.log(edge))
  for _ in range(64):
    if float(jnp.exp(d)) == np.float32(edge):
      break
    d = np.nextafter(d, up if float(jnp.exp(d)) < edge else down)
  else:
    raise AssertionError(f"no float32 log-ratio hits {edge}")
  inside = d
  while float(jnp.exp(inside)) == np.float32(edge):
    inside = np.nextafter(inside, up if edge < 1 else down)
  return d, inside


@pytest.mark.parametrize("edge", [0.5, 3.0])  # 1 - eps_low and 1 + eps_high
def test_dis_band_is_strict_at_the_edges(edge):
  on_edge, inside = _log_ratio_hitting(edge)
  logp = np.array([[on_edge, inside]], np.float32)
  behavior = np.zeros_like(logp)
  ones = np.ones_like(logp)
  grad = jax.grad(lambda lp: losses.dis_policy_loss(
      lp, behavior, ones, ones.astype(bool), eps_low=0.5, eps_high=2.0)[0])(logp)
  assert grad[0, 0] == 0.0, "a ratio exactly on the band edge must be masked"
  assert grad[0, 1] != 0.0, "the next float inside the band must be kept"


def test_dis_overflowing_ratio_stays_finite():
  logp = np.array([[200.0, -1.0]], np.float32)  # exp(200) overflows float32
  behavior = np.array([[-1.0, -1.0]], np.float32)
  adv = np.array([[0.0, 1.0]], np.float32)
  loss, grad = jax.value_and_grad(lambda lp: losses.dis_policy_loss(
      lp, behavior, adv, np.ones((1, 2), bool), eps_low=0.3, eps_high=5.0)[0])(logp)
  assert np.isfinite(loss) and np.all(np.isfinite(grad))
  np.testing.assert_allclose(grad, [[0.0, -0.5]])


def test_loss_agg_values_by_hand():
  logp = np.log(np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 9.0, 1.0, 1.0]], np.float32)) - 1.0
  behavior = np.full_like(logp, -1.0)
  adv = np.array([[1.0, 2.0, 0.0, 5.0], [3.0, 1.0, 0.0, 0.0]], np.float32)
  mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], bool)  # row 1 token 1 has ratio 9: masked
  per_token = -adv * logp  # ratio 1 on kept tokens
  kept = np.array([[1, 1, 0, 0], [1, 0, 1, 0]], bool)
  num = np.where(kept, per_token, 0.0)
  cases = {
      "token_mean": num.sum() / 5,
      "token_mean_kept": num.sum() / 4,
      "seq_mean_token_mean": (num[0].sum() / 2 + num[1].sum() / 3) / 2,
  }
  for agg, expected in cases.items():
    loss, _ = losses.dis_policy_loss(logp, behavior, adv, mask, eps_low=0.3, eps_high=5.0,
                                     loss_agg=agg)
    np.testing.assert_allclose(loss, expected, rtol=1e-6, err_msg=agg)


@pytest.mark.parametrize("loss_fn", [losses.dis_policy_loss, losses.ppo_clip_loss])
@pytest.mark.parametrize("loss_agg", losses.LOSS_AGGS)
def test_micro_batches_with_full_denominator_add_up(loss_fn, loss_agg):
  logp, behavior, adv, mask = random_batch(1, batch=6)
  kwargs = dict(eps_low=0.2, eps_high=0.28, loss_agg=loss_agg)
  full, _ = loss_fn(logp, behavior, adv, mask, **kwargs)
  _, metrics = loss_fn(logp, behavior, adv, mask, **kwargs)
  keep = None
  if loss_agg == "token_mean_kept":  # the kept set is a property of the whole batch
    ratio = np.exp(logp - behavior)
    if loss_fn is losses.dis_policy_loss:
      keep = mask & (ratio > 0.8) & (ratio < 1.28)
    else:
      keep = mask & ~((np.clip(ratio, 0.8, 1.28) * adv) < ratio * adv)
  denominator = losses.loss_denominator(mask, loss_agg, keep)
  parts = [loss_fn(logp[s], behavior[s], adv[s], mask[s], denominator=denominator, **kwargs)[0]
           for s in (slice(0, 2), slice(2, 6))]
  np.testing.assert_allclose(sum(parts), full, rtol=1e-5)


def test_ppo_clip_by_hand():
  ratios = np.array([[1.5, 0.5, 0.5, 1.1]], np.float32)
  adv = np.array([[1.0, 1.0, -1.0, -2.0]], np.float32)
  logp = np.log(ratios)
  behavior = np.zeros_like(logp)
  mask = np.ones_like(logp, bool)
  loss_fn = lambda lp: losses.ppo_clip_loss(lp, behavior, adv, mask, eps_low=0.2,
                                            eps_high=0.28)
  (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(logp)
  # -min(r A, clip(r) A): 1.5 -> -1.28 (clipped); 0.5,A=1 -> -0.5; 0.5,A=-1 -> +0.8 (clipped);
  # 1.1,A=-2 -> +2.2 (inside the clip range).
  np.testing.assert_allclose(loss, (-1.28 - 0.5 + 0.8 + 2.2) / 4, rtol=1e-5)
  np.testing.assert_allclose(grad, [[0.0, -0.5 / 4, 0.0, 2.2 / 4]], rtol=1e-5)
  np.testing.assert_allclose(metrics["clip_frac"], 0.5)


def test_kl_estimators_match_numpy():
  logp, behavior, _, mask = random_batch(2)
  _, metrics = losses.dis_policy_loss(logp, behavior, np.zeros_like(logp), mask,
                                      eps_low=0.3, eps_high=5.0)
  log_r = (logp - behavior)[mask].astype(np.float64)
  np.testing.assert_allclose(metrics["kl_k1"], np.mean(-log_r), rtol=1e-5)
  np.testing.assert_allclose(metrics["kl_k3"], np.mean(np.exp(log_r) - 1 - log_r), rtol=1e-5)


def test_entropy_from_logits():
  logits = np.zeros((2, 3, 7), np.float32)
  logits[1, :, 0] = 1e4  # one-hot: zero entropy, no overflow
  np.testing.assert_allclose(losses.entropy_from_logits(logits)[0], np.log(7), rtol=1e-6)
  np.testing.assert_allclose(losses.entropy_from_logits(logits)[1], 0.0, atol=1e-6)


def test_unknown_loss_agg_is_named():
  logp, behavior, adv, mask = random_batch(3)
  with pytest.raises(ValueError, match="loss_agg='sum'"):
    losses.dis_policy_loss(logp, behavior, adv, mask, eps_low=0.3, eps_high=5.0, loss_agg="sum")
