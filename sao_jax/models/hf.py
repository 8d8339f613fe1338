"""Hugging Face checkpoints (Qwen3, Qwen3-MoE, Qwen2/2.5, Llama 3.x, Gemma 3 text) in and out.

  load_hf(hf_dir, mesh=None, **overrides)     -> (cfg, params)
  export_hf(params, cfg, out_dir, max_shard_bytes=5 GiB, tokenizer_dir=None)

config.json <-> `ModelConfig` (what is supported, and what is refused naming the
config entry) is `sao_jax.config.hf_json`; this module moves the weights.
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
from typing import Any, Callable

import jax
import numpy as np
from safetensors import safe_open

from sao_jax import bounded_json
from sao_jax.config import ModelConfig
from sao_jax.config.families import FAMILIES
from sao_jax.config.hf_json import (HF_CONFIG, MAX_JSON_BYTES, MAX_JSON_DEPTH, config_from_hf,
                                    hf_config, read_hf_config)
from sao_jax.models.params_io import place, write_safetensors
from sao_jax.models.tokenizer import TOKENIZER_CONFIG, TEMPLATE_FILE
from sao_jax.models.transformer import Params, abstract_params, is_moe_layer, param_path, param_shardings

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_FILES = ("tokenizer.json", TOKENIZER_CONFIG, "special_tokens_map.json", "vocab.json",
                   "merges.txt", GENERATION_CONFIG, TEMPLATE_FILE)


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One param and the HF tensors it is made of."""
  path: str
  hf_names: tuple[str, ...]
  to_ours: Callable[[list[np.ndarray]], np.ndarray]
  to_hf: Callable[[np.ndarray], list[np.ndarray]]


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
    weight_map = bounded_json.loads(index.read_bytes(), max_bytes=MAX_JSON_BYTES,
                                    max_depth=MAX_JSON_DEPTH, what=str(index))
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
  _check_size(read_hf_config(hf_dir).get("num_hidden_layers"), 0, len(where), hf_dir)
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




def export_hf(params: Params, cfg: ModelConfig, out_dir: str | pathlib.Path,
              max_shard_bytes: int = 5 * 2**30,
              tokenizer_dir: str | pathlib.Path | None = None,
              chat_template: str | None = None, eos_token_id: int | None = None) -> None:
  """Writes policy `params` as an HF directory (config.json + safetensors shards).

  More than `max_shard_bytes` of tensors are split into
  `model-0000i-of-0000n.safetensors` with a `model.safetensors.index.json`.
  Tokenizer files found in `tokenizer_dir` are copied alongside; a `tokenizer_dir`
  holding none of `TOKENIZER_FILES` is an error, not a directory without a tokenizer.
  `chat_template` (the template a run trained with) is written as chat_template.jinja,
  over any the tokenizer directory held: `apply_chat_template` renders with it.
  `eos_token_id` (the token a run's replies end with) is written as generation_config.json
  when the tokenizer directory has none, so transformers' `generate` stops where the
  run's sampler stopped rather than at `max_new_tokens`.
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
  if chat_template is not None:
    (out_dir / TEMPLATE_FILE).write_text(chat_template, encoding="utf-8")
  if eos_token_id is not None and GENERATION_CONFIG not in {file.name for file in tokenizer_files}:
    (out_dir / GENERATION_CONFIG).write_text(json.dumps({"eos_token_id": eos_token_id}, indent=2))
  (out_dir / HF_CONFIG).write_text(json.dumps(hf_config(cfg), indent=2))


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
