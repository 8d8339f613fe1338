"""Configuration: frozen keyword-only dataclasses, one per concern.

A runnable setup is a file `configs/<name>.py` exposing `get_config() -> Config`;
command-line overrides are `--set section.field=value` strings applied on top.
Every section has `validate()`, which raises `ValueError` naming the field, the
offending value and what is allowed. `Config.validate()` runs them all plus the
cross-section checks.

Only sections that some module consumes live here; later subsystems add theirs.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import pathlib
import types
import typing
from typing import Any, Sequence

VARIANTS = ("sao", "sao_dis_only", "grpo", "grpo_dis", "running_mean", "ppo")
LOSS_AGGS = ("token_mean", "token_mean_kept", "seq_mean_token_mean")
GAE_METHODS = ("auto", "associative", "scan")
DTYPES = ("float32", "bfloat16")
MESH_AXES = ("data", "fsdp", "tensor", "expert")


def _fail(section: str, field: str, value: Any, allowed: str) -> None:
  raise ValueError(f"{section}.{field}={value!r} is invalid: {allowed}.")


def _check_positive(section: str, obj: Any, *fields: str) -> None:
  for name in fields:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      _fail(section, name, value, "expected a positive integer")


def _check_choice(section: str, obj: Any, field: str, choices: Sequence[str]) -> None:
  value = getattr(obj, field)
  if value not in choices:
    _fail(section, field, value, f"allowed values are {', '.join(map(repr, choices))}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
  """Device mesh shape. Exactly one axis may be -1: it takes the remaining devices.

  Axis order is (data, fsdp, tensor, expert); `sao_jax.sharding` maps logical axis
  names onto these.
  """

  data: int = 1
  fsdp: int = -1
  tensor: int = 1
  expert: int = 1

  def shape(self, num_devices: int) -> dict[str, int]:
    """Axis sizes with the -1 axis filled in for `num_devices` devices."""
    self.validate()
    sizes = {axis: getattr(self, axis) for axis in MESH_AXES}
    known = 1
    for size in sizes.values():
      if size != -1:
        known *= size
    free = [axis for axis, size in sizes.items() if size == -1]
    if free:
      if num_devices % known:
        raise ValueError(
            f"mesh: {num_devices} devices cannot be split with fixed axes "
            f"{ {a: s for a, s in sizes.items() if s != -1} } (product {known}); "
            f"choose axis sizes whose product divides {num_devices}.")
      sizes[free[0]] = num_devices // known
    elif known != num_devices:
      raise ValueError(
          f"mesh: axis sizes {sizes} use {known} devices but {num_devices} are "
          "available; set one axis to -1 or make the product match.")
    return sizes

  def validate(self) -> None:
    free = [axis for axis in MESH_AXES if getattr(self, axis) == -1]
    if len(free) > 1:
      _fail("mesh", free[1], -1, f"only one axis may be -1 (already {free[0]})")
    for axis in MESH_AXES:
      value = getattr(self, axis)
      if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        _fail("mesh", axis, value, "expected a positive integer or -1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Qwen3-family decoder hyper-parameters (dense when `num_experts == 0`).

  Field names follow Hugging Face's `Qwen3Config` / `Qwen3MoeConfig` so a
  `config.json` maps onto them one to one. `hf_path`, when set, is a local
  Hugging Face directory whose config and weights replace these fields.
  """

  vocab_size: int = 512
  hidden_size: int = 64
  intermediate_size: int = 128
  num_hidden_layers: int = 2
  num_attention_heads: int = 4
  num_key_value_heads: int = 2
  head_dim: int = 16
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  max_position_embeddings: int = 4096
  tie_word_embeddings: bool = True
  # Mixture of experts (Qwen3-MoE). 0 experts means a dense SwiGLU MLP everywhere.
  num_experts: int = 0
  num_experts_per_tok: int = 2
  moe_intermediate_size: int = 64
  norm_topk_prob: bool = True
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  # Numerics and memory.
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  logits_chunk: int = 1024  # tokens per LM-head chunk: bounds [B, chunk, vocab] memory
  remat: bool = False
  hf_path: str | None = None

  def validate(self) -> None:
    _check_positive("model", self, "vocab_size", "hidden_size", "intermediate_size",
                    "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "max_position_embeddings", "num_experts_per_tok",
                    "moe_intermediate_size", "decoder_sparse_step", "logits_chunk")
    if self.num_attention_heads % self.num_key_value_heads:
      _fail("model", "num_key_value_heads", self.num_key_value_heads,
            f"must divide num_attention_heads={self.num_attention_heads}")
    if self.num_experts < 0:
      _fail("model", "num_experts", self.num_experts, "expected 0 (dense) or a positive integer")
    if self.num_experts and self.num_experts_per_tok > self.num_experts:
      _fail("model", "num_experts_per_tok", self.num_experts_per_tok,
            f"must be <= num_experts={self.num_experts}")
    if self.rope_theta <= 0:
      _fail("model", "rope_theta", self.rope_theta, "expected a positive number")
    if self.rms_norm_eps <= 0:
      _fail("model", "rms_norm_eps", self.rms_norm_eps, "expected a positive number")
    _check_choice("model", self, "param_dtype", DTYPES)
    _check_choice("model", self, "compute_dtype", DTYPES)
    bad_layers = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
    if bad_layers:
      _fail("model", "mlp_only_layers", self.mlp_only_layers,
            f"layer indices must lie in [0, {self.num_hidden_layers})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
  """The RL objective (SAO.md §2-§5). `variant` picks the advantage estimator and
  policy loss; use `AlgorithmConfig.for_variant(name)` for the paper's settings
  of each variant, then override individual fields.
  """

  variant: str = "sao"
  # Advantages (SAO.md §3): lam_policy = 1 - 1 / (lam_alpha * l) per trajectory,
  # unless `lam_policy` is set to a fixed value.
  gamma: float = 1.0
  lam_alpha: float = 1.5
  lam_policy: float | None = None
  lam_critic: float = 1.0
  gae_method: str = "auto"
  # Policy loss (SAO.md §2): DIS band (1 - eps_low, 1 + eps_high), PPO clip for grpo/ppo.
  eps_low: float = 0.3
  eps_high: float = 5.0
  loss_agg: str = "token_mean"
  # Critic (SAO.md §4).
  value_updates_per_step: int = 2
  value_clip: float | None = 0.2
  frozen_attention: bool = True
  # Baselines (SAO.md §5).
  group_size: int = 1
  running_mean_window: int = 8
  running_mean_scope: str = "prompt"

  @classmethod
  def for_variant(cls, variant: str, **overrides: Any) -> "AlgorithmConfig":
    """The paper's settings for `variant` (SAO.md §5), with `overrides` on top."""
    presets: dict[str, dict[str, Any]] = {
        "sao": {},
        "sao_dis_only": {"value_updates_per_step": 1, "frozen_attention": False},
        "grpo": {"group_size": 8, "eps_low": 0.2, "eps_high": 0.28,
                 "value_updates_per_step": 0},
        "grpo_dis": {"group_size": 8, "value_updates_per_step": 0},
        "running_mean": {"value_updates_per_step": 0},
        "ppo": {"value_updates_per_step": 1, "eps_low": 0.2, "eps_high": 0.2,
                "frozen_attention": False},
    }
    if variant not in presets:
      _fail("algorithm", "variant", variant, f"allowed values are {', '.join(VARIANTS)}")
    return cls(variant=variant, **{**presets[variant], **overrides})

  @property
  def uses_critic(self) -> bool:
    return self.variant in ("sao", "sao_dis_only", "ppo")

  @property
  def policy_loss(self) -> str:
    """'ppo_clip' for grpo and ppo, else 'dis'."""
    return "ppo_clip" if self.variant in ("grpo", "ppo") else "dis"

  def validate(self) -> None:
    _check_choice("algorithm", self, "variant", VARIANTS)
    _check_choice("algorithm", self, "loss_agg", LOSS_AGGS)
    _check_choice("algorithm", self, "gae_method", GAE_METHODS)
    _check_choice("algorithm", self, "running_mean_scope", ("prompt", "global"))
    if not 0.0 < self.gamma <= 1.0:
      _fail("algorithm", "gamma", self.gamma, "expected 0 < gamma <= 1")
    if self.lam_alpha <= 0:
      _fail("algorithm", "lam_alpha", self.lam_alpha, "expected a positive number")
    if self.lam_policy is not None and not 0.0 <= self.lam_policy <= 1.0:
      _fail("algorithm", "lam_policy", self.lam_policy, "expected None or 0 <= lam_policy <= 1")
    if not 0.0 <= self.lam_critic <= 1.0:
      _fail("algorithm", "lam_critic", self.lam_critic, "expected 0 <= lam_critic <= 1")
    if self.policy_loss == "dis" and not 0.0 < self.eps_low <= 1.0:
      _fail("algorithm", "eps_low", self.eps_low,
            "DIS keeps ratios above 1 - eps_low >= 0, so expected 0 < eps_low <= 1")
    if self.policy_loss == "ppo_clip" and not 0.0 < self.eps_low < 1.0:
      _fail("algorithm", "eps_low", self.eps_low, "expected 0 < eps_low < 1")
    if self.eps_high <= 0:
      _fail("algorithm", "eps_high", self.eps_high, "expected a positive number")
    if self.value_clip is not None and self.value_clip <= 0:
      _fail("algorithm", "value_clip", self.value_clip, "expected None (unclipped) or > 0")
    if self.uses_critic:
      _check_positive("algorithm", self, "value_updates_per_step")
    elif self.value_updates_per_step != 0:
      _fail("algorithm", "value_updates_per_step", self.value_updates_per_step,
            f"variant {self.variant!r} has no critic; set it to 0")
    _check_positive("algorithm", self, "group_size", "running_mean_window")
    if self.variant in ("grpo", "grpo_dis") and self.group_size < 2:
      _fail("algorithm", "group_size", self.group_size,
            f"variant {self.variant!r} needs >= 2 rollouts per prompt (paper: 8)")
    if self.variant not in ("grpo", "grpo_dis") and self.group_size != 1:
      _fail("algorithm", "group_size", self.group_size,
            f"variant {self.variant!r} is single-rollout; set it to 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
  """The whole run: one field per concern."""

  name: str = "default"
  seed: int = 0
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)

  def validate(self) -> "Config":
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if dataclasses.is_dataclass(value):
        value.validate()
    if not isinstance(self.seed, int) or isinstance(self.seed, bool):
      _fail("config", "seed", self.seed, "expected an integer")
    return self


# --- loading and overrides -------------------------------------------------


def load_config(path: str | pathlib.Path, overrides: Sequence[str] = ()) -> Config:
  """Imports `path`, calls its `get_config()`, applies `--set` overrides, validates."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"config file {str(path)!r} does not exist; pass a path like "
                            "configs/demo_cpu.py")
  spec = importlib.util.spec_from_file_location(f"_sao_config_{path.stem}", path)
  assert spec is not None and spec.loader is not None  # a .py file always has a loader
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ValueError(f"config file {str(path)!r} must define get_config() -> sao_jax.config.Config")
  config = module.get_config()
  if not isinstance(config, Config):
    raise ValueError(f"{str(path)!r}: get_config() returned {type(config).__name__}, "
                     "expected sao_jax.config.Config")
  return apply_overrides(config, overrides).validate()


def apply_overrides(config: Config, overrides: Sequence[str]) -> Config:
  """Applies `section.field=value` strings (values parsed as Python literals)."""
  for item in overrides:
    key, sep, raw = item.partition("=")
    if not sep or not key:
      raise ValueError(f"override {item!r} is not of the form section.field=value, "
                       "e.g. --set algorithm.eps_low=0.2")
    config = _replace_path(config, key.strip().split("."), raw.strip(), key.strip())
  return config


def _replace_path(obj: Any, parts: list[str], raw: str, full_key: str) -> Any:
  fields = {f.name: f for f in dataclasses.fields(obj)}
  name = parts[0]
  if name not in fields:
    raise ValueError(f"override {full_key!r}: {type(obj).__name__} has no field {name!r}; "
                     f"fields are {', '.join(sorted(fields))}")
  current = getattr(obj, name)
  if len(parts) > 1:
    if not dataclasses.is_dataclass(current):
      raise ValueError(f"override {full_key!r}: {name!r} is not a section")
    return dataclasses.replace(obj, **{name: _replace_path(current, parts[1:], raw, full_key)})
  if dataclasses.is_dataclass(current):
    raise ValueError(f"override {full_key!r} names a whole section; set one of its fields")
  hint = typing.get_type_hints(type(obj))[name]
  return dataclasses.replace(obj, **{name: _parse_value(raw, hint, full_key)})


def _parse_value(raw: str, hint: Any, key: str) -> Any:
  """Parses `raw` for a field annotated `hint` (int, float, str, bool, tuple, Optional)."""
  allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  if raw in ("None", "none", "null") and type(None) in allowed:
    return None
  for kind in allowed:
    origin = typing.get_origin(kind) or kind
    if origin is str:
      return raw
    try:
      value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      continue
    if origin is bool and isinstance(value, bool):
      return value
    if origin is int and isinstance(value, int) and not isinstance(value, bool):
      return value
    if origin is float and isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    if origin is tuple and isinstance(value, (tuple, list)):
      return tuple(value)
  raise ValueError(f"override {key}={raw!r}: cannot parse as {hint}")


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m sao_jax.config CONFIG [--set a.b=c ...]` prints the resolved config."""
  import argparse
  import json

  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("config", help="path to a configs/<name>.py file")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="SECTION.FIELD=VALUE", help="override a field (repeatable)")
  args = parser.parse_args(argv)
  try:
    config = load_config(args.config, args.overrides)
  except (ValueError, FileNotFoundError) as error:
    parser.exit(2, f"error: {error}\n")
  print(json.dumps(dataclasses.asdict(config), indent=2))


if __name__ == "__main__":
  main()
