"""LoRA: low-rank adapters on the policy's projections, the base frozen."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_positive, fail

# Projections an adapter may sit on (param names in `sao_jax.models.layers`).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
  """Train W' = W + (alpha / rank) * A B on each `targets` projection of the policy,
  with W frozen (`sao_jax.models.lora`). Off by default: the whole policy trains."""

  enabled: bool = False
  rank: int = 16
  alpha: float = 32.0
  targets: tuple[str, ...] = LORA_TARGETS

  @property
  def scale(self) -> float:
    """s = alpha / rank, the factor on A B."""
    return self.alpha / self.rank

  def validate(self) -> None:
    if not isinstance(self.enabled, bool):
      fail("lora", "enabled", self.enabled, "expected true or false")
    check_positive("lora", self, "rank")
    if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha <= 0:
      fail("lora", "alpha", self.alpha, "expected a positive number")
    if not self.targets:
      fail("lora", "targets", self.targets, f"name at least one of {LORA_TARGETS}")
    unknown = [t for t in self.targets if t not in LORA_TARGETS]
    if unknown or len(set(self.targets)) != len(self.targets):
      fail("lora", "targets", self.targets,
           f"each of {LORA_TARGETS} at most once ({unknown or 'duplicates'} given)")
