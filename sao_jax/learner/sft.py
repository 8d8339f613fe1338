"""Supervised warm-start: next-token cross-entropy on action tokens.

    loss = - sum_t action_mask_t * log p(x_t | x_<t) / sum_t action_mask_t

over demonstration trajectories (the environment's ideal turns rendered with
the chat template), so the policy learns the action format before RL; prompt,
observation and template tokens are context only. Same forward as RL
(`policy_forward`), plain AdamW, one jitted step.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import jax
import optax

from sao_jax.config import ModelConfig
from sao_jax.losses.aggregate import masked_mean
from sao_jax.models.forward import policy_forward
from sao_jax.models.transformer import Params
from sao_jax.types import Batch


def sft_loss(params: Params, cfg: ModelConfig, batch: Batch) -> tuple[jax.Array, dict]:
  out = policy_forward(params, cfg, batch.tokens, batch.segment_ids)
  nll = -masked_mean(out.logp_BxT, batch.action_mask)
  return nll, {"sft/loss": nll, "sft/entropy": masked_mean(out.entropy_BxT, batch.action_mask)}


def _step(params, opt_state, batch, *, cfg: ModelConfig, optimizer):
  (_, metrics), grads = jax.value_and_grad(sft_loss, has_aux=True)(params, cfg, batch)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  metrics["sft/grad_norm"] = optax.tree.norm(grads)
  return optax.apply_updates(params, updates), opt_state, metrics


def train_sft(params: Params, cfg: ModelConfig, batches: Iterator[Batch], *, steps: int,
              learning_rate: float, log=lambda step, metrics: None,
              stop: Callable[[int, Params], bool] | None = None,
              check_every: int = 1) -> tuple[Params, int]:
  """Up to `steps` AdamW steps (cosine-decayed `learning_rate`) over `batches`.

  After every `check_every` steps, `stop(steps_done, params)` may end training
  early (the schedule is not shortened: the stop is a point on the full run).
  Returns (params, steps done).
  """
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(steps // 10, 1), steps,
                                                learning_rate * 0.1)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))
  opt_state = optimizer.init(params)
  step_fn = jax.jit(functools.partial(_step, cfg=cfg, optimizer=optimizer), donate_argnums=(0, 1))
  for step in range(steps):
    params, opt_state, metrics = step_fn(params, opt_state, next(batches))
    log(step, {k: float(v) for k, v in jax.device_get(metrics).items()})
    done = step + 1
    if stop is not None and done < steps and done % check_every == 0 and stop(done, params):
      return params, done
  return params, steps
