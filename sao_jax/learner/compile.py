"""Shardings of the train state and batch, sharded init, and the jitted step.

The one place the learner is jitted:

    step_fn = compile_train_step(cfg, mesh)       # jit with in/out shardings, donation
    state = init_sharded_state(cfg, mesh, rng)    # each leaf born in its sharding
    state, metrics = step_fn(state, put_batch(batch, mesh), update_policy)

Params follow the model's logical-axis rules (`sao_jax.sharding.rules`);
optimizer moments mirror their params' shardings; scalars and the running-mean
windows are replicated; a batch splits its rows (`learner.batch_rows`: one
trajectory each, or packed rows) over the `activation_batch` mesh axes (data,
fsdp, expert) and its positions over the `sequence` axis.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from sao_jax.config import Config
from sao_jax.learner import state as state_lib
from sao_jax.learner.step import StepConfig, train_step
from sao_jax.models import lora, moe, splash
from sao_jax.models.transformer import moe_layers, param_shardings
from sao_jax.sharding import rules, sequence
from sao_jax.sharding.mesh import traced_on
from sao_jax.types import Batch


def _opt_state_shardings(abstract_opt_state, abstract_params, params_shardings,
                         replicated: NamedSharding):
  """Optimizer-state leaves that mirror a param (Adam moments) take its sharding.

  A mirroring leaf's key path ends with its param's key path and has its shape
  (e.g. `...mu['layers'][0]['mlp']['up_proj']`); everything else (step counts)
  is replicated. Frozen leaves are `MaskedNode`s with no arrays at all.
  """
  by_path = {}
  for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(abstract_params),
                                    jax.tree.leaves(params_shardings)):
    by_path[tuple(path)] = (leaf.shape, sharding)

  def one(path, leaf):
    for start in range(len(path)):
      shape, sharding = by_path.get(tuple(path[start:]), (None, None))
      if shape == leaf.shape:
        return sharding
    return replicated

  return jax.tree_util.tree_map_with_path(one, abstract_opt_state)


def state_shardings(cfg: Config, mesh: jax.sharding.Mesh) -> state_lib.TrainState:
  """A `TrainState` of `NamedSharding`s for `mesh`."""
  abstract = state_lib.abstract_state(cfg)
  replicated = NamedSharding(mesh, PartitionSpec())
  policy = (lora.base_shardings(cfg.model, cfg.lora, mesh) if cfg.lora.enabled
            else param_shardings(cfg.model, mesh, "lm"))
  value = param_shardings(cfg.model, mesh, "value")
  # LoRA adapters are small ([in, r], [r, out]): replicated, like their Adam moments.
  adapters = jax.tree.map(lambda _: replicated, abstract.policy_adapters)
  trained, trained_sh = ((abstract.policy_adapters, adapters) if cfg.lora.enabled
                         else (abstract.policy_params, policy))
  return state_lib.TrainState(
      step=replicated,
      policy_version=replicated,
      policy_params=policy,
      value_params=value,
      policy_adapters=adapters,
      policy_opt_state=_opt_state_shardings(abstract.policy_opt_state, trained, trained_sh,
                                            replicated),
      value_opt_state=_opt_state_shardings(abstract.value_opt_state, abstract.value_params,
                                           value, replicated),
      baseline=jax.tree.map(lambda _: replicated, abstract.baseline),
      nonfinite_skips=replicated,
  )


def batch_shardings(cfg: Config, mesh: jax.sharding.Mesh, length: int) -> Batch:
  """Rows over the activation-batch mesh axes, positions (natural order) over the
  sequence axis; ValueError if they do not divide (`sao_jax.sharding.sequence`). MoE
  routing ([B, T, L, k]) splits its rows alike, its last two axes whole."""
  sequence.check_length(length, sequence.shards(mesh.abstract_mesh))
  two_d = rules.logical_sharding(mesh, ("activation_batch", "activation_length"),
                                 (cfg.learner.batch_rows, length))
  return Batch(*[two_d] * len(Batch._fields))


def abstract_batch(cfg: Config, mesh: jax.sharding.Mesh, length: int) -> Batch:
  """The step's batch as sharded `jax.ShapeDtypeStruct`s, for lowering without data
  (with the sampler's routing records for an MoE model)."""
  model = cfg.model
  shape = (cfg.learner.batch_rows, length)
  routing = ((shape + (moe_layers(model), model.num_experts_per_tok),
              moe.expert_index_dtype(model.num_experts)) if model.num_experts else None)
  shapes = Batch(tokens=(shape, jnp.int32), segment_ids=(shape, jnp.int32),
                 action_mask=(shape, jnp.int32), behavior_logp=(shape, jnp.float32),
                 rewards=(shape, jnp.float32), prompt_ids=(shape, jnp.int32),
                 behavior_version=(shape, jnp.int32), routed_experts=routing)
  return Batch(*[None if spec is None else jax.ShapeDtypeStruct(*spec, sharding=sharding)
                 for spec, sharding in zip(shapes, batch_shardings(cfg, mesh, length))])


def put_batch(batch: Batch, shardings: Batch) -> Batch:
  """Host numpy batch -> global jax.Arrays laid out as `shardings` (single-process); a
  field the batch leaves out (None) stays None."""
  return jax.tree.map(lambda x, s: None if x is None else jax.device_put(np.asarray(x), s),
                      batch, shardings, is_leaf=lambda x: x is None)


def init_sharded_state(cfg: Config, mesh: jax.sharding.Mesh,
                       rng: jax.Array) -> state_lib.TrainState:
  """Initial state with every leaf created directly in its sharding."""
  init = jax.jit(functools.partial(state_lib.init_state, cfg),
                 out_shardings=state_shardings(cfg, mesh))
  return init(rng)


def learner_attention(cfg: Config, mesh: jax.sharding.Mesh, length: int) -> splash.Choice | None:
  """The attention path the train step's forwards take on `mesh` for rows of `length`
  tokens (each pass holds batch_rows / micro_batches rows), and why; None for
  `model.attention_impl` "dense" or "blocked". What the learner logs and sao-plan
  prints: the `splash.choose` call the traced step makes."""
  rows = cfg.learner.batch_rows // cfg.learner.micro_batches
  return splash.learner_choice(cfg.model, mesh, rows, length)


def compile_train_step(cfg: Config, mesh: jax.sharding.Mesh, length: int):
  """`train_step` jitted for `mesh` and batches of `[learner.batch_rows, length]`.

  The state argument is donated: its buffers are reused for the new state.
  Metrics come back replicated.

  Traced on `mesh` (the MoE layers need it for their expert-parallel
  shard_map) but with the model's activation hints (`sharding.rules.constrain`)
  off, so the compiler propagates the input shardings: measured with
  benchmarks/learner.py (100M dense model, fsdp=8), the hints raised per-device
  temporaries from 0.37 to 1.05 GiB.
  """
  replicated = NamedSharding(mesh, PartitionSpec())
  state_sh = state_shardings(cfg, mesh)
  return jax.jit(traced_on(mesh, functools.partial(train_step, cfg=StepConfig.of(cfg))),
                 in_shardings=(state_sh, batch_shardings(cfg, mesh, length), replicated),
                 out_shardings=(state_sh, replicated), donate_argnums=0)
