"""The learner: batches, optimisers, schedules, critic schedule, micro-batching; checkpoints."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_choice, check_positive, fail

ADVANTAGE_VALUES = ("before_critic_update", "after_critic_update")
# The paper trains the critic at 5x the policy's learning rate (1e-6 and 5e-6).
PAPER_VALUE_LR_SCALE = 5.0
# Value pretraining of the ready model configs (configs/*.py), the one count the paper
# does not give: it pretrains the critic on the initial policy's returns (docs/algorithm.md
# §4) and names no number. The critic starts with a zero head (V = 0 everywhere), so
# pretraining must first move it to the returns' scale. At the paper's value lr (5e-6)
# Adam moves each weight by about the lr per update, so the head's output by at most
# ~lr x sum_i |h_i| ~ 0.004-0.016 per update for final hidden states of RMS ~1 and width
# 1024-4096 (the trunk's MLPs add to it): 20 steps (40 updates at K_v = 2) reach a 0/1
# reward's mean (~0.2-0.6) before the paper's 10 warm-up steps tune it. The cost is 20
# batches of the initial policy's rollouts, 2% of a 1000-step run. An estimate, not a
# measurement: `value/bias` and the windowed explained variance in the progress line
# show whether the critic got there (raise it if not). LearnerConfig's own default
# (`value_pretrain_steps` 0) stays: short runs and the CPU settings skip pretraining.
READY_VALUE_PRETRAIN_STEPS = 20
LR_SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
  """The train step: batches, optimisers, schedules, the critic schedule, micro-batching.

  A batch is `batch_trajectories` rows of one trajectory each, right-padded to a
  length bucket (`data.length_buckets`), unless `batch_tokens` is set: then it is
  `batch_rows = batch_tokens // row_length` rows of `row_length` tokens into
  which whole trajectories are packed first-fit (several per row, attention kept
  within each), holding at most `batch_trajectories` trajectories. It closes
  when the next arriving unit (a trajectory, or a whole GRPO group, never split)
  does not fit; trajectories longer than `row_length` are dropped as too long.
  """

  batch_trajectories: int = 128  # trajectories per batch (paper: 128)
  # Sequence packing: tokens per batch (None: one trajectory per row, padded).
  batch_tokens: int | None = None
  row_length: int | None = None  # tokens per packed row; required with batch_tokens
  micro_batches: int = 1  # gradient accumulation: the batch's rows are split into this many
  steps: int = 1000  # learner steps of the run (value-only steps included)
  policy_lr: float = 1e-6  # AdamW learning rate of the policy (paper: 1e-6)
  # AdamW learning rate of the critic; None: PAPER_VALUE_LR_SCALE (5) x policy_lr, the
  # paper's ratio (5e-6 at the paper's policy_lr), which follows policy_lr when it is tuned.
  value_lr: float | None = None
  lr_schedule: str = "constant"  # or "cosine" decay to 10% over `steps`
  # Linear warm-up of the policy's learning rate from 0, over its first updates (a drift
  # remedy, docs/algorithm.md §8); the critic trains at its full rate from its first step.
  lr_warmup_steps: int = 0
  adam_b1: float = 0.9  # Adam's first-moment decay
  adam_b2: float = 0.999  # Adam's second-moment decay
  adam_eps: float = 1e-8  # Adam's epsilon
  weight_decay: float = 0.0  # AdamW weight decay
  grad_clip: float | None = 1.0  # global-norm clip per model; None disables
  # Critic schedule (docs/algorithm.md §4): value-only steps before the first policy update.
  critic_warmup_steps: int = 10
  # Value-only steps on rollouts of the initial policy, before the warm-up (the paper
  # gives no number; 0 skips it; the ready model configs use READY_VALUE_PRETRAIN_STEPS).
  value_pretrain_steps: int = 0
  # Which critic the advantages see: the one before this step's value updates
  # (default; advantages and value targets from the same V_old) or after them.
  advantage_values: str = "before_critic_update"
  # MoE router replay (R3, docs/explanation/moe-routing.md): the policy forward routes
  # each action token the sampler recorded to the sampler's experts, gates from the
  # learner's router; prompt and observation tokens route freely. Off: free routing.
  router_replay: bool = False

  @property
  def critic_lr(self) -> float:
    """The critic's peak learning rate: `value_lr`, else the paper's multiple of
    `policy_lr` (`PAPER_VALUE_LR_SCALE`)."""
    return self.value_lr if self.value_lr is not None else PAPER_VALUE_LR_SCALE * self.policy_lr

  @property
  def batch_rows(self) -> int:
    """Rows of every batch the step sees: packed rows, or one per trajectory."""
    if self.batch_tokens is None:
      return self.batch_trajectories
    return self.batch_tokens // self.row_length

  def validate(self) -> None:
    check_positive("learner", self, "batch_trajectories", "micro_batches", "steps")
    if self.batch_trajectories % self.micro_batches:
      fail("learner", "micro_batches", self.micro_batches,
            f"must divide batch_trajectories={self.batch_trajectories}")
    self._validate_packing()
    for name in ("policy_lr", "value_lr", "adam_eps"):
      value = getattr(self, name)
      if name == "value_lr" and value is None:
        continue
      if value <= 0:
        fail("learner", name, value, "expected a positive number" +
             (" (or None: 5 x policy_lr, the paper's ratio)" if name == "value_lr" else ""))
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
    if not isinstance(self.router_replay, bool):
      fail("learner", "router_replay", self.router_replay, "expected True or False")

  def _validate_packing(self) -> None:
    if self.batch_tokens is None:
      if self.row_length is not None:
        fail("learner", "row_length", self.row_length,
             "it only applies to packed batches; set learner.batch_tokens too, or leave "
             "row_length=None")
      return
    packed_rows(self.batch_tokens, self.row_length)
    if self.batch_rows % self.micro_batches:
      fail("learner", "batch_tokens", self.batch_tokens,
           f"gives batch_rows={self.batch_rows} rows of row_length={self.row_length}, which "
           f"micro_batches={self.micro_batches} must divide; use a multiple of "
           f"{self.micro_batches * self.row_length}")


def packed_rows(batch_tokens: int, row_length: int | None) -> int:
  """Rows of a packed batch, `batch_tokens // row_length`; ValueError unless both are
  positive integers and row_length (>= 2) divides batch_tokens. The one check of a
  packed batch's shape: `LearnerConfig.validate` and the learner's data pipeline
  (`sao_jax.data.pipeline.learner_pipeline`, given one host's share) both call it."""
  if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens <= 0:
    fail("learner", "batch_tokens", batch_tokens, "expected a positive integer")
  if row_length is None:
    fail("learner", "row_length", row_length,
         f"packing (batch_tokens={batch_tokens}) needs the length of a packed row, e.g. "
         "the largest of data.length_buckets")
  if isinstance(row_length, bool) or not isinstance(row_length, int) or row_length <= 0:
    fail("learner", "row_length", row_length, "expected a positive integer")
  if row_length < 2 or batch_tokens % row_length:
    fail("learner", "batch_tokens", batch_tokens,
         f"must be a multiple of row_length={row_length} (>= 2): a batch is "
         "batch_tokens // row_length whole rows")
  return batch_tokens // row_length


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
  """Orbax checkpoints of the learner: where, how often, how many."""

  directory: str | None = None  # orbax directory or gs:// URL (None: RUN_DIR/checkpoints)
  save_every_steps: int = 50  # steps between checkpoints
  keep: int = 3  # checkpoints kept (older ones deleted)
  async_save: bool = True  # write checkpoints in the background while training continues

  def validate(self) -> None:
    check_positive("checkpoint", self, "save_every_steps", "keep")


def value_only_steps(learner: LearnerConfig, algorithm) -> int:
  """The learner steps that update only the critic before the first policy update:
  value pretraining and critic warm-up (docs/algorithm.md §4) of critic variants, else 0.
  `algorithm`: the run's `AlgorithmConfig`."""
  if not algorithm.uses_critic:
    return 0
  return learner.value_pretrain_steps + learner.critic_warmup_steps
