"""The critic: the policy's trunk with a scalar head, and its frozen-attention mask.

  value_params_from_policy(policy_params, cfg)     -> value params (trunk copied,
                                                      fresh zero head, no LM head)
  frozen_mask(params, patterns=FROZEN_ATTENTION_PATTERNS) -> bool pytree, True = frozen

SAO (§4) trains the critic with its attention weights frozen. The learner
applies the mask with e.g. `optax.multi_transform` or by zeroing the frozen
updates. Patterns are regexes matched (`re.search`) against "/"-joined param
paths such as "layers/3/attn/q_proj"; a path is frozen if any pattern matches.
The default selects the q/k/v/o projections and q/k norms of every layer, the
same in dense and MoE models (the attention block is identical in both).
"""

from __future__ import annotations

import re
from typing import Sequence

import jax
import jax.numpy as jnp

from sao_jax.config import FROZEN_ATTENTION_PATTERNS, ModelConfig
from sao_jax.models.transformer import Params, abstract_params, param_path



def value_params_from_policy(policy_params: Params, cfg: ModelConfig) -> Params:
  """Value params sharing the policy's trunk values, with a zero scalar head.

  The returned trunk arrays are the policy's own (no copy); jax arrays are
  immutable, so training either model never changes the other.
  """
  template = abstract_params(cfg, "value")
  params = {name: policy_params[name] for name in template if name != "value_head"}
  head = template["value_head"]
  params["value_head"] = {name: jnp.zeros(leaf.shape, leaf.dtype) for name, leaf in head.items()}
  return params


def frozen_mask(params: Params, patterns: Sequence[str] = FROZEN_ATTENTION_PATTERNS) -> Params:
  """Params-shaped pytree of bools: True where the param path matches a pattern."""
  compiled = []
  for pattern in patterns:
    try:
      compiled.append(re.compile(pattern))
    except re.error as err:
      raise ValueError(f"frozen_mask: pattern {pattern!r} is not a valid regex ({err})") from err
  return jax.tree_util.tree_map_with_path(
      lambda keypath, _: any(p.search(param_path(keypath)) for p in compiled), params)
