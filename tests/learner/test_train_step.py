"""The SAO train step: golden values, critic schedule, guards, micro-batching, variants."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner_fixtures import adam_counts, make_batch, make_config
from sao_jax import config as C
from sao_jax.learner import state as state_lib
from sao_jax.learner.step import StepConfig, train_step, update_policy_at


@functools.lru_cache(maxsize=None)
def jitted_step(cfg):
  return jax.jit(functools.partial(train_step, cfg=StepConfig.of(cfg)))


def run(cfg, batch, steps=1, update_policy=True, state=None):
  state = state_lib.init_state(cfg, jax.random.key(0)) if state is None else state
  metrics = None
  for _ in range(steps):
    state, metrics = jitted_step(cfg)(state, batch, jnp.asarray(update_policy))
  return state, jax.tree.map(float, metrics)


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_golden_one_step():
  """Golden values of one SAO step on a fixed tiny model and batch.

  Update these numbers only for an intended change of the step's math or of the
  model's initialisation (say which in the commit message); a change anywhere
  else that moves them is a bug.
  """
  cfg = make_config()
  state, metrics = run(cfg, make_batch(0, behavior_shift=0.2))
  golden = {
      "policy/loss": GOLDEN_POLICY_LOSS, "value/loss": GOLDEN_VALUE_LOSS,
      "policy/grad_norm": GOLDEN_POLICY_GRAD_NORM, "advantage/mean": GOLDEN_ADV_MEAN,
      "policy/kept_frac": GOLDEN_KEPT_FRAC,
  }
  for name, value in golden.items():
    np.testing.assert_allclose(metrics[name], value, rtol=1e-4, err_msg=name)
  checksum = sum(float(np.sum(np.abs(x))) for x in leaves(state.policy_params))
  np.testing.assert_allclose(checksum, GOLDEN_POLICY_ABS_SUM, rtol=1e-5)


GOLDEN_POLICY_LOSS = 1.565770149230957
GOLDEN_VALUE_LOSS = 0.379570335149765
GOLDEN_POLICY_GRAD_NORM = 0.5715476274490356
GOLDEN_ADV_MEAN = 0.5717740654945374
GOLDEN_KEPT_FRAC = 0.654321014881134  # 53 of 81 action tokens inside the DIS band
GOLDEN_POLICY_ABS_SUM = 520.187912940979


@pytest.mark.parametrize("variant,value_updates", [("sao", 2), ("sao_dis_only", 1), ("ppo", 1),
                                                   ("grpo", 0)])
def test_one_policy_update_and_k_value_updates(variant, value_updates):
  cfg = make_config(variant)
  state, metrics = run(cfg, make_batch(1))
  assert adam_counts(state.policy_opt_state) == [1]
  if value_updates:
    assert adam_counts(state.value_opt_state) == [value_updates]
  else:  # critic-free variants leave the critic untouched
    assert adam_counts(state.value_opt_state) == [0]
  assert int(state.policy_version) == 1 and int(state.step) == 1
  assert metrics["policy/updated"] == 1.0


def test_frozen_attention_leaves_are_bit_identical_after_training():
  cfg = make_config()
  initial = state_lib.init_state(cfg, jax.random.key(0))
  frozen = state_lib.frozen_value_mask(cfg.algorithm, initial.value_params)
  state, _ = run(cfg, make_batch(2), steps=3, state=initial)
  moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                       initial.value_params, state.value_params)
  for is_frozen, did_move in zip(jax.tree.leaves(frozen), jax.tree.leaves(moved)):
    assert did_move != is_frozen
  assert sum(jax.tree.leaves(frozen)) == 2 * 6  # q/k/v/o + q/k norms in each of 2 layers


def test_without_frozen_attention_everything_trains():
  cfg = make_config("sao_dis_only")
  initial = state_lib.init_state(cfg, jax.random.key(0))
  # Two steps: the fresh value head is zero, so the trunk gets gradient from the second on.
  state, _ = run(cfg, make_batch(2), steps=2, state=initial)
  attn_before = initial.value_params["layers"][0]["attn"]["q_proj"]
  assert np.any(np.asarray(state.value_params["layers"][0]["attn"]["q_proj"]) != attn_before)


def test_value_only_step_leaves_policy_untouched():
  cfg = make_config()
  initial = state_lib.init_state(cfg, jax.random.key(0))
  policy_before = leaves(initial.policy_params)
  state, metrics = run(cfg, make_batch(3), update_policy=False, state=initial)
  for before, after in zip(policy_before, leaves(state.policy_params)):
    np.testing.assert_array_equal(before, after)
  assert int(state.policy_version) == 0 and metrics["policy/updated"] == 0.0
  assert adam_counts(state.value_opt_state) == [2]


def test_the_step_config_holds_only_the_sections_the_step_reads():
  """The jit's static argument: another environment or run directory is the same
  step (no recompile); the sampler's temperature, which the step reads, is not."""
  cfg = make_config()
  other = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name="style"),
                              run=dataclasses.replace(cfg.run, run_dir="elsewhere"))
  assert StepConfig.of(other) == StepConfig.of(cfg)
  assert hash(StepConfig.of(other)) == hash(StepConfig.of(cfg))
  hotter = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, temperature=0.5))
  assert StepConfig.of(hotter) != StepConfig.of(cfg) and StepConfig.of(hotter).temperature == 0.5


def test_update_policy_schedule():
  cfg = make_config(critic_warmup_steps=10, value_pretrain_steps=5)
  assert not update_policy_at(cfg.learner, cfg.algorithm, 14)
  assert update_policy_at(cfg.learner, cfg.algorithm, 15)
  grpo = make_config("grpo", critic_warmup_steps=10)
  assert update_policy_at(grpo.learner, grpo.algorithm, 0)


def test_the_lr_warm_up_is_the_policys_and_the_critic_learns_from_its_first_step():
  """Paper schedule (docs/algorithm.md §4): the critic's value-only warm-up steps train
  it at its full rate; `lr_warmup_steps` holds back only the policy, whose first
  update has learning rate 0. (Before, the critic's rate ramped from 0 too, so its
  first value-only step changed nothing.)"""
  cfg = make_config(lr_warmup_steps=5, critic_warmup_steps=1)
  batch = make_batch(1)
  warmed, _ = run(cfg, batch, update_policy=False)
  unwarmed, _ = run(make_config(lr_warmup_steps=0, critic_warmup_steps=1), batch,
                    update_policy=False)
  for got, want in zip(leaves(warmed.value_params), leaves(unwarmed.value_params)):
    np.testing.assert_array_equal(got, want)  # the K value updates at the full rate
  stepped, _ = run(cfg, batch, update_policy=True, state=warmed)
  for before, after in zip(leaves(warmed.policy_params), leaves(stepped.policy_params)):
    np.testing.assert_array_equal(before, after)  # the policy's warm-up: lr 0 first


def test_the_critic_lr_defaults_to_the_papers_multiple_of_the_policy_lr():
  default = make_config(value_lr=None, policy_lr=2e-4)
  assert default.learner.critic_lr == 1e-3 and C.LearnerConfig().critic_lr == pytest.approx(5e-6)
  explicit = make_config(value_lr=1e-3, policy_lr=2e-4)
  batch = make_batch(2)
  a, _ = run(default, batch, update_policy=False)
  b, _ = run(explicit, batch, update_policy=False)
  for x, y in zip(leaves(a.value_params), leaves(b.value_params)):
    np.testing.assert_array_equal(x, y)
  with pytest.raises(ValueError, match=r"learner.value_lr=0 .*or None: 5 x policy_lr"):
    C.LearnerConfig(value_lr=0).validate()


@pytest.mark.parametrize("poison", ["behavior_logp", "rewards"])
def test_nonfinite_update_is_skipped_and_counted(poison):
  cfg = make_config()
  initial = state_lib.init_state(cfg, jax.random.key(0))
  before = leaves((initial.policy_params, initial.value_params))
  batch = make_batch(4)
  bad = np.array(getattr(batch, poison))
  bad[0, 4] = np.nan
  state, metrics = run(cfg, batch._replace(**{poison: bad}), state=initial)
  after = (state.policy_params, state.value_params)
  assert all(np.all(np.isfinite(x)) for x in leaves(after))
  if poison == "behavior_logp":  # only the policy loss sees it
    expected_skips = 1
    for b, a in zip(before[:len(jax.tree.leaves(initial.policy_params))],
                    leaves(state.policy_params)):
      np.testing.assert_array_equal(b, a)
    assert adam_counts(state.value_opt_state) == [2]
  else:  # NaN returns and advantages: the policy and both value updates are skipped
    expected_skips = 3
    for b, a in zip(before, leaves(after)):
      np.testing.assert_array_equal(b, a)
  assert int(state.nonfinite_skips) == expected_skips == metrics["nonfinite_skips"]
  assert int(state.policy_version) == 0


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batches_equal_the_full_batch(loss_agg):
  # Adam's first step is ~lr * sign(g): a gradient entry at round-off level could
  # flip sign between summation orders and move by a whole lr. A large eps makes
  # the update ~linear in g, so equal gradients show as equal params.
  cfgs = [make_config(micro_batches=m, adam_eps=1e-2) for m in (1, 4)]
  cfgs = [C.Config(model=c.model, learner=c.learner, algorithm=C.AlgorithmConfig.for_variant(
      "sao", loss_agg=loss_agg)) for c in cfgs]
  (full, m_full), (micro, m_micro) = [run(c, make_batch(5, behavior_shift=0.2)) for c in cfgs]
  for a, b in zip(leaves((full.policy_params, full.value_params)),
                  leaves((micro.policy_params, micro.value_params))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for name in ("policy/loss", "value/loss", "policy/kl_k3", "policy/ratio_max", "policy/entropy"):
    np.testing.assert_allclose(m_full[name], m_micro[name], rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("variant", C.VARIANTS)
def test_every_variant_trains_through_the_same_step(variant):
  cfg = make_config(variant)
  state, metrics = run(cfg, make_batch(6, behavior_shift=0.1), steps=2)
  # No lag-0 tokens in this batch: the mismatch is undefined (NaN) by design.
  assert np.isnan(metrics.pop("mismatch/lag0_abs_logp"))
  # Every trajectory of make_batch has several turns: the single-turn path is undefined.
  assert metrics["episodes/single_turn_frac"] == 0.0
  assert np.isnan(metrics.pop("advantage/opening_single_turn"))
  assert np.isnan(metrics.pop("reward/single_turn"))
  assert all(np.isfinite(v) for v in metrics.values()), metrics
  assert int(state.policy_version) == 2
  assert metrics["policy/grad_norm"] > 0


def test_advantages_after_critic_update_is_a_different_order():
  before = make_config()
  after = make_config(advantage_values="after_critic_update")
  _, m_before = run(before, make_batch(7))
  _, m_after = run(after, make_batch(7))
  assert m_before["value/loss"] == pytest.approx(m_after["value/loss"], rel=1e-6)
  assert m_before["advantage/mean"] != pytest.approx(m_after["advantage/mean"], rel=1e-3)


def test_state_from_shared_trunk_can_be_donated():
  """Regression: a critic built from the policy shares its trunk buffers; the
  jitted step donates the state and must not see one buffer twice."""
  from sao_jax.models.transformer import init_params
  from sao_jax.models.value import value_params_from_policy

  cfg = make_config()
  policy = init_params(cfg.model, jax.random.key(0))
  state = state_lib.state_from_params(cfg, policy, value_params_from_policy(policy, cfg.model))
  step = jax.jit(functools.partial(train_step, cfg=StepConfig.of(cfg)), donate_argnums=0)
  state, metrics = step(state, make_batch(8), jnp.asarray(True))
  assert np.isfinite(float(metrics["policy/loss"]))


def test_gae_span_response_runs_plain_gae_over_observations_too():
  """gae_span="response": GAE over every token from the first to the last action
  (the observation at 7:9 included), advantages kept on action tokens only."""
  from sao_jax import losses
  from sao_jax.learner import step as step_lib
  batch = jax.tree.map(jnp.asarray, make_batch(3))
  values = jax.random.normal(jax.random.key(0), batch.rewards.shape)
  plain = make_config("sao")
  plain = dataclasses.replace(plain, algorithm=dataclasses.replace(plain.algorithm,
                                                                   gae_span="response"))
  adv, _ = step_lib.advantages(plain.algorithm, batch, values, None)
  ends = np.asarray(batch.segment_ids).sum(axis=1)
  span = np.zeros(batch.rewards.shape, np.int32)
  for b, end in enumerate(ends):
    span[b, 3:end] = 1  # first action token 3, last end - 1
  lam = losses.length_adaptive_lam(jnp.asarray(span), plain.algorithm.lam_alpha,
                                   segment_ids=batch.segment_ids)
  want, _ = losses.gae(batch.rewards, values, jnp.asarray(span), gamma=1.0, lam=lam,
                       segment_ids=batch.segment_ids)
  want = np.where(np.asarray(batch.action_mask) > 0, want, 0.0)
  np.testing.assert_allclose(adv, want, atol=1e-6)
  skip_obs, _ = step_lib.advantages(make_config("sao").algorithm, batch, values,
                                    None)
  assert not np.allclose(skip_obs, adv)  # the observation's values now enter the deltas
  assert C.AlgorithmConfig.for_variant("ppo").gae_span == "response"
  with pytest.raises(ValueError, match=r"algorithm.gae_span.*'grpo' has no critic"):
    C.AlgorithmConfig.for_variant("grpo", gae_span="response").validate()


def test_dynamics_diagnostics_have_their_defined_values():
  """advantage/neg_frac, value/bias, value/explained_variance (and the moments a window
  pools), policy/update_norm and the response-length
  percentiles against their definitions on a constructed batch."""
  from sao_jax.learner import step as step_lib
  cfg = make_config()
  batch = make_batch(11, behavior_shift=0.1)
  state, _ = run(cfg, make_batch(5), steps=2)  # a trained critic: V != 0, advantages of both signs
  old_policy = leaves(state.policy_params)
  jb = jax.tree.map(jnp.asarray, batch)
  values = step_lib._values(cfg.model, cfg.learner.micro_batches, state.value_params, jb)
  returns = step_lib.value_targets(cfg.algorithm, jb, values)
  adv, _ = step_lib.advantages(cfg.algorithm, jb, values, state.baseline)
  new_state, metrics = run(cfg, batch, state=state)
  action = batch.action_mask > 0
  np.testing.assert_allclose(metrics["advantage/neg_frac"], np.mean(np.asarray(adv)[action] < 0))
  assert 0 < metrics["advantage/neg_frac"] < 1
  # The critic's quality on action tokens, by hand (numpy, float64).
  g = np.asarray(returns, np.float64)[action]
  v = np.asarray(values, np.float64)[action]
  np.testing.assert_allclose(metrics["value/bias"], np.mean(v - g), rtol=1e-5)
  np.testing.assert_allclose(metrics["value/explained_variance"],
                             1 - np.var(g - v) / np.var(g), rtol=1e-4)
  np.testing.assert_allclose(metrics["value/return_mean"], np.mean(g), rtol=1e-5)
  np.testing.assert_allclose(metrics["value/return_var"], np.var(g), rtol=1e-4)
  np.testing.assert_allclose(metrics["value/residual_var"], np.var(g - v), rtol=1e-4)
  delta = np.sqrt(sum(np.sum((new - old.astype(np.float64)) ** 2)
                      for new, old in zip(leaves(new_state.policy_params), old_policy)))
  np.testing.assert_allclose(metrics["policy/update_norm"], delta, rtol=1e-4)
  assert metrics["policy/update_norm"] > 0
  per_trajectory = action.sum(axis=1)  # one trajectory per row: 11, 10, 9, 11, ...
  for name, want in (("p50", np.percentile(per_trajectory, 50)),
                     ("p90", np.percentile(per_trajectory, 90)), ("max", per_trajectory.max())):
    np.testing.assert_allclose(metrics[f"response/action_tokens_{name}"], want, rtol=1e-6)
  _, value_only = run(cfg, batch, update_policy=False)
  assert value_only["policy/update_norm"] == 0.0


def test_the_critic_trains_on_the_span_its_gae_reads():
  """gae_span="response" bootstraps through values on observation tokens, so the
  value loss covers them too (docs/algorithm.md §5): the first update's loss (V = V_old, so
  unclipped) is 0.5 (V - G)^2 averaged over the response span, not the action tokens."""
  from sao_jax import losses
  from sao_jax.learner import step as step_lib
  for variant in ("ppo", "sao"):
    cfg = make_config(variant)
    batch = jax.tree.map(jnp.asarray, make_batch(12))
    state = state_lib.init_state(cfg, jax.random.key(0))
    values = step_lib._values(cfg.model, cfg.learner.micro_batches, state.value_params,
                              batch)
    returns = step_lib.value_targets(cfg.algorithm, batch, values)
    span = step_lib._response_mask(batch) if variant == "ppo" else batch.action_mask
    want, _ = losses.value_loss(values, values, returns, span, clip_eps=None,
                                loss_agg=cfg.algorithm.loss_agg,
                                segment_ids=batch.segment_ids)
    cfg1 = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm,
                                                                  value_updates_per_step=1))
    _, metrics = run(cfg1, jax.tree.map(np.asarray, batch), state=state)
    np.testing.assert_allclose(metrics["value/loss"], float(want), rtol=1e-5, err_msg=variant)
  obs = np.asarray(step_lib._response_mask(batch)) & ~np.asarray(batch.action_mask, bool)
  assert obs.any()  # the fixture has observation tokens inside the response


def test_moe_policy_loss_includes_the_router_load_balancing_loss():
  """MoE policies add model.router_aux_loss_coef x the router's load-balancing loss
  (Qwen3-MoE's recipe) to the policy loss, and report it and the router balance."""
  from learner_fixtures import replace_model
  base = replace_model(make_config("grpo"), num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=16)
  batch = make_batch(13, behavior_shift=0.1)
  losses_by_coef = {}
  for coef in (0.0, 0.5):
    _, metrics = run(replace_model(base, router_aux_loss_coef=coef), batch)
    losses_by_coef[coef] = metrics["policy/loss"]
    assert metrics["policy/router_aux_loss"] >= 2.0 - 1e-6  # >= k, equal when balanced
    assert metrics["policy/router_balance"] > 0
  np.testing.assert_allclose(losses_by_coef[0.5] - losses_by_coef[0.0],
                             0.5 * metrics["policy/router_aux_loss"], rtol=1e-4)
  with pytest.raises(ValueError, match=r"model.router_aux_loss_coef=-1"):
    C.ModelConfig(router_aux_loss_coef=-1).validate()


@pytest.mark.parametrize("variant", ["sao", "running_mean"])
def test_batch_mean_centering_removes_the_net_push_on_sampled_tokens(variant):
  """advantage_centering="batch_mean": the variant's advantages minus their mean over
  the batch's action tokens (a biased critic's uniform shift cancels), 0 off the mask."""
  from sao_jax.learner import step as step_lib
  cfg = make_config(variant)
  centred = dataclasses.replace(cfg, algorithm=dataclasses.replace(
      cfg.algorithm, advantage_centering="batch_mean"))
  batch = jax.tree.map(jnp.asarray, make_batch(3))
  state = state_lib.init_state(cfg, jax.random.key(0))
  values = (jax.random.normal(jax.random.key(1), batch.rewards.shape) + 0.7
            if cfg.algorithm.uses_critic else None)
  plain, _ = step_lib.advantages(cfg.algorithm, batch, values, state.baseline)
  shifted, _ = step_lib.advantages(centred.algorithm, batch, values, state.baseline)
  action = np.asarray(batch.action_mask) > 0
  plain, shifted = np.asarray(plain), np.asarray(shifted)
  assert abs(plain[action].mean()) > 1e-3  # there is a net push to remove
  np.testing.assert_allclose(shifted[action], plain[action] - plain[action].mean(), atol=1e-6)
  assert np.all(shifted[~action] == 0.0)
  with pytest.raises(ValueError, match=r"algorithm.advantage_centering.*'batch_mean'"):
    C.AlgorithmConfig.for_variant("sao", advantage_centering="whiten").validate()


def test_require_reward_contrast_skips_the_policy_update_on_a_uniform_reward_batch():
  """algorithm.require_reward_contrast: a batch whose trajectories all earned the same
  reward updates only the critic (SAO's critic-noise advantages would otherwise move
  the policy at full Adam step size); one differing reward restores the update."""
  cfg = make_config()
  gated = dataclasses.replace(cfg, algorithm=dataclasses.replace(
      cfg.algorithm, require_reward_contrast=True))
  batch = make_batch(4)
  positions = np.arange(batch.rewards.shape[1])
  last_action = np.max(np.where(batch.action_mask > 0, positions, -1), axis=1, keepdims=True)
  uniform = batch._replace(rewards=(positions == last_action).astype(np.float32))
  assert set(np.asarray(uniform.rewards).sum(1)) == {1.0}  # every trajectory earned 1
  state, metrics = run(cfg, uniform)  # the paper's SAO moves the policy anyway ...
  assert metrics["policy/update_norm"] > 0 and int(state.policy_version) == 1
  initial = state_lib.init_state(gated, jax.random.key(0))
  state, metrics = run(gated, uniform, state=initial)  # ... the gate does not
  assert metrics["policy/no_contrast_skip"] == 1.0 and metrics["policy/updated"] == 0.0
  assert int(state.policy_version) == 0 and adam_counts(state.policy_opt_state) == [0]
  assert all(np.array_equal(a, b) for a, b in zip(leaves(state.policy_params),
                                                   leaves(initial.policy_params)))
  assert adam_counts(state.value_opt_state) == [2]  # the critic still trains
  contrast = uniform._replace(rewards=np.where(np.arange(len(uniform.rewards))[:, None] == 0,
                                               0.0, uniform.rewards).astype(np.float32))
  state, metrics = run(gated, contrast)
  assert metrics["policy/no_contrast_skip"] == 0.0 and int(state.policy_version) == 1
  with pytest.raises(ValueError, match=r"algorithm.require_reward_contrast=1"):
    C.AlgorithmConfig(require_reward_contrast=1).validate()


def test_opening_advantages_split_trajectories_by_their_number_of_turns():
  """The opening token's advantage per path on a packed batch, against a walk over
  the tokens: row 0 packs a one-turn answer (segment 1) and a two-turn tool episode
  (segment 2) whose first action token follows segment 1's last and whose
  observation spans a padding hole; row 1 holds a three-turn episode; row 2 is
  padding."""
  from sao_jax.learner import step as step_lib
  from sao_jax.types import Batch
  seg = np.array([[1, 1, 1, 2, 2, 2, 0, 2, 2, 2],
                  [1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
                  [0] * 10], np.int32)
  action = np.array([[0, 1, 1, 1, 0, 0, 0, 0, 1, 1],
                     [0, 0, 1, 0, 1, 1, 0, 1, 1, 0],
                     [0] * 10], np.int32)
  rewards = np.zeros(seg.shape, np.float32)
  rewards[0, 2], rewards[0, 9], rewards[1, 8] = 1.0, 0.0, 1.0
  adv = np.arange(30, dtype=np.float32).reshape(3, 10) / 10 - 1.0
  zeros = np.zeros(seg.shape, np.float32)
  batch = Batch(np.zeros(seg.shape, np.int32), seg, action, zeros, rewards,
                np.where(seg > 0, 0, -1), np.where(seg > 0, 0, -1))
  got = jax.tree.map(float, step_lib._opening_advantages(jax.tree.map(jnp.asarray, batch),
                                                         jnp.asarray(adv * action)))
  # Walk: per (row, segment) the turns (action runs) and the first action token.
  paths = {}
  for r in range(3):
    prev = (0, 0)
    for t in range(10):
      s = seg[r, t]
      if s and action[r, t]:
        entry = paths.setdefault((r, s), {"turns": 0, "open": adv[r, t], "reward": 0.0})
        entry["turns"] += prev != (s, 1)
        entry["reward"] += rewards[r, t]
      prev = (s, int(action[r, t])) if s else (0, 0)
  assert [p["turns"] for p in paths.values()] == [1, 2, 3]
  single = [p for p in paths.values() if p["turns"] == 1]
  multi = [p for p in paths.values() if p["turns"] > 1]
  np.testing.assert_allclose(got["advantage/opening_single_turn"], single[0]["open"], rtol=1e-6)
  np.testing.assert_allclose(got["advantage/opening_multi_turn"],
                             np.mean([p["open"] for p in multi]), rtol=1e-6)
  assert got["reward/single_turn"] == 1.0 and got["reward/multi_turn"] == 0.5
  np.testing.assert_allclose(got["episodes/single_turn_frac"], 1 / 3)
  # A batch of multi-turn episodes only has no single-turn opening: NaN, not 0.
  only_multi = batch._replace(segment_ids=np.where(seg == 1, 0, seg).astype(np.int32))
  got = step_lib._opening_advantages(jax.tree.map(jnp.asarray, only_multi),
                                     jnp.asarray(adv * action))
  assert np.isnan(got["advantage/opening_single_turn"])
  assert got["episodes/single_turn_frac"] == 0.0


def test_zero_advantage_trajectory_share_counts_grpo_groups_without_contrast():
  """advantage/zero_traj_frac: the share of trajectories whose every action token has A = 0.
  For GRPO that is the members of groups whose rewards are all equal (groups of 2 = row
  pairs here): rewards (0, 0), (1, 1), (0, 1), (1, 0) give 4 of 8 trajectories without
  signal; with every pair mixed, none."""
  batch = make_batch(4)
  positions = np.arange(batch.rewards.shape[1])
  last_action = np.max(np.where(batch.action_mask > 0, positions, -1), axis=1, keepdims=True)
  outcome = np.array([0, 0, 1, 1, 0, 1, 1, 0], np.float32)[:, None]
  batch = batch._replace(rewards=((positions == last_action) * outcome).astype(np.float32))
  _, metrics = run(make_config("grpo"), batch)
  assert float(metrics["advantage/zero_traj_frac"]) == pytest.approx(4 / 8)
  mixed = np.array([0, 1, 1, 0, 0, 1, 1, 0], np.float32)[:, None]
  batch = batch._replace(rewards=((positions == last_action) * mixed).astype(np.float32))
  _, metrics = run(make_config("grpo"), batch)
  assert float(metrics["advantage/zero_traj_frac"]) == 0.0
