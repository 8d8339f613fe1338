"""The RL objective: variant, advantages, policy loss, critic, baselines (docs/algorithm.md §2-§5)."""

from __future__ import annotations

import dataclasses
import re
import types
from typing import Any, Mapping

from sao_jax.config.checks import check_choice, check_positive, fail


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
  """One row of the variant table (docs/algorithm.md §5).

  advantage: which estimator turns rewards into per-token advantages ("gae"
    needs the critic's values; "group" needs `grouped`); a name of
    `sao_jax.learner.step.ADVANTAGE_ESTIMATORS`, where the estimators are.
  policy_loss: "dis" (docs/algorithm.md §2) or "ppo_clip"; a name of
    `sao_jax.losses.POLICY_LOSSES`, where the losses are.
  A job checks both names against those registries at start-up
  (`sao_jax.learner.step.check_variant`).
  grouped: n >= 2 rollouts per prompt, trained only as whole groups.
  preset: the paper's settings of the variant's other `AlgorithmConfig` fields.
  """

  advantage: str
  policy_loss: str
  grouped: bool = False
  preset: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.grouped != (self.advantage == "group"):
      raise ValueError("Variant.grouped: group advantages need groups, and only they do")

  @property
  def uses_critic(self) -> bool:
    return self.advantage == "gae"


# The one table of algorithm variants: validation, the learner step, the data
# pipeline and the job read it. A new variant is one row (plus a registered loss
# function if its policy loss or advantage estimator is new).
VARIANTS: Mapping[str, Variant] = types.MappingProxyType({
    "sao": Variant(advantage="gae", policy_loss="dis"),
    "sao_dis_only": Variant(advantage="gae", policy_loss="dis",
                            preset={"value_updates_per_step": 1, "frozen_attention": False}),
    "grpo": Variant(advantage="group", policy_loss="ppo_clip", grouped=True,
                    preset={"group_size": 8, "eps_low": 0.2, "eps_high": 0.28,
                            "value_updates_per_step": 0}),
    "grpo_dis": Variant(advantage="group", policy_loss="dis", grouped=True,
                        preset={"group_size": 8, "value_updates_per_step": 0}),
    # Not the paper's: SAO with the two remedies the drift study found necessary for
    # long runs from weak or saturated starts (README, "Why SAO drifted";
    # docs/research/variants.md): batch-mean-centred advantages (a critic's bias is a net
    # push on every sampled token) and no policy step on a batch whose rewards are all
    # equal (Adam turns the critic's residual error there into full-size steps).
    "sao_centered_gated": Variant(advantage="gae", policy_loss="dis",
                                  preset={"advantage_centering": "batch_mean",
                                          "require_reward_contrast": True}),
    "running_mean": Variant(advantage="running_mean", policy_loss="dis",
                            preset={"value_updates_per_step": 0}),
    "ppo": Variant(advantage="gae", policy_loss="ppo_clip",
                   preset={"value_updates_per_step": 1, "eps_low": 0.2, "eps_high": 0.2,
                           "frozen_attention": False, "gae_span": "response"}),
})
LOSS_AGGS = ("token_mean", "token_mean_kept", "seq_mean_token_mean")
GAE_METHODS = ("auto", "associative", "scan")
GAE_SPANS = ("actions", "response")
# What is subtracted from a batch's advantages before the policy loss: "none" (the
# paper) or "batch_mean", the mean over the batch's action tokens (docs/algorithm.md §8).
ADVANTAGE_CENTERINGS = ("none", "batch_mean")
# The value model's attention: q/k/v/o projections, their biases (qwen2) and q/k
# norms (qwen3) of every layer (identical in dense and MoE), frozen during critic
# training (docs/algorithm.md §4).
FROZEN_ATTENTION_PATTERNS = (
    r"^layers/\d+/attn/(q_proj|k_proj|v_proj|o_proj|q_bias|k_bias|v_bias|q_norm|k_norm)(/|$)",)



@dataclasses.dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
  """The RL objective (docs/algorithm.md §2-§5). `variant` picks the advantage estimator and
  policy loss; use `AlgorithmConfig.for_variant(name)` for the paper's settings
  of each variant, then override individual fields.
  """

  variant: str = "sao"  # the algorithm: one row of VARIANTS (docs/algorithm.md §5)
  # Advantages (docs/algorithm.md §3): lam_policy = 1 - 1 / (lam_alpha * l) per trajectory,
  # unless `lam_policy` is set to a fixed value.
  gamma: float = 1.0  # discount per action token (1: undiscounted)
  lam_alpha: float = 1.5  # alpha of the length-adaptive lambda_policy = 1 - 1 / (alpha * l)
  lam_policy: float | None = None  # fixed GAE lambda of the advantages (None: length-adaptive)
  lam_critic: float = 1.0  # GAE lambda of the value targets (1: the return)
  gae_method: str = "auto"  # GAE implementation: scan, associative, or auto (per backend)
  # Tokens GAE runs over: "actions" skips observation tokens (docs/algorithm.md §3);
  # "response" is plain GAE over every token from a trajectory's first to its
  # last action, observations included (the ppo preset; the claim-4 ablation).
  gae_span: str = "actions"
  # "batch_mean": A_t <- A_t - mean of A over the batch's action tokens, so the
  # policy update carries no net push up or down on the sampled tokens (a critic's
  # bias is such a push); "none": the estimator's advantages as they are.
  advantage_centering: str = "none"
  # True: skip the policy update (its optimizer state unchanged; the critic still
  # trains) on a batch whose trajectories all earned the same reward. Its advantages
  # then hold no outcome contrast, only the critic's residual error, which Adam's
  # normalisation turns into full-size steps: SAO's random walk at a saturated (or
  # all-failing) reward (docs/algorithm.md §8). False: the paper's SAO.
  require_reward_contrast: bool = False
  # Policy loss (docs/algorithm.md §2): DIS band (1 - eps_low, 1 + eps_high), PPO clip for grpo/ppo.
  eps_low: float = 0.3  # lower edge of the DIS band 1 - eps_low, or PPO's lower clip
  eps_high: float = 5.0  # upper edge of the DIS band 1 + eps_high, or PPO's upper clip
  loss_agg: str = "token_mean"  # the loss normaliser (docs/algorithm.md §2)
  # Critic (docs/algorithm.md §4).
  value_updates_per_step: int = 2  # K: value updates per policy update (0: no critic)
  value_clip: float | None = 0.2  # eps_v of the clipped value loss (None: unclipped)
  frozen_attention: bool = True  # freeze the value model's attention parameters (frozen_patterns)
  # Regexes over "/"-joined value-model param paths; matching leaves are frozen
  # (no gradient, no optimizer state) when `frozen_attention` is on.
  frozen_patterns: tuple[str, ...] = FROZEN_ATTENTION_PATTERNS
  # Baselines (docs/algorithm.md §5).
  group_size: int = 1  # rollouts per prompt (grouped variants: >= 2, paper 8)
  running_mean_window: int = 8  # W: outcomes in a running-mean baseline's window
  running_mean_scope: str = "prompt"  # one running-mean window per prompt, or one global window
  running_mean_slots: int = 4096  # prompt ids must lie in [0, slots) for scope "prompt"

  @classmethod
  def for_variant(cls, variant: str, **overrides: Any) -> "AlgorithmConfig":
    """The paper's settings for `variant` (docs/algorithm.md §5), with `overrides` on top."""
    if variant not in VARIANTS:
      fail("algorithm", "variant", variant, f"allowed values are {', '.join(VARIANTS)}")
    return cls(variant=variant, **{**VARIANTS[variant].preset, **overrides})

  @property
  def spec(self) -> Variant:
    """The variant's row of `VARIANTS`."""
    return VARIANTS[self.variant]

  @property
  def uses_critic(self) -> bool:
    return self.spec.uses_critic

  @property
  def policy_loss(self) -> str:
    return self.spec.policy_loss

  def validate(self) -> None:
    check_choice("algorithm", self, "variant", VARIANTS)
    check_choice("algorithm", self, "loss_agg", LOSS_AGGS)
    check_choice("algorithm", self, "gae_method", GAE_METHODS)
    check_choice("algorithm", self, "gae_span", GAE_SPANS)
    check_choice("algorithm", self, "advantage_centering", ADVANTAGE_CENTERINGS)
    check_choice("algorithm", self, "running_mean_scope", ("prompt", "global"))
    if not 0.0 < self.gamma <= 1.0:
      fail("algorithm", "gamma", self.gamma, "expected 0 < gamma <= 1")
    if self.lam_alpha <= 0:
      fail("algorithm", "lam_alpha", self.lam_alpha, "expected a positive number")
    if self.lam_policy is not None and not 0.0 <= self.lam_policy <= 1.0:
      fail("algorithm", "lam_policy", self.lam_policy, "expected None or 0 <= lam_policy <= 1")
    if not 0.0 <= self.lam_critic <= 1.0:
      fail("algorithm", "lam_critic", self.lam_critic, "expected 0 <= lam_critic <= 1")
    if self.policy_loss == "dis" and not 0.0 < self.eps_low <= 1.0:
      fail("algorithm", "eps_low", self.eps_low,
            "DIS keeps ratios above 1 - eps_low >= 0, so expected 0 < eps_low <= 1")
    if self.policy_loss == "ppo_clip" and not 0.0 < self.eps_low < 1.0:
      fail("algorithm", "eps_low", self.eps_low, "expected 0 < eps_low < 1")
    if self.eps_high <= 0:
      fail("algorithm", "eps_high", self.eps_high, "expected a positive number")
    if self.value_clip is not None and self.value_clip <= 0:
      fail("algorithm", "value_clip", self.value_clip, "expected None (unclipped) or > 0")
    if self.uses_critic:
      check_positive("algorithm", self, "value_updates_per_step")
    elif self.value_updates_per_step != 0:
      fail("algorithm", "value_updates_per_step", self.value_updates_per_step,
            f"variant {self.variant!r} has no critic; set it to 0")
    check_positive("algorithm", self, "group_size", "running_mean_window", "running_mean_slots")
    if not isinstance(self.require_reward_contrast, bool):
      fail("algorithm", "require_reward_contrast", self.require_reward_contrast,
           "expected True or False")
    for pattern in self.frozen_patterns:
      try:
        re.compile(pattern)
      except re.error as error:
        fail("algorithm", "frozen_patterns", pattern, f"not a valid regex ({error})")
    if self.spec.grouped and self.group_size < 2:
      fail("algorithm", "group_size", self.group_size,
            f"variant {self.variant!r} needs >= 2 rollouts per prompt (paper: 8)")
    if not self.spec.grouped and self.group_size != 1:
      fail("algorithm", "group_size", self.group_size,
            f"variant {self.variant!r} is single-rollout; set it to 1")
    if not self.uses_critic and self.gae_span != "actions":
      fail("algorithm", "gae_span", self.gae_span,
           f"variant {self.variant!r} has no critic and so no GAE; leave it 'actions'")
