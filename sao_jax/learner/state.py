"""Train state and optimisers.

`TrainState` holds everything a step reads and writes: policy and value params,
their optax states, the step counter, the policy version (bumped by every policy
update), the running-mean baseline windows and the count of updates skipped for
non-finite loss or gradients.

The value optimiser is an `optax.partition` of a trainable branch and
`optax.set_to_zero()` for the frozen attention leaves (docs/algorithm.md §4), so frozen
leaves carry no optimizer state and never move.

LoRA (`lora.enabled`, `sao_jax.models.lora`): `policy_params` is the frozen
base and `policy_adapters` the trained adapters; the policy optimizer and its
state cover only the adapters. Without LoRA `policy_adapters` is empty.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import optax

from sao_jax.config import AlgorithmConfig, Config, LearnerConfig, LoraConfig
from sao_jax.losses import RunningMeanState, init_running_mean
from sao_jax.models import lora, value as value_model
from sao_jax.models.transformer import Params, init_params


LORA_SEED_STREAM = 1  # fold_in(key(cfg.seed), this): the adapters' init, apart from the params'


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32: train steps taken (value-only steps included)
  policy_version: jax.Array  # int32: policy updates applied; published with the weights
  policy_params: Params  # with LoRA: the frozen base (`lora.frozen_base`: NF4 under QLoRA)
  value_params: Params
  policy_opt_state: optax.OptState
  value_opt_state: optax.OptState
  baseline: RunningMeanState
  nonfinite_skips: jax.Array  # int32: updates skipped because loss or grads were not finite
  policy_adapters: Params = flax.struct.field(default_factory=dict)  # LoRA adapters; {} without


def policy_trainable(lora_cfg: LoraConfig, state: TrainState) -> Params:
  """What the policy optimizer trains: the adapters with LoRA, else the params."""
  return state.policy_adapters if lora_cfg.enabled else state.policy_params


def policy_weights(cfg: Config, state: TrainState) -> Params:
  """The policy a sampler or evaluator runs: base merged with the adapters under LoRA."""
  if not cfg.lora.enabled:
    return state.policy_params
  return lora.merge(state.policy_params, state.policy_adapters, cfg.lora, cfg.model)


def checkpointed(cfg: Config, state: TrainState) -> TrainState:
  """What a checkpoint holds of `state`. With LoRA the frozen base is left out (it is
  reloaded from `run.init`, `with_frozen_parts`), and so, in critic-free variants, are
  the never-trained critic and its optimizer state: adapters + optimizer state only."""
  if not cfg.lora.enabled:
    return state
  left_out = {"policy_params": {}}
  if not cfg.algorithm.uses_critic:
    left_out.update(value_params={}, value_opt_state={})
  return state.replace(**left_out)


def with_frozen_parts(cfg: Config, restored: TrainState, fresh: TrainState) -> TrainState:
  """A restored `checkpointed` state completed with what it left out, taken from the
  step-0 state `fresh` built around the same base."""
  if not cfg.lora.enabled:
    return restored
  filled = {"policy_params": fresh.policy_params}
  if not cfg.algorithm.uses_critic:
    filled.update(value_params=fresh.value_params, value_opt_state=fresh.value_opt_state)
  return restored.replace(**filled)


def _schedule(cfg: LearnerConfig, peak_lr: float, warmup_steps: int) -> optax.Schedule:
  """`peak_lr` after a linear warm-up from 0 over `warmup_steps` updates, then constant
  or cosine-decayed to 10% over the rest of `cfg.steps`."""
  decay_steps = max(cfg.steps - warmup_steps, 1)
  if cfg.lr_schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak_lr, decay_steps, alpha=0.1)
  else:
    decay = optax.constant_schedule(peak_lr)
  if not warmup_steps:
    return decay
  warmup = optax.linear_schedule(0.0, peak_lr, warmup_steps)
  return optax.join_schedules([warmup, decay], [warmup_steps])


def _adamw(cfg: LearnerConfig, peak_lr: float, warmup_steps: int) -> optax.GradientTransformation:
  clip = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip is not None else []
  return optax.chain(*clip, optax.adamw(_schedule(cfg, peak_lr, warmup_steps), b1=cfg.adam_b1,
                                        b2=cfg.adam_b2, eps=cfg.adam_eps,
                                        weight_decay=cfg.weight_decay))


def frozen_value_mask(algorithm: AlgorithmConfig, value_params: Params) -> Params:
  """Bool pytree, True on value-model leaves that must not train."""
  if not algorithm.frozen_attention:
    return jax.tree.map(lambda _: False, value_params)
  return value_model.frozen_mask(value_params, algorithm.frozen_patterns)


def policy_optimizer(learner: LearnerConfig) -> optax.GradientTransformation:
  """AdamW at `policy_lr`, warmed up over the policy's first `lr_warmup_steps` updates."""
  return _adamw(learner, learner.policy_lr, learner.lr_warmup_steps)


def value_optimizer(learner: LearnerConfig, frozen: Params) -> optax.GradientTransformation:
  """AdamW at `critic_lr` from the first value update (the warm-up is the policy's:
  the critic's value-only steps come first and must learn at the paper's rate),
  and nothing for the frozen leaves."""
  labels = jax.tree.map(lambda is_frozen: "frozen" if is_frozen else "train", frozen)
  return optax.partition({"train": _adamw(learner, learner.critic_lr, 0),
                          "frozen": optax.set_to_zero()}, labels)


def _baseline_slots(algorithm: AlgorithmConfig) -> int:
  return 1 if algorithm.running_mean_scope == "global" else algorithm.running_mean_slots


def state_from_params(cfg: Config, policy_params: Params, value_params: Params) -> TrainState:
  """A step-0 state around given params (e.g. loaded from Hugging Face)."""
  # The step donates the state, so no two leaves may share a buffer; a critic made
  # by `value_params_from_policy` shares the policy's trunk arrays until copied.
  value_params = jax.tree.map(jnp.copy, value_params)
  frozen = frozen_value_mask(cfg.algorithm, value_params)
  if cfg.lora.enabled:  # QLoRA: the frozen base is held quantised
    policy_params = lora.frozen_base(policy_params, cfg.model, cfg.lora)
  adapters = (lora.init_adapters(cfg.model, cfg.lora, jax.random.fold_in(jax.random.key(cfg.seed),
                                                                         LORA_SEED_STREAM))
              if cfg.lora.enabled else {})
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      policy_version=jnp.zeros((), jnp.int32),
      policy_params=policy_params,
      value_params=value_params,
      policy_adapters=adapters,
      policy_opt_state=policy_optimizer(cfg.learner).init(
          adapters if cfg.lora.enabled else policy_params),
      value_opt_state=value_optimizer(cfg.learner, frozen).init(value_params),
      baseline=init_running_mean(_baseline_slots(cfg.algorithm),
                                 cfg.algorithm.running_mean_window),
      nonfinite_skips=jnp.zeros((), jnp.int32),
  )


def init_state(cfg: Config, rng: jax.Array) -> TrainState:
  """Random policy; the critic copies its trunk with a fresh head (docs/algorithm.md §4)."""
  policy_params = init_params(cfg.model, rng)
  return state_from_params(cfg, policy_params,
                           value_model.value_params_from_policy(policy_params, cfg.model))


def abstract_state(cfg: Config) -> TrainState:
  """Shapes and dtypes of the train state, allocating nothing."""
  return jax.eval_shape(functools.partial(init_state, cfg), jax.random.key(0))
