"""The learner: optimisers, schedules, critic schedule, micro-batching; checkpoints."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_choice, check_positive, fail

ADVANTAGE_VALUES = ("before_critic_update", "after_critic_update")
LR_SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
  """The train step: optimisers, schedules, the critic schedule, micro-batching."""

  batch_trajectories: int = 128
  micro_batches: int = 1  # gradient accumulation: the batch is split into this many
  steps: int = 1000
  policy_lr: float = 1e-6
  value_lr: float = 5e-6
  lr_schedule: str = "constant"  # or "cosine" decay to 10% over `steps`
  lr_warmup_steps: int = 0
  adam_b1: float = 0.9
  adam_b2: float = 0.999
  adam_eps: float = 1e-8
  weight_decay: float = 0.0
  grad_clip: float | None = 1.0  # global-norm clip per model; None disables
  # Critic schedule (SAO.md §4): value-only steps before the first policy update.
  critic_warmup_steps: int = 10
  value_pretrain_steps: int = 0
  # Which critic the advantages see: the one before this step's value updates
  # (default; advantages and value targets from the same V_old) or after them.
  advantage_values: str = "before_critic_update"

  def validate(self) -> None:
    check_positive("learner", self, "batch_trajectories", "micro_batches", "steps")
    if self.batch_trajectories % self.micro_batches:
      fail("learner", "micro_batches", self.micro_batches,
            f"must divide batch_trajectories={self.batch_trajectories}")
    for name in ("policy_lr", "value_lr", "adam_eps"):
      if getattr(self, name) <= 0:
        fail("learner", name, getattr(self, name), "expected a positive number")
    for name in ("adam_b1", "adam_b2"):
      if not 0.0 <= getattr(self, name) < 1.0:
        fail("learner", name, getattr(self, name), "expected 0 <= value < 1")
    for name in ("lr_warmup_steps", "critic_warmup_steps", "value_pretrain_steps"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail("learner", name, value, "expected a non-negative integer")
    if self.weight_decay < 0:
      fail("learner", "weight_decay", self.weight_decay, "expected >= 0")
    if self.grad_clip is not None and self.grad_clip <= 0:
      fail("learner", "grad_clip", self.grad_clip, "expected None (no clipping) or > 0")
    check_choice("learner", self, "lr_schedule", LR_SCHEDULES)
    check_choice("learner", self, "advantage_values", ADVANTAGE_VALUES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
  """Orbax checkpoints of the learner: where, how often, how many."""

  directory: str | None = None  # None: no checkpoints
  save_every_steps: int = 50
  keep: int = 3
  async_save: bool = True

  def validate(self) -> None:
    check_positive("checkpoint", self, "save_every_steps", "keep")
