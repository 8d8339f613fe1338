"""Pure SAO losses on `[B, T]` arrays: no model inside, all jit-able.

See docs/algorithm.md for the math; each module's docstring restates its part.
"""

from sao_jax.losses.advantages import (RunningMeanState, grpo_advantages, init_running_mean,
                                       running_mean_advantages)
from sao_jax.losses.aggregate import LOSS_AGGS, loss_denominator
from sao_jax.losses.gae import gae, length_adaptive_lam
from sao_jax.losses.policy import (POLICY_LOSSES, dis_band, dis_policy_loss,
                                   entropy_from_logits, ppo_clip_loss)
from sao_jax.losses.value import critic_moments, explained_variance, value_loss

__all__ = [
    "LOSS_AGGS",
    "POLICY_LOSSES",
    "RunningMeanState",
    "dis_band",
    "dis_policy_loss",
    "entropy_from_logits",
    "critic_moments",
    "explained_variance",
    "gae",
    "grpo_advantages",
    "init_running_mean",
    "length_adaptive_lam",
    "loss_denominator",
    "ppo_clip_loss",
    "running_mean_advantages",
    "value_loss",
]
