"""Routing-mismatch metrics of MoE policies and what router replay does to the DIS mask."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner_fixtures import make_batch, make_config, replace_model
from sao_jax import config as C
from sao_jax.learner import routing
from sao_jax.learner import state as state_lib
from sao_jax.learner.step import StepConfig, train_step
from sao_jax.models import forward, moe


def _step(cfg, state, batch):
  step = jax.jit(functools.partial(train_step, cfg=StepConfig.of(cfg)))
  _, metrics = step(state, jax.tree.map(jnp.asarray, batch), jnp.asarray(True))
  return jax.tree.map(float, metrics)


def _metrics(cfg, params, batch, replay=False):
  """The step's routing metrics of `batch` (`routing.counts` then `shares`) under the
  policy forward, with the batch's records replayed or not."""
  batch = jax.tree.map(jnp.asarray, batch)
  _, out = _learner_experts(cfg, params, batch, batch.routed_experts if replay else None)
  found = routing.shares(routing.counts(out, batch, cfg.model, cfg.algorithm))
  return jax.tree.map(float, found)


def _learner_experts(cfg, params, batch, replay=None):
  """[B, T, L, k] top-k of the learner's own routers (with `replay` in the forward)."""
  out = jax.jit(forward.policy_forward, static_argnums=1)(
      params, cfg.model, jnp.asarray(batch.tokens), jnp.asarray(batch.segment_ids), 1.0, replay)
  return np.asarray(moe.routed_experts(out.router_logits, cfg.model.num_experts_per_tok,
                                       cfg.model.num_experts)), out


def test_changed_fraction_counts_expert_sets_per_layer():
  """A token counts as changed in layer l when its recorded top-k *set* differs from the
  learner's there (order within the k does not count); tokens without a record count
  nowhere. Exact shares over the recorded action tokens."""
  cfg = replace_model(make_config("sao"), num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16)
  state = state_lib.init_state(cfg, jax.random.key(0))
  # Larger router weights: no near-ties between the k-th and (k+1)-th expert, whose
  # order could differ between two compiled programs.
  params = jax.tree.map(lambda x: x, state.policy_params)
  for layer in params["layers"].values():
    layer["mlp"]["router"] = 20.0 * layer["mlp"]["router"]
  state = state.replace(policy_params=params)
  batch = make_batch(4)
  experts, _ = _learner_experts(cfg, state.policy_params, batch)
  recorded = experts[..., ::-1].copy()  # the same sets, listed in the other order
  action = np.asarray(batch.action_mask) > 0
  rng = np.random.default_rng(0)
  flip = action & (rng.random(action.shape) < 0.4)
  # Layer 1 of the flipped tokens: the two experts the learner did not choose.
  chosen_BxTxE = (np.arange(4)[None, None, :, None] == experts[..., 1, None, :]).any(-1)
  others = np.argsort(chosen_BxTxE, axis=-1, kind="stable")[..., :2]
  recorded[..., 1, :][flip] = others[flip]
  unrecorded = ~action | (rng.random(action.shape) < 0.2)
  recorded[unrecorded] = -1
  metrics = _metrics(cfg, state.policy_params,
                     batch._replace(routed_experts=recorded.astype(np.int8)))

  counted = action & ~unrecorded
  assert metrics["routing/recorded_tokens"] == counted.sum()
  assert metrics["routing/changed_frac/layer_0"] == 0.0
  np.testing.assert_allclose(metrics["routing/changed_frac/layer_1"],
                             (flip & counted).sum() / counted.sum(), rtol=1e-6)
  np.testing.assert_allclose(metrics["routing/changed_frac"],
                             (flip & counted).sum() / counted.sum(), rtol=1e-6)
  # DIS split by the position that scored each token (its predecessor in the row).
  same = np.zeros_like(action)
  same[:, 1:] = np.asarray(batch.segment_ids)[:, 1:] == np.asarray(batch.segment_ids)[:, :-1]
  before = lambda x: np.pad(x[:, :-1], ((0, 0), (1, 0))) & same
  assert metrics["routing/changed_scored_tokens"] == (action & before(counted & flip)).sum()
  assert metrics["routing/unchanged_scored_tokens"] == (action & before(counted & ~flip)).sum()


@pytest.fixture(scope="module")
def flipped_case():
  """A one-MoE-layer policy whose experts matter (large expert and embedding weights),
  and a batch whose sampler routed every real token to the two experts the learner's
  router ranks last, its behavior_logp that forward's (what the sampler computed)."""
  # grpo_dis: a DIS variant without a critic, the cheapest step to compile.
  cfg = replace_model(make_config("grpo_dis"), num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16, mlp_only_layers=(1,))
  state = state_lib.init_state(cfg, jax.random.key(0))
  params = jax.tree.map(lambda x: x, state.policy_params)
  for name in ("gate_proj", "up_proj", "down_proj"):
    params["layers"][0]["mlp"][name] = 30.0 * params["layers"][0]["mlp"][name]
  params["embed"] = 20.0 * params["embed"]
  state = state.replace(policy_params=params)
  batch = make_batch(6)
  _, free = _learner_experts(cfg, params, batch)
  probs = np.asarray(jax.nn.softmax(free.router_logits[0], axis=-1))
  recorded = np.argsort(probs, axis=-1)[..., :2][:, :, None, :]  # the learner's bottom two
  recorded = np.where(np.asarray(batch.segment_ids)[..., None, None] > 0, recorded, -1)
  _, sampled = _learner_experts(cfg, params, batch, jnp.asarray(recorded))
  action = np.asarray(batch.action_mask) > 0
  batch = batch._replace(behavior_logp=np.where(action, np.asarray(sampled.logp_BxT), 0.0)
                         .astype(np.float32), routed_experts=recorded.astype(np.int8))
  return cfg, state, batch


@pytest.mark.parametrize("replay", [False, True])
def test_replay_takes_the_dis_mask_of_routing_flips_to_zero(flipped_case, replay):
  """Every token's routing flipped between sampler and learner: without replay the DIS
  band masks many of them for the router's sake alone; with replay the learner
  recomputes the sampler's log-probs and masks none. The mismatch share is the
  learner router's either way."""
  cfg, state, batch = flipped_case
  metrics = _metrics(cfg, state.policy_params, batch, replay)
  assert metrics["routing/changed_frac"] == 1.0
  assert metrics["routing/changed_scored_tokens"] == np.asarray(batch.action_mask).sum()
  assert np.isnan(metrics["routing/dis_masked_frac_unchanged"])
  if replay:
    assert metrics["routing/dis_masked_frac_changed"] == 0.0
  else:
    assert metrics["routing/dis_masked_frac_changed"] > 0.2


def test_the_train_step_replays_and_reports_routing(flipped_case):
  """The step with learner.router_replay: its metrics are the routing metrics of the
  replayed forward (summed over micro-batches before dividing), beside the policy's."""
  cfg, state, batch = flipped_case
  cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, router_replay=True,
                                                             micro_batches=2))
  metrics = _step(cfg, state, batch)
  want = _metrics(cfg, state.policy_params, batch, replay=True)
  assert {k for k in metrics if k.startswith("routing/")} == set(want)
  for key, value in want.items():
    np.testing.assert_allclose(metrics[key], value, rtol=1e-6, err_msg=key)
  assert metrics["routing/dis_masked_frac_changed"] == 0.0


def test_router_replay_needs_an_moe_policy():
  cfg = make_config("sao")
  with pytest.raises(ValueError, match=r"learner.router_replay=True .*num_experts"):
    C.Config(model=cfg.model, algorithm=cfg.algorithm,
             learner=dataclasses.replace(cfg.learner, router_replay=True)).validate()
