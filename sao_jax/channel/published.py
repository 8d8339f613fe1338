"""The published-weights format: what the learner ships each version, and how a
sampler turns it back into the policy it decodes with.

Without LoRA a version is the whole policy. Under LoRA (`lora.enabled`) it is only
the adapters: every sampler holds the frozen base (loaded once from `run.init`,
NF4 under QLoRA exactly as the learner holds it) and merges each version's
adapters into it, so a version costs adapter bytes on the wire, not model bytes.
"""

from __future__ import annotations

from typing import Any, Callable

from sao_jax.config import Config
from sao_jax.models import lora
from sao_jax.models.transformer import Params


def published_weights(cfg: Config, state: Any) -> Params:
  """What the weight channel ships for the train state `state`: its adapters under
  LoRA, else its policy params."""
  return state.policy_adapters if cfg.lora.enabled else state.policy_params


def published_template(cfg: Config, policy_template: Params) -> Params:
  """Shapes of `published_weights` given the policy's (`policy_template`)."""
  return lora.abstract_adapters(cfg.model, cfg.lora) if cfg.lora.enabled else policy_template


def published_to_policy(cfg: Config, load_base: Callable[[], Params]) -> Callable[[Any], Params]:
  """Published weights -> the policy's params: as they are, or under LoRA the base
  (`load_base()`, called once here) merged with each version's adapters."""
  if not cfg.lora.enabled:
    return lambda params: params
  import jax  # only under LoRA: the merge is a jitted program

  base = jax.jit(lora.frozen_base, static_argnums=(1, 2))(load_base(), cfg.model, cfg.lora)
  merge = jax.jit(lora.merge, static_argnums=(2, 3))
  return lambda adapters: merge(base, adapters, cfg.lora, cfg.model)
