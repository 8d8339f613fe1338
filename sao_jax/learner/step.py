"""The pure SAO train step: one batch in, one updated state and its metrics out.

    V_old      = value_forward(value_params)                     (critic variants)
    advantages = skip-obs GAE(lam_policy)   sao, sao_dis_only    (docs/algorithm.md §3)
                 plain GAE over the response ppo (algorithm.gae_span="response")
                 group-normalised outcome   grpo, grpo_dis       (§5)
                 outcome - running mean     running_mean         (§5)
    returns    = GAE(lam_critic) + V_old                          value targets
    policy     <- one DIS or PPO-clip update                      (skipped on value-only steps)
    critic     <- K clipped value updates on the same batch       (§4), on the tokens
                  its GAE runs over: action tokens, or the whole response span
                  for gae_span="response", whose GAE bootstraps through
                  observation-token values (docs/algorithm.md §5)

`advantage_values="after_critic_update"` runs the K value updates first and
computes the advantages from the updated critic (targets still from V_old).
With `algorithm.require_reward_contrast` the policy update is skipped (as on a
value-only step; `policy/no_contrast_skip` = 1) when max_i R_i = min_i R_i over
the batch's trajectories i, R_i the trajectory's summed reward.

Every update is guarded: if its loss or gradient norm is not finite, params
and optimizer state keep their old values and `nonfinite_skips` counts it.
Micro-batching splits the batch into `micro_batches` strided slices (each
draws rows from every data shard), accumulates gradients with `lax.scan` and
normalises by the full batch's denominator, so the result equals one big batch.

Packed rows (`batch.segment_ids`, `sao_jax.segments`): every
per-trajectory quantity is per segment (GAE terminals, length-adaptive lambda,
GRPO groups, running means, `seq_mean_token_mean`, the PPO response span, the
outcome behind `reward/mean`); micro-batches split rows, never segments.

Training-inference mismatch: on lag-0 action tokens (sampled entirely by the
policy version this step starts from, `batch.behavior_version`) the recomputed
log-prob should equal the sampler's `behavior_logp`;
`mismatch/lag0_abs_logp = sum |logp - behavior_logp| / mismatch/lag0_tokens`
over them, summed over micro-batches before dividing; NaN (undefined, skipped by
plots and means) when the step has no lag-0 tokens or updates no policy.

Diagnostics of the training dynamics, every step: `advantage/mean`, `/std`,
`/neg_frac` (share of action tokens with A < 0), `/zero_traj_frac` (share of
trajectories with A = 0 on every action token: for GRPO, those in groups whose
rewards are all equal); `value/bias` = mean(V_old - G)
over action tokens (critic variants; G the value target), beside
`value/return_mean`, `/return_var` and `/residual_var` (Var(G - V_old)), from which
the host pools explained variance and bias over steps (`run.critic_window`); `policy/update_norm`,
the global L2 norm of the policy's parameter change (0 when no update was
applied; with LoRA the adapters' change, as only they train);
`response/action_tokens_p50`, `_p90`, `_max`: percentiles (linear
interpolation) of action tokens per trajectory in the batch;
`advantage/opening_single_turn` and `_multi_turn`: the mean advantage on the
first action token of trajectories with one assistant turn vs several, beside
`reward/single_turn`, `reward/multi_turn` and `episodes/single_turn_frac`
(`_opening_advantages`). MoE policies add
`model.router_aux_loss_coef` x the router's load-balancing loss to the policy
loss and report `policy/router_aux_loss` and `policy/router_balance`.

MoE routing mismatch (`routing/*`, `sao_jax.learner.routing`) when the batch
carries the sampler's routing records; with `learner.router_replay` the policy
forward routes recorded tokens to the recorded experts (`moe.route`).

The step is a plain function of the sections it reads (`StepConfig.of(cfg)`: algorithm,
learner, model, lora and the sampler's temperature); `sao_jax.learner.compile` jits it
with shardings.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sao_jax import losses, segments
from sao_jax.config import AlgorithmConfig, Config, LearnerConfig, LoraConfig, ModelConfig
from sao_jax.config.checks import fail
# Defined with the learner's config (the data path's fixed-lag schedule counts them too).
from sao_jax.config.learner import value_only_steps
from sao_jax.learner import routing
from sao_jax.learner import state as state_lib
from sao_jax.models import lora, moe
from sao_jax.models.forward import policy_forward, router_balance, value_forward
from sao_jax.types import Batch

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepConfig:
  """What the train step reads of a `Config`, and its static (jit) argument: a change
  to any other section (the environment, the run's paths, the sampler's other
  settings) neither reaches the step nor compiles it again."""

  algorithm: AlgorithmConfig
  learner: LearnerConfig
  model: ModelConfig
  lora: LoraConfig
  # The sampler's temperature: behavior_logp is log softmax(logits / T) (sampler/engine.py).
  temperature: float

  @classmethod
  def of(cls, cfg: Config) -> "StepConfig":
    return cls(algorithm=cfg.algorithm, learner=cfg.learner, model=cfg.model, lora=cfg.lora,
               temperature=cfg.sampler.temperature)


class Total(NamedTuple):
  """A micro-batch metric that is added up over micro-batches (a sum or a count)
  instead of averaged; ratios of Totals are exact under any split."""

  value: jax.Array


def _split(tree: Any, num: int) -> Any:
  """[B, ...] -> [num, B / num, ...]; micro-batch m takes rows m, m + num, ..."""
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // num, num, *x.shape[1:]).swapaxes(0, 1),
                      tree)


def _merge(x: jax.Array) -> jax.Array:
  """Inverse of `_split` for one array."""
  return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _response_mask(batch: Batch) -> jax.Array:
  """Every token from a trajectory's first to its last action token (plain GAE's span)."""
  return segments.span(batch.action_mask, batch.segment_ids)


def _values(model: ModelConfig, micro_batches: int, params, batch: Batch) -> jax.Array:
  """The critic's values V_old, one micro-batch at a time (no gradient)."""
  def one(_, mb):
    return None, value_forward(params, model, mb.tokens, mb.segment_ids)

  _, values = jax.lax.scan(one, None, _split(batch, micro_batches))
  return jax.lax.stop_gradient(_merge(values))


def _gae_inputs(alg: AlgorithmConfig, batch: Batch):
  """The GAE mask and policy lambda (per token: each segment's own) of the variant."""
  mask = _response_mask(batch) if alg.gae_span == "response" else batch.action_mask
  lam = alg.lam_policy if alg.lam_policy is not None else losses.length_adaptive_lam(
      mask, alg.lam_alpha, segment_ids=batch.segment_ids)
  return mask, lam


def value_targets(alg: AlgorithmConfig, batch: Batch, values: jax.Array) -> jax.Array:
  """The critic's targets: GAE(lam_critic) + V_old over the variant's GAE mask."""
  mask, _ = _gae_inputs(alg, batch)
  _, returns = losses.gae(batch.rewards, values, mask, gamma=alg.gamma, lam=alg.lam_critic,
                          method=alg.gae_method, segment_ids=batch.segment_ids)
  return returns


def _gae_advantages(alg: AlgorithmConfig, batch: Batch, values: jax.Array, baseline):
  mask, lam = _gae_inputs(alg, batch)
  adv, _ = losses.gae(batch.rewards, values, mask, gamma=alg.gamma, lam=lam, method=alg.gae_method,
                      segment_ids=batch.segment_ids)
  return jnp.where(batch.action_mask.astype(bool), adv, 0.0), baseline


def _group_advantages(alg: AlgorithmConfig, batch: Batch, values: None, baseline):
  del alg, values
  return losses.grpo_advantages(batch.rewards, batch.action_mask, batch.prompt_ids,
                                segment_ids=batch.segment_ids), baseline


def _running_mean_advantages(alg: AlgorithmConfig, batch: Batch, values: None, baseline):
  del values
  return losses.running_mean_advantages(batch.rewards, batch.action_mask, batch.prompt_ids,
                                        baseline, scope=alg.running_mean_scope,
                                        segment_ids=batch.segment_ids)


# The advantage estimators a variant can name (`sao_jax.config.algorithm.VARIANTS`'
# advantage column): name -> (algorithm, batch, values, baseline) -> (adv, baseline). The one
# list of them; a job checks its variant's against it at start-up (`check_variant`).
ADVANTAGE_ESTIMATORS = {"gae": _gae_advantages, "group": _group_advantages,
                        "running_mean": _running_mean_advantages}


def check_variant(algorithm: AlgorithmConfig) -> None:
  """ValueError unless the row of `algorithm.variant` names a registered advantage
  estimator (`ADVANTAGE_ESTIMATORS`) and policy loss (`losses.POLICY_LOSSES`): what
  a job checks at start-up (`sao_jax.jobs.startup`), before anything compiles."""
  row = algorithm.spec
  for column, name, registry, where in (
      ("advantage estimator", row.advantage, ADVANTAGE_ESTIMATORS,
       "sao_jax.learner.step.ADVANTAGE_ESTIMATORS"),
      ("policy loss", row.policy_loss, losses.POLICY_LOSSES, "sao_jax.losses.POLICY_LOSSES")):
    if name not in registry:
      fail("algorithm", "variant", algorithm.variant,
           f"its {column} {name!r} is not implemented; allowed values are "
           f"{', '.join(map(repr, registry))} ({where})")


def advantages(alg: AlgorithmConfig, batch: Batch, values: jax.Array | None,
               baseline: losses.RunningMeanState):
  """Per-token advantages of the variant (0 off the action mask) and the new baseline.

  With `algorithm.advantage_centering="batch_mean"`: A_t - sum_s(m_s A_s) / sum_s(m_s),
  m the action mask, over the whole batch (every micro-batch sees the same shift).
  """
  adv, baseline = ADVANTAGE_ESTIMATORS[alg.spec.advantage](alg, batch, values, baseline)
  if alg.advantage_centering == "batch_mean":
    action = batch.action_mask.astype(bool)
    adv = jnp.where(action, adv - losses.aggregate.masked_mean(adv, action), 0.0)
  return adv, baseline


def _accumulate(micro_batches: int, loss_fn: Callable, params, batch: Batch, per_token: tuple):
  """Sum of micro-batch gradients of `loss_fn(params, mb, *per_token_mb)`, plus metrics
  combined over micro-batches: sums for `Total`s, maxima for `*_max`, action-token-
  weighted means for the rest."""
  num = micro_batches
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def one(grad_sum, inputs):
    mb, extra = inputs
    (loss, metrics), grads = grad_fn(params, mb, *extra)
    count = jnp.sum(mb.action_mask.astype(jnp.float32))
    return jax.tree.map(jnp.add, grad_sum, grads), (loss, count, metrics)

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, (loss_M, count_M, metrics_M) = jax.lax.scan(
      one, zeros, (_split(batch, num), _split(per_token, num)))
  weight_M = count_M / jnp.maximum(jnp.sum(count_M), 1.0)

  def combine(name, v):
    if isinstance(v, Total):
      return jnp.sum(v.value)
    return jnp.max(v) if name.endswith("_max") else jnp.sum(v * weight_M)

  metrics = {name: combine(name, v) for name, v in metrics_M.items()}
  return jnp.sum(loss_M), grads, metrics


def _guarded_update(optimizer: optax.GradientTransformation, params, opt_state, grads, loss):
  """Applies the update only if loss and gradients are finite; returns (params, state, ok)."""
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, new_opt_state = optimizer.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jnp.where(finite, new, old)
  return (jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state),
          finite, grad_norm)


def _policy_update(cfg: StepConfig, state: state_lib.TrainState, batch: Batch, adv: jax.Array):
  alg = cfg.algorithm
  loss_impl = losses.POLICY_LOSSES[alg.policy_loss]
  denominator = (losses.loss_denominator(batch.action_mask, alg.loss_agg,
                                         segment_ids=batch.segment_ids)
                 if cfg.learner.micro_batches > 1 else None)

  def loss_fn(trainable, mb: Batch, adv_mb):
    # LoRA: the frozen base is a constant here, so only the adapters get gradients.
    params = (lora.merge(state.policy_params, trainable, cfg.lora, cfg.model)
              if cfg.lora.enabled else trainable)
    replay = mb.routed_experts if cfg.learner.router_replay else None
    out = policy_forward(params, cfg.model, mb.tokens, mb.segment_ids,
                         temperature=cfg.temperature, replay_BxTxLxK=replay)
    loss, metrics = loss_impl(out.logp_BxT, mb.behavior_logp, adv_mb, mb.action_mask,
                              eps_low=alg.eps_low, eps_high=alg.eps_high,
                              loss_agg=alg.loss_agg, denominator=denominator,
                              segment_ids=mb.segment_ids)
    metrics["entropy"] = losses.aggregate.masked_mean(out.entropy_BxT, mb.action_mask)
    if cfg.model.num_experts:
      # MoE: the router's load-balancing loss of the checkpoint's recipe (docs/algorithm.md §5),
      # per micro-batch, so 1/micro_batches of it each.
      aux = moe.load_balancing_loss(out.router_logits, mb.segment_ids,
                                    cfg.model.num_experts_per_tok)
      loss = loss + cfg.model.router_aux_loss_coef * aux / cfg.learner.micro_batches
      metrics["router_aux_loss"] = aux
      metrics["router_balance"] = router_balance(out.router_logits, mb.segment_ids, cfg.model)
    if mb.routed_experts is not None:
      metrics.update({key: Total(count) for key, count in routing.counts(
          out, mb, cfg.model, cfg.algorithm).items()})
    # Lag 0: sampled entirely by the weights this step starts from, so any
    # difference is numerics (sampler vs learner), not staleness.
    lag0 = mb.action_mask.astype(bool) & (mb.behavior_version == state.policy_version)
    gap = jnp.abs(jax.lax.stop_gradient(out.logp_BxT) - mb.behavior_logp.astype(jnp.float32))
    metrics["lag0_abs_logp_sum"] = Total(jnp.sum(jnp.where(lag0, gap, 0.0)))
    metrics["lag0_tokens"] = Total(jnp.sum(lag0.astype(jnp.float32)))
    return loss, metrics

  trainable = state_lib.policy_trainable(cfg.lora, state)
  loss, grads, metrics = _accumulate(cfg.learner.micro_batches, loss_fn, trainable, batch, (adv,))
  params, opt_state, finite, grad_norm = _guarded_update(
      state_lib.policy_optimizer(cfg.learner), trainable, state.policy_opt_state, grads, loss)
  update_norm = optax.tree.norm(jax.tree.map(
      lambda new, old: new.astype(jnp.float32) - old.astype(jnp.float32), params, trainable))
  gap_sum, lag0_tokens = metrics.pop("lag0_abs_logp_sum"), metrics.pop("lag0_tokens")
  routing_counts = {k: metrics.pop(k) for k in list(metrics) if k.startswith("routing/")}
  metrics = {f"policy/{k}": v for k, v in metrics.items()}
  metrics.update(routing_counts)
  metrics.update({"policy/loss": loss, "policy/grad_norm": grad_norm,
                  "policy/update_norm": update_norm,
                  "policy/updated": finite.astype(jnp.float32),
                  "mismatch/lag0_abs_logp_sum": gap_sum, "mismatch/lag0_tokens": lag0_tokens})
  trained = {"policy_adapters" if cfg.lora.enabled else "policy_params": params}
  return state.replace(**trained, policy_opt_state=opt_state,
                       policy_version=state.policy_version + finite.astype(jnp.int32),
                       nonfinite_skips=state.nonfinite_skips + (~finite).astype(jnp.int32)), metrics


def _value_updates(cfg: StepConfig, state: state_lib.TrainState, batch: Batch,
                   old_values: jax.Array, returns: jax.Array):
  """K clipped value updates on one batch; frozen leaves get no gradient at all.

  The value loss covers the tokens the variant's GAE reads values on (its mask):
  a value the advantages bootstrap through must be one the critic was trained on.
  """
  alg = cfg.algorithm
  frozen = state_lib.frozen_value_mask(alg, state.value_params)
  optimizer = state_lib.value_optimizer(cfg.learner, frozen)
  critic_mask, _ = _gae_inputs(alg, batch)
  denominator = (losses.loss_denominator(critic_mask, alg.loss_agg,
                                         segment_ids=batch.segment_ids)
                 if cfg.learner.micro_batches > 1 else None)

  def loss_fn(params, mb: Batch, old_mb, returns_mb, mask_mb):
    # stop_gradient on frozen leaves: XLA then skips their weight gradients.
    params = jax.tree.map(lambda p, f: jax.lax.stop_gradient(p) if f else p, params, frozen)
    values = value_forward(params, cfg.model, mb.tokens, mb.segment_ids)
    return losses.value_loss(values, old_mb, returns_mb, mask_mb, clip_eps=alg.value_clip,
                             loss_agg=alg.loss_agg, denominator=denominator,
                             segment_ids=mb.segment_ids)

  history = []
  for _ in range(alg.value_updates_per_step):
    loss, grads, metrics = _accumulate(cfg.learner.micro_batches, loss_fn, state.value_params,
                                       batch, (old_values, returns, critic_mask))
    params, opt_state, finite, grad_norm = _guarded_update(
        optimizer, state.value_params, state.value_opt_state, grads, loss)
    state = state.replace(value_params=params, value_opt_state=opt_state,
                          nonfinite_skips=state.nonfinite_skips + (~finite).astype(jnp.int32))
    history.append({"value/loss": loss, "value/grad_norm": grad_norm,
                    "value/clip_frac": metrics["value_clip_frac"]})
  # Report the mean over the K updates.
  return state, jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs)), *history)


def _response_lengths(batch: Batch) -> Metrics:
  """p50 / p90 (linear interpolation) / max of action tokens per trajectory; NaN
  for a batch without trajectories."""
  seg = batch.segment_ids
  per_start = segments.reduce(batch.action_mask.astype(jnp.float32), seg)
  lengths = jnp.where(segments.segment_starts(seg), per_start, jnp.nan)
  p50, p90 = jnp.nanpercentile(lengths, jnp.asarray([50.0, 90.0]))
  return {"response/action_tokens_p50": p50, "response/action_tokens_p90": p90,
          "response/action_tokens_max": jnp.nanmax(lengths)}


def _opening_advantages(batch: Batch, adv: jax.Array) -> Metrics:
  """Where the policy picks an episode's path: the advantage on each trajectory's
  first action token (its opening), split by the episode's shape. A turn starts at
  an action token whose predecessor is not an action token of the same segment;
  single-turn trajectories answered at once, multi-turn ones called a tool (or
  were reminded) first. Both paths leave the same prompt state, so an unbiased
  estimator's openings differ by about the paths' return difference:
  E[A_open | single] - E[A_open | multi] ~ reward/single_turn - reward/multi_turn.
  A gap beyond that is the critic's bootstrap bias steering the path choice.
  NaN for a shape the batch has no trajectory of."""
  action = batch.action_mask.astype(bool)
  seg = batch.segment_ids
  same_seg = seg == jnp.pad(seg[:, :-1], ((0, 0), (1, 0)))
  after_action = jnp.pad(action[:, :-1], ((0, 0), (1, 0))) & same_seg
  turn_start = action & ~after_action
  length = seg.shape[1]
  t_BxT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], seg.shape)
  first = segments.reduce(jnp.where(action, t_BxT, length), seg, jax.ops.segment_min)
  opening = action & (t_BxT == segments.spread(first, seg))
  starts = segments.segment_starts(seg)
  turns = segments.reduce(turn_start.astype(jnp.float32), seg)
  outcome = segments.reduce(jnp.where(action, batch.rewards, 0.0), seg)
  open_adv = segments.reduce(jnp.where(opening, adv, 0.0), seg)
  single = starts & (turns == 1)
  multi = starts & (turns > 1)

  def mean(x, where):
    return jnp.where(jnp.any(where), jnp.sum(jnp.where(where, x, 0.0)) / jnp.sum(where), jnp.nan)

  return {"advantage/opening_single_turn": mean(open_adv, single),
          "advantage/opening_multi_turn": mean(open_adv, multi),
          "reward/single_turn": mean(outcome, single),
          "reward/multi_turn": mean(outcome, multi),
          "episodes/single_turn_frac": jnp.sum(single) / jnp.maximum(jnp.sum(single | multi), 1)}


def update_policy_at(learner: LearnerConfig, algorithm: AlgorithmConfig, step: int) -> jax.Array:
  """The `update_policy` flag for learner step `step` (from 0): False on the
  `value_only_steps`, else True."""
  return jnp.asarray(step >= value_only_steps(learner, algorithm))


def train_step(state: state_lib.TrainState, batch: Batch, update_policy: jax.Array, *,
               cfg: StepConfig) -> tuple[state_lib.TrainState, Metrics]:
  """One learner step. `update_policy` (bool scalar) is False on value-only steps
  (critic warm-up, value pretraining)."""
  alg = cfg.algorithm
  action = batch.action_mask.astype(bool)
  seg = batch.segment_ids
  # Per trajectory (segment); empty rows hold none and do not dilute the mean.
  outcome = segments.reduce(jnp.where(action, batch.rewards, 0.0), seg)
  exists = segments.segment_starts(seg).astype(jnp.float32)
  metrics: Metrics = {"reward/mean": jnp.sum(outcome * exists) / jnp.maximum(jnp.sum(exists), 1.0),
                      "tokens/action": jnp.sum(action.astype(jnp.float32)),
                      "tokens/total": jnp.sum((seg != 0).astype(jnp.float32))}
  metrics.update(_response_lengths(batch))

  old_values = returns = None
  if alg.uses_critic:
    old_values = _values(cfg.model, cfg.learner.micro_batches, state.value_params, batch)
    returns = value_targets(alg, batch, old_values)
    metrics["value/explained_variance"] = losses.explained_variance(old_values, returns, action)
    metrics["value/mean"] = losses.aggregate.masked_mean(old_values, action)
    metrics["value/bias"] = losses.aggregate.masked_mean(old_values - returns, action)
    # With tokens/action and value/bias: what the host pools over a window of steps.
    metrics.update({f"value/{k}": v for k, v in
                    losses.critic_moments(old_values, returns, action).items()})

  advantage_values = old_values
  if alg.uses_critic and cfg.learner.advantage_values == "after_critic_update":
    state, value_metrics = _value_updates(cfg, state, batch, old_values, returns)
    metrics.update(value_metrics)
    advantage_values = _values(cfg.model, cfg.learner.micro_batches, state.value_params, batch)

  adv, baseline = advantages(alg, batch, advantage_values, state.baseline)
  state = state.replace(baseline=baseline)
  metrics["advantage/mean"] = losses.aggregate.masked_mean(adv, action)
  metrics["advantage/std"] = jnp.sqrt(losses.aggregate.masked_mean(
      jnp.square(adv - metrics["advantage/mean"]), action))
  metrics["advantage/neg_frac"] = losses.aggregate.masked_mean(
      (adv < 0).astype(jnp.float32), action)
  # Trajectories whose every action token has A = 0: for group variants, the members of
  # groups whose rewards are all equal (no contrast, no gradient), e.g. all-fail groups.
  signal = segments.reduce(jnp.where(action & (adv != 0), 1.0, 0.0), seg)
  metrics["advantage/zero_traj_frac"] = (jnp.sum(jnp.where(signal == 0, exists, 0.0))
                                         / jnp.maximum(jnp.sum(exists), 1.0))
  metrics.update(_opening_advantages(batch, adv))

  if alg.require_reward_contrast:
    # No two trajectories differ in reward: the advantages are the critic's residual
    # error, not signal (AlgorithmConfig.require_reward_contrast).
    highest = jnp.max(jnp.where(exists > 0, outcome, -jnp.inf))
    lowest = jnp.min(jnp.where(exists > 0, outcome, jnp.inf))
    contrast = highest > lowest
    metrics["policy/no_contrast_skip"] = (update_policy & ~contrast).astype(jnp.float32)
    update_policy = update_policy & contrast

  def skip(state):
    shapes = jax.eval_shape(lambda s: _policy_update(cfg, s, batch, adv)[1], state)
    return state, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  state, policy_metrics = jax.lax.cond(
      update_policy, lambda s: _policy_update(cfg, s, batch, adv), skip, state)
  gap_sum = policy_metrics.pop("mismatch/lag0_abs_logp_sum")
  lag0_tokens = policy_metrics["mismatch/lag0_tokens"]
  # Undefined without lag-0 tokens (also on value-only steps): NaN, not a 0 that
  # would read as "sampler and learner agree".
  policy_metrics["mismatch/lag0_abs_logp"] = jnp.where(
      lag0_tokens > 0, gap_sum / jnp.maximum(lag0_tokens, 1.0), jnp.nan)
  metrics.update(routing.shares(policy_metrics))

  if alg.uses_critic and cfg.learner.advantage_values == "before_critic_update":
    state, value_metrics = _value_updates(cfg, state, batch, old_values, returns)
    metrics.update(value_metrics)

  state = state.replace(step=state.step + 1)
  metrics["nonfinite_skips"] = state.nonfinite_skips.astype(jnp.float32)
  metrics["policy_version"] = state.policy_version.astype(jnp.float32)
  return state, metrics
