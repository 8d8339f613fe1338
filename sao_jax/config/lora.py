"""LoRA / QLoRA: low-rank adapters on the policy's projections, the base frozen
(and, for QLoRA, stored NF4-quantised)."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_choice, check_positive, fail

# Projections an adapter may sit on (param names in `sao_jax.models.layers`).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# How the frozen base of the targeted kernels is stored: as loaded, or NF4 (QLoRA).
BASE_QUANTIZATIONS = ("none", "nf4")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
  """Train W' = W + (alpha / rank) * A B on each `targets` projection of the policy,
  with W frozen (`sao_jax.models.lora`). Off by default: the whole policy trains."""

  enabled: bool = False  # train adapters on the policy, base frozen
  rank: int = 16  # r: the adapters' rank
  alpha: float = 32.0  # scale s = alpha / rank on A B
  targets: tuple[str, ...] = LORA_TARGETS  # projections that get adapters
  # "nf4": QLoRA, the targeted base kernels held as 4-bit NormalFloat codes with one
  # float32 scale per `quant_block` consecutive values of the flattened Hugging Face
  # [out, in] weight, as bitsandbytes' NF4 (`sao_jax.models.nf4`).
  base_quantization: str = "none"
  # Values per float32 NF4 scale: bitsandbytes' `blocksize` (64 is its default; its
  # quantize_4bit takes the powers of two 32..4096; other values load nowhere else).
  quant_block: int = 64

  @property
  def scale(self) -> float:
    """s = alpha / rank, the factor on A B."""
    return self.alpha / self.rank

  @property
  def quantized(self) -> bool:
    return self.base_quantization != "none"

  def validate(self) -> None:
    if not isinstance(self.enabled, bool):
      fail("lora", "enabled", self.enabled, "expected true or false")
    check_positive("lora", self, "rank", "quant_block")
    check_choice("lora", self, "base_quantization", BASE_QUANTIZATIONS)
    if self.quantized and not self.enabled:
      fail("lora", "base_quantization", self.base_quantization,
           "quantises the frozen base of LoRA; set lora.enabled=true too")
    if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha <= 0:
      fail("lora", "alpha", self.alpha, "expected a positive number")
    if not self.targets:
      fail("lora", "targets", self.targets, f"name at least one of {LORA_TARGETS}")
    unknown = [t for t in self.targets if t not in LORA_TARGETS]
    if unknown or len(set(self.targets)) != len(self.targets):
      fail("lora", "targets", self.targets,
           f"each of {LORA_TARGETS} at most once ({unknown or 'duplicates'} given)")
