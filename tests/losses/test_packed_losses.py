"""Per-segment losses on packed rows equal the same trajectories one per row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import losses

LENGTH = 24


def _trajectory(rng, n):
  """Prompt, action turns around observations, outcome on the last action token."""
  action = np.zeros(n, bool)
  t = rng.integers(1, 3)
  while t < n:
    turn = rng.integers(1, 4)
    action[t:t + turn] = True
    t += turn + rng.integers(0, 3)
  if not action.any():
    action[-1] = True
  rewards = np.where(action, 0.1 * rng.normal(size=n), 0.0).astype(np.float32)
  rewards[np.flatnonzero(action)[-1]] += rng.integers(0, 2)
  values = rng.normal(size=n).astype(np.float32)
  return action, rewards, values


LENGTHS = (7, 9, 6, 11, 5, 8, 10)
ROWS = ((0, 1, 2), (3, 4, 5), (6,))  # packed layout, row-major = trajectory order
PROMPTS = (3, 3, 8, 8, 8, 1, 3)  # groups spread over rows and within rows


def _batches(seed=0):
  """The same trajectories one per row (unpacked) and packed per ROWS, with their
  segment ids, prompt ids per token and each trajectory's place in the packed rows."""
  rng = np.random.default_rng(seed)
  trajs = [_trajectory(rng, n) for n in LENGTHS]
  unpacked = {name: np.zeros((len(trajs), LENGTH), dtype)
              for name, dtype in (("action", bool), ("rewards", np.float32),
                                  ("values", np.float32), ("seg", np.int32))}
  packed = {name: np.zeros((len(ROWS), LENGTH), x.dtype) for name, x in unpacked.items()}
  packed["prompt"] = np.full((len(ROWS), LENGTH), -1, np.int32)
  places = {}
  for i, (action, rewards, values) in enumerate(trajs):
    n = len(action)
    for name, x in (("action", action), ("rewards", rewards), ("values", values)):
      unpacked[name][i, :n] = x
    unpacked["seg"][i, :n] = 1
  for r, members in enumerate(ROWS):
    start = 0
    for k, i in enumerate(members, start=1):
      span = slice(start, start + LENGTHS[i])
      packed["action"][r, span], packed["rewards"][r, span], packed["values"][r, span] = trajs[i]
      packed["seg"][r, span] = k
      packed["prompt"][r, span] = PROMPTS[i]
      places[i] = (r, span)
      start = span.stop
  return unpacked, packed, places


def _assert_per_trajectory(packed_BxT, unpacked_BxT, places, **tol):
  packed_BxT, unpacked_BxT = np.asarray(packed_BxT), np.asarray(unpacked_BxT)
  for i, (r, span) in places.items():
    np.testing.assert_allclose(packed_BxT[r, span], unpacked_BxT[i, :LENGTHS[i]],
                               err_msg=f"trajectory {i}", **tol)


def test_length_adaptive_lam_per_segment():
  unpacked, packed, places = _batches()
  lam_B = losses.length_adaptive_lam(jnp.asarray(unpacked["action"]), alpha=1.5)
  lam_BxT = losses.length_adaptive_lam(jnp.asarray(packed["action"]), alpha=1.5,
                                       segment_ids=jnp.asarray(packed["seg"]))
  for i, (r, span) in places.items():
    l = unpacked["action"][i].sum()
    np.testing.assert_allclose(lam_BxT[r, span], 1 - 1 / (1.5 * l), rtol=1e-6)
    np.testing.assert_allclose(lam_B[i], 1 - 1 / (1.5 * l), rtol=1e-6)
  assert np.all(np.asarray(lam_BxT)[packed["seg"] == 0] == 0)


@pytest.mark.parametrize("method", ["scan", "associative"])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_gae_on_a_packed_row_equals_each_segment_alone(method, gamma):
  """Segment ends are terminal: no bootstrap or advantage flows across them."""
  unpacked, packed, places = _batches(1)
  run = jax.jit(losses.gae, static_argnames="method")
  for lam_of in ("adaptive", 0.95):
    if lam_of == "adaptive":
      lam_u = losses.length_adaptive_lam(jnp.asarray(unpacked["action"]), alpha=1.5)
      lam_p = losses.length_adaptive_lam(jnp.asarray(packed["action"]), alpha=1.5,
                                         segment_ids=jnp.asarray(packed["seg"]))
    else:
      lam_u = lam_p = lam_of
    want = run(unpacked["rewards"], unpacked["values"], unpacked["action"], gamma=gamma,
               lam=lam_u, method=method)
    got = run(packed["rewards"], packed["values"], packed["action"], gamma=gamma, lam=lam_p,
              method=method, segment_ids=packed["seg"])
    for g, w in zip(got, want):
      _assert_per_trajectory(g, w, places, rtol=1e-5, atol=1e-6)
      assert np.all(np.asarray(g)[packed["seg"] == 0] == 0)


def test_gae_across_a_boundary_by_hand():
  # Two one-action segments side by side, gamma = lam = 1: without the terminal
  # at the boundary the first would bootstrap from the second's value 5.
  rewards = np.array([[1.0, 0.0, 2.0, 0.0]], np.float32)
  values = np.array([[0.5, 9.0, 5.0, 9.0]], np.float32)
  mask = np.array([[1, 0, 1, 0]], bool)
  seg = np.array([[1, 1, 2, 2]], np.int32)
  for method in ("scan", "associative"):
    adv, ret = losses.gae(rewards, values, mask, gamma=1.0, lam=1.0, method=method,
                          segment_ids=seg)
    np.testing.assert_allclose(adv, [[0.5, 0, -3.0, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[1.0, 0, 2.0, 0]], atol=1e-6)


def test_grpo_per_segment_equals_unpacked():
  unpacked, packed, places = _batches(2)
  want = losses.grpo_advantages(unpacked["rewards"], unpacked["action"], np.array(PROMPTS))
  got = jax.jit(losses.grpo_advantages)(packed["rewards"], packed["action"], packed["prompt"],
                                        segment_ids=packed["seg"])
  _assert_per_trajectory(got, want, places, rtol=1e-6, atol=1e-6)
  assert np.any(np.asarray(want) != 0)
  # Prompt 1 has one member: no baseline signal, wherever it is packed.
  r, span = places[PROMPTS.index(1)]
  assert np.all(np.asarray(got)[r, span] == 0)


@pytest.mark.parametrize("scope", ["prompt", "global"])
def test_running_mean_per_segment_equals_unpacked(scope):
  unpacked, packed, places = _batches(3)
  slots = np.array(PROMPTS)
  step = jax.jit(losses.running_mean_advantages, static_argnames="scope")
  state_u = state_p = losses.init_running_mean(num_slots=10 if scope == "prompt" else 1, window=2)
  for _ in range(2):  # the second batch reads the windows the first one left
    adv_u, state_u = step(unpacked["rewards"], unpacked["action"], slots, state_u, scope=scope)
    adv_p, state_p = step(packed["rewards"], packed["action"], packed["prompt"], state_p,
                          scope=scope, segment_ids=packed["seg"])
    _assert_per_trajectory(adv_p, adv_u, places, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(state_p.count_P, state_u.count_P)
    np.testing.assert_allclose(state_p.window_PxW, state_u.window_PxW)


def test_running_mean_push_matches_a_ring_buffer_loop():
  """Many outcomes of one slot in one batch: only the last W survive, in ring order."""
  rng = np.random.default_rng(4)
  outcomes = rng.normal(size=9).astype(np.float32)
  slots = np.array([2, 0, 2, 2, 1, 2, 2, 0, 2])
  rewards = np.zeros((9, 3), np.float32)
  rewards[:, 1] = outcomes
  mask = np.zeros((9, 3), bool)
  mask[:, 1] = True
  window, count = np.zeros((3, 3), np.float32), np.array([1, 0, 2])
  window[0, 0], window[2, :2] = 0.5, (1.0, -1.0)
  state = losses.RunningMeanState(jnp.asarray(window), jnp.asarray(count, jnp.int32))
  baseline_P = np.array([0.5, 0.0, 0.0])  # window means before the batch (slot 1 empty)
  adv, new = losses.running_mean_advantages(rewards, mask, slots, state)
  for i, slot in enumerate(slots):  # the sequential reference
    window[slot, count[slot] % 3] = outcomes[i]
    count[slot] += 1
  np.testing.assert_array_equal(new.window_PxW, window)
  np.testing.assert_array_equal(new.count_P, count)
  np.testing.assert_allclose(np.asarray(adv)[:, 1], outcomes - baseline_P[slots], rtol=1e-6)


@pytest.mark.parametrize("loss_fn", [losses.dis_policy_loss, losses.ppo_clip_loss])
@pytest.mark.parametrize("loss_agg", losses.LOSS_AGGS)
def test_loss_aggregation_per_segment_equals_unpacked(loss_fn, loss_agg):
  unpacked, packed, places = _batches(5)
  rng = np.random.default_rng(6)

  def per_token(batch, fill):
    """Same per-trajectory values in both layouts."""
    out = np.zeros(batch["action"].shape, np.float32)
    for i, (r, span) in places.items():
      if batch is packed:
        out[r, span] = fill[i]
      else:
        out[i, :LENGTHS[i]] = fill[i]
    return out

  fills = [rng.normal(-2.0, 0.4, n).astype(np.float32) for n in LENGTHS]
  behavior = [f + rng.normal(0, 0.3, f.shape).astype(np.float32) for f in fills]
  adv = [rng.normal(size=n).astype(np.float32) for n in LENGTHS]
  kwargs = dict(eps_low=0.2, eps_high=0.28, loss_agg=loss_agg)
  want, _ = loss_fn(per_token(unpacked, fills), per_token(unpacked, behavior),
                    per_token(unpacked, adv), unpacked["action"], **kwargs)
  got, _ = loss_fn(per_token(packed, fills), per_token(packed, behavior), per_token(packed, adv),
                   packed["action"], segment_ids=packed["seg"], **kwargs)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  denominator = losses.loss_denominator(packed["action"], "seq_mean_token_mean",
                                        segment_ids=packed["seg"])
  assert float(denominator) == len(LENGTHS)  # one per segment, not per row


@pytest.mark.parametrize("method", ["scan", "associative"])
def test_gae_through_a_padding_hole_inside_a_segment(method):
  """Padding inside a segment carries lam = 0 (log(gamma * lam) = -inf); it must pass
  the recurrence through like an observation token, not cut it (the associative form
  once took a span's lam from its padding part: 0.26 / 0.19 instead of 0.61 / 0.59)."""
  seg = np.array([[1, 1, 1, 0, 0, 1, 1, 1, 2, 2, 2, 0]], np.int32)
  mask = np.array([[0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 0]], bool)
  rewards = np.zeros((1, 12), np.float32)
  rewards[0, [7, 10]] = 1.0
  values = np.random.default_rng(0).normal(size=(1, 12)).astype(np.float32)
  lam = losses.length_adaptive_lam(jnp.asarray(mask), alpha=1.5, segment_ids=jnp.asarray(seg))
  adv, ret = jax.jit(losses.gae, static_argnames="method")(
      rewards, values, mask, gamma=1.0, lam=lam, method=method, segment_ids=seg)
  # Each segment alone, as a Python loop over its action tokens (docs/algorithm.md §3).
  want = np.zeros(12)
  for segment in (1, 2):
    positions = np.flatnonzero(mask[0] & (seg[0] == segment))
    lam_s = 1 - 1 / (1.5 * len(positions))
    next_value = next_adv = 0.0
    for t in positions[::-1]:
      next_adv = rewards[0, t] + next_value - values[0, t] + lam_s * next_adv
      next_value = values[0, t]
      want[t] = next_adv
  np.testing.assert_allclose(adv[0], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ret[0], np.where(mask[0], want + values[0], 0), rtol=1e-5, atol=1e-6)
