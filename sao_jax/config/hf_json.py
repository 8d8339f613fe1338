"""A Hugging Face checkpoint's `config.json` <-> `ModelConfig`: a mapping of JSON fields.

    config_from_hf(hf_dir_or_dict, **overrides) -> ModelConfig
    hf_config(cfg)                              -> the config.json contents for cfg
    read_hf_config(hf_dir)                      -> config.json as a dict (size-capped)

Supported: the architectures of `sao_jax.config.families.HF_ARCHITECTURES`, with
RoPE types default, linear, llama3 and yarn, full attention (sliding-window
layers for Gemma 3 only) and the family's activation; anything else is rejected
with the offending config entry named. The weights (`sao_jax.models.hf`) are
read and written by the model layer; this module touches no array, so a config
can be resolved from a checkpoint (`init_model`) without importing a model.
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping

from sao_jax import bounded_json
from sao_jax.config.families import FAMILIES, HF_ARCHITECTURES, HfArchitecture, hf_architecture
from sao_jax.config.model import ModelConfig

HF_CONFIG = "config.json"

_SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "max_position_embeddings", "tie_word_embeddings")
_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
               "decoder_sparse_step", "router_aux_loss_coef", "mlp_only_layers")
# rope_parameters key -> ModelConfig field, for each rope_type sao_jax implements
# (`rope_type` and `rope_theta` are read for every type).
_ROPE_KEYS = {
    "default": {},
    "linear": {"factor": "rope_factor"},
    "llama3": {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
               "high_freq_factor": "rope_high_freq_factor",
               "original_max_position_embeddings": "rope_original_max_position_embeddings"},
    "yarn": {"factor": "rope_factor", "beta_fast": "rope_beta_fast", "beta_slow": "rope_beta_slow",
             "attention_factor": "rope_attention_factor", "truncate": "rope_truncate",
             "original_max_position_embeddings": "rope_original_max_position_embeddings"},
}
_DEFAULT_THETA = 10_000.0  # transformers' rope_theta when config.json names none
# Gemma 3 fields read from config.json (defaults: families.HF_ARCHITECTURES).
_GEMMA_FIELDS = ("sliding_window", "query_pre_attn_scalar")
# Caps on the JSON files of a downloaded checkpoint (the largest real index.json is a few MB).
MAX_JSON_BYTES, MAX_JSON_DEPTH = 64 * 2**20, 16


def read_hf_config(source: str | pathlib.Path | dict[str, Any]) -> dict[str, Any]:
  if isinstance(source, dict):
    return source
  path = pathlib.Path(source) / HF_CONFIG
  if not path.is_file():
    raise FileNotFoundError(f"{str(path)!r} not found; pass a Hugging Face model directory")
  config = bounded_json.loads(path.read_bytes(), max_bytes=MAX_JSON_BYTES,
                              max_depth=MAX_JSON_DEPTH, what=str(path))
  if not isinstance(config, dict):
    raise ValueError(f"{str(path)!r} holds a {type(config).__name__}, not a JSON object")
  return config


def _unsupported(field: str, value: Any, allowed: str) -> ValueError:
  return ValueError(f"unsupported config.json setting {field}={value!r}; sao_jax implements "
                    f"{allowed}")


def _rope_fields(hf: dict[str, Any], max_position_embeddings: int) -> dict[str, Any]:
  """The `rope_*` fields of `ModelConfig`, read as transformers 5 reads config.json.

  A non-empty `rope_scaling` (the old name, and where Qwen's long-context
  instructions put YaRN) replaces `rope_parameters` as a whole; rope_theta comes
  from that dict, else the top-level `rope_theta`, else 10000; `type` is the old
  name of `rope_type`; llama3 and yarn default original_max_position_embeddings
  to max_position_embeddings. Where that rule would silently drop the
  `rope_theta` of `rope_parameters`, the config is refused instead.
  """
  params, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}
  source = "rope_scaling" if scaling else "rope_parameters"
  rope = {key: value for key, value in (scaling or params).items() if value is not None}
  theta = float(rope.pop("rope_theta", hf.get("rope_theta", _DEFAULT_THETA)))
  if scaling and params.get("rope_theta", theta) != theta:
    raise ValueError(
        f"config.json has rope_parameters={params!r} and rope_scaling={scaling!r}: transformers "
        f"lets rope_scaling replace rope_parameters, so it would use rope_theta={theta} instead "
        f"of {params['rope_theta']}; move the rope_scaling entries into rope_parameters and "
        "delete rope_scaling")
  return _parse_rope(rope, source, theta, hf, max_position_embeddings)


def _gemma_rope_fields(hf: dict[str, Any], defaults: Mapping[str, Any],
                       max_position_embeddings: int) -> dict[str, Any]:
  """The `rope_*` fields of a Gemma 3 config.json, read as transformers' Gemma3TextConfig.

  `rope_parameters` holds one dict per layer type. The full_attention dict is
  updated with `rope_scaling` (older checkpoints: e.g. linear, factor 8), its
  theta defaults to the top-level `rope_theta`, else 1e6; sliding_attention
  layers use default RoPE whose theta defaults to `rope_local_base_freq`, else 1e4.
  """
  params = hf.get("rope_parameters") or {}
  other = sorted(set(params) - {"full_attention", "sliding_attention"})
  if other:
    raise _unsupported(f"rope_parameters.{other[0]}", params[other[0]],
                       "for Gemma 3 one dict per layer type (full_attention, sliding_attention)")
  full = {**(params.get("full_attention") or {}), **(hf.get("rope_scaling") or {})}
  full = {key: value for key, value in full.items() if value is not None}
  theta = float(full.pop("rope_theta", hf.get("rope_theta", defaults["rope_theta"])))
  local = dict(params.get("sliding_attention") or {})
  local_type = local.pop("rope_type", local.pop("type", "default"))
  local_theta = local.pop("rope_theta", hf.get("rope_local_base_freq",
                                               defaults["rope_local_base_freq"]))
  if local_type != "default" or local:
    raise _unsupported("rope_parameters.sliding_attention", params["sliding_attention"],
                       "default RoPE (rope_type and rope_theta only) on sliding_attention layers")
  fields = _parse_rope(full, "rope_parameters.full_attention", theta, hf, max_position_embeddings)
  return {**fields, "rope_local_base_freq": float(local_theta)}


def _parse_rope(rope: dict[str, Any], source: str, theta: float, hf: dict[str, Any],
                max_position_embeddings: int) -> dict[str, Any]:
  """`rope` (one rope_parameters dict without rope_theta, read from `source`) as `rope_*` fields."""
  rope_type = rope.pop("rope_type", rope.get("type", "default"))
  rope.pop("type", None)
  if rope_type not in _ROPE_KEYS:
    raise _unsupported(f"{source}.rope_type", rope_type, f"rope_type {', '.join(_ROPE_KEYS)}")
  keys = _ROPE_KEYS[rope_type]
  for key in rope:
    if key not in keys:
      raise _unsupported(f"{source}.{key}", rope[key],
                         f"for rope_type={rope_type!r} only {', '.join(keys) or 'rope_theta'}")
  if "original_max_position_embeddings" in keys:
    # transformers re-reads a top-level original_max_position_embeddings over the dict's.
    top = hf.get("original_max_position_embeddings")
    inner = rope.get("original_max_position_embeddings")
    if top is not None and inner is not None and top != inner:
      raise _unsupported("original_max_position_embeddings", top,
                         f"one value: {source}.original_max_position_embeddings is {inner}")
    rope["original_max_position_embeddings"] = inner or top or max_position_embeddings
  if rope_type == "yarn":
    # transformers: `beta_fast or 32`, `beta_slow or 1`; no factor means the context ratio.
    rope["beta_fast"] = rope.get("beta_fast") or 32.0
    rope["beta_slow"] = rope.get("beta_slow") or 1.0
    rope.setdefault("factor", max_position_embeddings / rope["original_max_position_embeddings"])
  missing = [key for key in ("factor", "low_freq_factor", "high_freq_factor") if key in keys
             and key not in rope]
  if missing:
    raise ValueError(f"config.json {source} with rope_type={rope_type!r} lacks {missing}; "
                     "transformers needs them too")
  return {"rope_type": rope_type, "rope_theta": theta,
          **{field: rope[key] for key, field in keys.items() if key in rope}}


def config_from_hf(source: str | pathlib.Path | dict[str, Any], **overrides: Any) -> ModelConfig:
  """Maps an HF `config.json` (directory or parsed dict) onto `ModelConfig`.

  The architecture's row of `families.HF_ARCHITECTURES` gives the family, the
  value transformers uses for each missing field, and the field values sao_jax
  implements; any other value of those fields, of the RoPE parameters, of
  `layer_types` or `partial_rotary_factor` is refused naming the field.
  """
  hf = read_hf_config(source)
  archs = hf.get("architectures") or []
  if len(archs) != 1 or archs[0] not in HF_ARCHITECTURES:
    raise ValueError(f"unsupported architecture {archs!r} in config.json; sao_jax loads "
                     f"{', '.join(HF_ARCHITECTURES)}")
  arch = HF_ARCHITECTURES[archs[0]]
  # transformers' AutoModel picks the class by model_type, not by architectures: a
  # directory that disagrees would load there as another model than the one we train.
  if hf.get("model_type", arch.model_type) != arch.model_type:
    raise ValueError(f"config.json has model_type={hf['model_type']!r} but architectures "
                     f"{archs!r}, whose model_type is {arch.model_type!r}; transformers would "
                     f"load it as another model. Set model_type to {arch.model_type!r} (or "
                     "architectures to the class of its model_type)")
  for name, value in arch.fixed.items():
    if hf.get(name, value) != value:
      raise _unsupported(name, hf[name], f"{name}={value!r} for {archs[0]}")
  gemma = FAMILIES[arch.family].gemma
  layer_types = _layer_types(hf, arch) if gemma else ()
  if not gemma and any(kind != "full_attention" for kind in hf.get("layer_types") or ()):
    raise _unsupported("layer_types", hf["layer_types"], f"only full_attention for {archs[0]}")
  if hf.get("partial_rotary_factor", 1.0) != 1.0:
    raise _unsupported("partial_rotary_factor", hf["partial_rotary_factor"],
                       "RoPE on the whole head (1.0)")
  names = _SIZE_FIELDS + (_MOE_FIELDS if arch.moe else ())
  fields: dict[str, Any] = {name: hf.get(name, arch.defaults[name]) for name in names}
  if fields["num_key_value_heads"] is None:
    fields["num_key_value_heads"] = fields["num_attention_heads"]
  if fields["head_dim"] is None:
    fields["head_dim"] = fields["hidden_size"] // fields["num_attention_heads"]
  if arch.moe:
    fields["num_experts"] = hf.get("num_experts",
                                   hf.get("num_local_experts", arch.defaults["num_experts"]))
    fields["mlp_only_layers"] = tuple(fields["mlp_only_layers"] or ())
  if gemma:
    fields.update({name: hf.get(name, arch.defaults[name]) for name in _GEMMA_FIELDS},
                  layer_types=layer_types)
    fields.update(_gemma_rope_fields(hf, arch.defaults, fields["max_position_embeddings"]))
  else:
    fields.update(_rope_fields(hf, fields["max_position_embeddings"]))
  fields.update(family=arch.family, tie_word_embeddings=bool(fields["tie_word_embeddings"]))
  dtype = hf.get("dtype", hf.get("torch_dtype"))
  if dtype in ("float32", "bfloat16"):
    fields["param_dtype"] = fields["compute_dtype"] = dtype
  cfg = ModelConfig(**{**fields, **overrides})
  cfg.validate()
  return cfg


def _layer_types(hf: dict[str, Any], arch: HfArchitecture) -> tuple[str, ...]:
  """Gemma 3's per-layer attention kinds: `layer_types`, else every
  `sliding_window_pattern`-th layer full and the rest sliding (transformers' rule)."""
  if hf.get("layer_types"):
    return tuple(hf["layer_types"])
  layers = hf.get("num_hidden_layers", arch.defaults["num_hidden_layers"])
  pattern = hf.get("sliding_window_pattern", arch.defaults["sliding_window_pattern"])
  if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
    raise _unsupported("sliding_window_pattern", pattern, "a positive integer")
  return tuple("sliding_attention" if (i + 1) % pattern else "full_attention"
               for i in range(layers))


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """The `config.json` contents for `cfg` (RoPE in transformers 5's `rope_parameters`)."""
  name = hf_architecture(cfg.family, cfg.num_experts > 0)
  arch = HF_ARCHITECTURES[name]
  rope = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
  rope.update({key: getattr(cfg, field) for key, field in _ROPE_KEYS[cfg.rope_type].items()
               if getattr(cfg, field) is not None})
  out: dict[str, Any] = {field: getattr(cfg, field) for field in _SIZE_FIELDS}
  out.update(arch.fixed, architectures=[name], model_type=arch.model_type, dtype=cfg.param_dtype)
  if FAMILIES[cfg.family].gemma:
    out.update(sliding_window=cfg.sliding_window,
               query_pre_attn_scalar=cfg.query_pre_attn_scalar or cfg.head_dim,
               layer_types=list(cfg.layer_types or ["full_attention"] * cfg.num_hidden_layers),
               rope_parameters={"full_attention": rope, "sliding_attention": {
                   "rope_type": "default", "rope_theta": cfg.rope_local_base_freq}})
  else:
    out.update(rope_theta=cfg.rope_theta, rope_parameters=rope)
  if arch.moe:
    out.update({field: getattr(cfg, field) for field in _MOE_FIELDS},
               mlp_only_layers=list(cfg.mlp_only_layers))
  return out
