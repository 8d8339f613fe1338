"""Hugging Face checkpoints (Qwen3, Qwen3-MoE, Qwen2/2.5, Llama 3.x, Gemma 3 text) in and out.

  config_from_hf(hf_dir_or_dict, **overrides) -> ModelConfig
  load_hf(hf_dir, mesh=None, **overrides)     -> (cfg, params)
  export_hf(params, cfg, out_dir, max_shard_bytes=5 GiB, tokenizer_dir=None)

Supported: the architectures of `sao_jax.config.families.HF_ARCHITECTURES`, with
RoPE types default, linear, llama3 and yarn, full attention (sliding-window
layers for Gemma 3 only) and the family's activation; anything else is rejected
with the offending config entry named.
Weights are read from `model.safetensors` or a
sharded `model.safetensors.index.json`, one tensor at a time, converted to our
layout (HF `nn.Linear` weights are [out, in]; our kernels are [in, out] with
heads split out, e.g. q_proj [D, N, H]; MoE experts stacked into [E, D, F]) and
put on their sharding before the next tensor is read. Exported directories use
the Hub layout (per-expert tensors, `lm_head.weight` only when untied), which
`transformers.AutoModelForCausalLM.from_pretrained` loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import shutil
from typing import Any, Callable, Mapping

import jax
import numpy as np
from safetensors import safe_open

from sao_jax import bounded_json
from sao_jax.config import ModelConfig
from sao_jax.config.families import FAMILIES, HF_ARCHITECTURES, HfArchitecture, hf_architecture
from sao_jax.models.params_io import place, write_safetensors
from sao_jax.models.transformer import Params, abstract_params, is_moe_layer, param_path, param_shardings

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "generation_config.json")
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
_MAX_JSON_BYTES, _MAX_JSON_DEPTH = 64 * 2**20, 16


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One param and the HF tensors it is made of."""
  path: str
  hf_names: tuple[str, ...]
  to_ours: Callable[[list[np.ndarray]], np.ndarray]
  to_hf: Callable[[np.ndarray], list[np.ndarray]]


def _read_config(source: str | pathlib.Path | dict[str, Any]) -> dict[str, Any]:
  if isinstance(source, dict):
    return source
  path = pathlib.Path(source) / "config.json"
  if not path.is_file():
    raise FileNotFoundError(f"{str(path)!r} not found; pass a Hugging Face model directory")
  config = bounded_json.loads(path.read_bytes(), max_bytes=_MAX_JSON_BYTES,
                              max_depth=_MAX_JSON_DEPTH, what=str(path))
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
  hf = _read_config(source)
  archs = hf.get("architectures") or []
  if len(archs) != 1 or archs[0] not in HF_ARCHITECTURES:
    raise ValueError(f"unsupported architecture {archs!r} in config.json; sao_jax loads "
                     f"{', '.join(HF_ARCHITECTURES)}")
  arch = HF_ARCHITECTURES[archs[0]]
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


def _transposed(w: list[np.ndarray]) -> np.ndarray:
  return w[0].T


def _entries(cfg: ModelConfig) -> list[_Entry]:
  """The param <-> HF tensor correspondence for `cfg` (policy head)."""
  d, n, k, h = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
  same = lambda path, name: _Entry(path, (name,), lambda w: w[0], lambda x: [x])
  linear = lambda path, name: _Entry(path, (name,), _transposed, lambda x: [x.T])
  family = FAMILIES[cfg.family]
  entries = [same("embed", "model.embed_tokens.weight"),
             same("final_norm/scale", "model.norm.weight")]
  if not cfg.tie_word_embeddings:
    entries.append(linear("lm_head", "lm_head.weight"))
  for i in range(cfg.num_hidden_layers):
    ours, hf = f"layers/{i}", f"model.layers.{i}"
    entries += [same(f"{ours}/input_norm/scale", f"{hf}.input_layernorm.weight"),
                same(f"{ours}/post_attn_norm/scale", f"{hf}.post_attention_layernorm.weight")]
    if family.gemma:
      entries += [same(f"{ours}/pre_mlp_norm/scale", f"{hf}.pre_feedforward_layernorm.weight"),
                  same(f"{ours}/post_mlp_norm/scale", f"{hf}.post_feedforward_layernorm.weight")]
    if family.qk_norm:
      entries += [same(f"{ours}/attn/q_norm/scale", f"{hf}.self_attn.q_norm.weight"),
                  same(f"{ours}/attn/k_norm/scale", f"{hf}.self_attn.k_norm.weight")]
    for name, heads in (("q", n), ("k", k), ("v", k)):
      entries.append(_Entry(f"{ours}/attn/{name}_proj", (f"{hf}.self_attn.{name}_proj.weight",),
                            lambda w, heads=heads: w[0].T.reshape(d, heads, h),
                            lambda x, heads=heads: [x.reshape(d, heads * h).T]))
      if family.qkv_bias:  # HF [heads * H] <-> ours [heads, H]
        entries.append(_Entry(f"{ours}/attn/{name}_bias", (f"{hf}.self_attn.{name}_proj.bias",),
                              lambda w, heads=heads: w[0].reshape(heads, h),
                              lambda x, heads=heads: [x.reshape(heads * h)]))
    entries.append(_Entry(f"{ours}/attn/o_proj", (f"{hf}.self_attn.o_proj.weight",),
                          lambda w: w[0].T.reshape(n, h, d), lambda x: [x.reshape(n * h, d).T]))
    if is_moe_layer(cfg, i):
      entries.append(linear(f"{ours}/mlp/router", f"{hf}.mlp.gate.weight"))
      for name in ("gate_proj", "up_proj", "down_proj"):
        names = tuple(f"{hf}.mlp.experts.{e}.{name}.weight" for e in range(cfg.num_experts))
        entries.append(_Entry(f"{ours}/mlp/{name}", names,
                              lambda w: np.stack([x.T for x in w]),
                              lambda x: [np.ascontiguousarray(x[e].T) for e in range(x.shape[0])]))
    else:
      for name in ("gate_proj", "up_proj", "down_proj"):
        entries.append(linear(f"{ours}/mlp/{name}", f"{hf}.mlp.{name}.weight"))
  return entries


def _tensor_files(hf_dir: pathlib.Path) -> dict[str, pathlib.Path]:
  """HF tensor name -> safetensors file holding it.

  The index file is input: a shard it names must be a plain file name in
  `hf_dir` (what transformers writes), so it cannot make the loader read a
  file elsewhere on the host (`../../x.safetensors`, an absolute path).
  """
  if not hf_dir.is_dir():
    raise FileNotFoundError(f"HF checkpoint directory {str(hf_dir)!r} does not exist (or is not "
                            "a directory); pass the directory holding config.json and "
                            "*.safetensors, e.g. a huggingface-cli download")
  index = hf_dir / "model.safetensors.index.json"
  if index.is_file():
    weight_map = bounded_json.loads(index.read_bytes(), max_bytes=_MAX_JSON_BYTES,
                                    max_depth=_MAX_JSON_DEPTH, what=str(index))
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict):
      raise ValueError(f"{str(index)!r} has no 'weight_map' object (tensor name -> shard file)")
    for name, file in weight_map.items():
      if not isinstance(file, str) or file in ("", ".", "..") or pathlib.PurePath(file).name != file:
        raise ValueError(f"{str(index)!r} maps tensor {name!r} to {file!r}, which is not a plain "
                         "file name inside the checkpoint directory; shards must sit beside it")
    return {name: hf_dir / file for name, file in weight_map.items()}
  files = sorted(hf_dir.glob("*.safetensors"))
  if not files:
    raise FileNotFoundError(f"no *.safetensors files in {str(hf_dir)!r}; sao_jax reads "
                            "safetensors checkpoints only")
  where = {}
  for file in files:
    with safe_open(file, framework="numpy") as f:
      where.update({name: file for name in f.keys()})
  return where


def _check_size(layers: Any, experts_per_layer: int, stored: int, hf_dir: pathlib.Path) -> None:
  """Refuses a config.json that needs more tensors than the checkpoint stores, before
  any per-layer list is built (config.json is input: 10**9 layers would hang)."""
  if isinstance(layers, int) and layers > stored or experts_per_layer > stored:
    raise ValueError(f"{str(hf_dir)!r}: config.json asks for num_hidden_layers={layers} and "
                     f"{experts_per_layer} expert tensors, more than the {stored} tensors its "
                     "safetensors files hold; the config does not belong to these weights")


def load_hf(hf_dir: str | pathlib.Path, mesh: jax.sharding.Mesh | None = None,
            **overrides: Any) -> tuple[ModelConfig, Params]:
  """Loads an HF checkpoint directory into policy params (sharded over `mesh` if given)."""
  hf_dir = pathlib.Path(hf_dir)
  where = _tensor_files(hf_dir)
  _check_size(_read_config(hf_dir).get("num_hidden_layers"), 0, len(where), hf_dir)
  cfg = config_from_hf(hf_dir, **overrides)
  _check_size(cfg.num_hidden_layers, 3 * cfg.num_experts * sum(
      is_moe_layer(cfg, i) for i in range(cfg.num_hidden_layers)), len(where), hf_dir)
  entries = _entries(cfg)
  needed = {name for entry in entries for name in entry.hf_names}
  # A tied checkpoint may still carry a copy of the embedding as lm_head.
  ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
  missing = sorted(needed - set(where))
  unexpected = sorted(name for name in set(where) - needed - ignorable
                      if not name.endswith("rotary_emb.inv_freq"))
  if missing or unexpected:
    raise ValueError(f"{str(hf_dir)!r} does not match its config.json: missing tensors "
                     f"{missing or 'none'}; unexpected tensors {unexpected or 'none'}")
  abstract = {param_path(kp): leaf for kp, leaf in jax.tree_util.tree_flatten_with_path(
      abstract_params(cfg))[0]}
  shardings = ({param_path(kp): s for kp, s in jax.tree_util.tree_flatten_with_path(
      param_shardings(cfg, mesh))[0]} if mesh is not None else {})
  flat = {}
  with contextlib.ExitStack() as stack:
    handles = {file: stack.enter_context(safe_open(file, framework="numpy"))
               for file in sorted(set(where[name] for name in needed))}
    for entry in entries:
      tensors = [handles[where[name]].get_tensor(name) for name in entry.hf_names]
      flat[entry.path] = place(entry.to_ours(tensors), entry.path, abstract[entry.path],
                               shardings.get(entry.path))
  return cfg, _unflatten(flat, abstract_params(cfg))


def _unflatten(flat: dict[str, jax.Array], template: Params) -> Params:
  return jax.tree_util.tree_map_with_path(lambda kp, _: flat[param_path(kp)], template)


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


def export_hf(params: Params, cfg: ModelConfig, out_dir: str | pathlib.Path,
              max_shard_bytes: int = 5 * 2**30,
              tokenizer_dir: str | pathlib.Path | None = None) -> None:
  """Writes policy `params` as an HF directory (config.json + safetensors shards).

  More than `max_shard_bytes` of tensors are split into
  `model-0000i-of-0000n.safetensors` with a `model.safetensors.index.json`.
  Tokenizer files found in `tokenizer_dir` are copied alongside; a `tokenizer_dir`
  holding none of `TOKENIZER_FILES` is an error, not a directory without a tokenizer.
  `out_dir` must not hold weights already: transformers prefers a `model.safetensors`
  to an index, so an old single file beside a new sharded export would load the old
  model. config.json is written last, so a failed export is no loadable directory.
  """
  out_dir = pathlib.Path(out_dir)
  tokenizer_files = _tokenizer_files(tokenizer_dir)
  _check_export_dir(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  try:
    _write_weights(params, cfg, out_dir, max_shard_bytes)
  except BaseException:  # leave no partial weights (the directory held none before)
    for partial in [*out_dir.glob("shard-*.tmp"),
                    *(f for pattern in _WEIGHT_PATTERNS for f in out_dir.glob(pattern))]:
      partial.unlink(missing_ok=True)
    raise
  for file in tokenizer_files:
    shutil.copy(file, out_dir / file.name)
  (out_dir / "config.json").write_text(json.dumps(hf_config(cfg), indent=2))


_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")


def _check_export_dir(out_dir: pathlib.Path) -> None:
  """ValueError unless `out_dir` is missing or a directory without weight files."""
  if out_dir.exists() and not out_dir.is_dir():
    raise ValueError(f"output {str(out_dir)!r} is a file; pass a directory (created if missing)")
  if out_dir.is_dir():
    found = sorted(f.name for pattern in _WEIGHT_PATTERNS for f in out_dir.glob(pattern))
    if found:
      raise ValueError(f"output {str(out_dir)!r} already holds weights ({', '.join(found[:3])}); "
                       "new ones beside them could load mixed with the old. Pass a new or "
                       "empty directory, or remove those files")


def _tokenizer_files(tokenizer_dir: str | pathlib.Path | None) -> list[pathlib.Path]:
  """The `TOKENIZER_FILES` in `tokenizer_dir` (none asked for: []); ValueError when a
  directory was named but holds none of them."""
  if tokenizer_dir is None:
    return []
  directory = pathlib.Path(tokenizer_dir)
  if not directory.is_dir():
    raise FileNotFoundError(f"tokenizer directory {str(directory)!r} does not exist; pass the "
                            "HF model directory whose tokenizer.json the export should carry")
  files = [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]
  if not files:
    raise ValueError(f"tokenizer directory {str(directory)!r} holds none of "
                     f"{', '.join(TOKENIZER_FILES)}; pass the HF model directory it came with")
  return files


def _write_weights(params: Params, cfg: ModelConfig, out_dir: pathlib.Path,
                   max_shard_bytes: int) -> None:
  """The safetensors shard(s) and, when more than one, their index."""
  flat = {param_path(kp): leaf for kp, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  # Each shard is written as soon as it is full, so the host holds at most one.
  shard_names: list[list[str]] = []
  shard: dict[str, np.ndarray] = {}
  total = 0

  def flush():
    write_safetensors(shard, out_dir / f"shard-{len(shard_names)}.tmp", metadata={"format": "pt"})
    shard_names.append(list(shard))
    shard.clear()

  for entry in _entries(cfg):
    if entry.path not in flat:
      raise ValueError(f"export_hf: params lack {entry.path!r}; pass policy params for this config")
    for name, tensor in zip(entry.hf_names, entry.to_hf(np.asarray(jax.device_get(flat[entry.path])))):
      size = sum(t.nbytes for t in shard.values())
      if shard and size + tensor.nbytes > max_shard_bytes:
        flush()
      shard[name] = np.ascontiguousarray(tensor)
      total += tensor.nbytes
  flush()
  if len(shard_names) == 1:
    (out_dir / "shard-0.tmp").rename(out_dir / "model.safetensors")
  else:
    weight_map = {}
    for i, names in enumerate(shard_names):
      file = f"model-{i + 1:05d}-of-{len(shard_names):05d}.safetensors"
      (out_dir / f"shard-{i}.tmp").rename(out_dir / file)
      weight_map.update({name: file for name in names})
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
