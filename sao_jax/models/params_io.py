"""sao_jax's on-disk param format, and tensor-by-tensor placement on devices.

A params directory holds two files:
  model_config.json   the `ModelConfig` fields plus "head" ("lm" or "value")
                      (`sao_jax.config.params_json`)
  params.safetensors  one tensor per param, named by its "/"-joined path
                      (e.g. "layers/0/attn/q_proj"), in the param dtype

  save_params(directory, params, cfg, head="lm")
  load_params(directory, mesh=None)          -> (cfg, head, params)
  place(array, path, cfg, mesh, head)        -> jax.Array on its sharding

Loading goes one tensor at a time (safetensors `safe_open` reads a single
tensor, which is cast and put on its devices before the next is read), so host
memory never holds the whole model. Saving gathers one host copy of the params
for the safetensors writer.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from sao_jax.config import ModelConfig
from sao_jax.config.params_json import (CONFIG_FILE, PARAMS_FILE, load_model_config,
                                        model_config_json)
from sao_jax.models.transformer import Params, abstract_params, param_path, param_shardings


def place(array: np.ndarray, path: str, expected: jax.ShapeDtypeStruct,
          sharding: jax.sharding.Sharding | None) -> jax.Array:
  """Checks shape, casts to the param dtype and puts one tensor on its devices."""
  if tuple(array.shape) != tuple(expected.shape):
    raise ValueError(f"tensor for param {path!r} has shape {tuple(array.shape)}, expected "
                     f"{tuple(expected.shape)}; the checkpoint does not match the model config")
  # Every param is floating point; an int or bool tensor would be cast to garbage silently.
  if not jax.numpy.issubdtype(array.dtype, jax.numpy.floating):
    raise ValueError(f"tensor for param {path!r} has dtype {array.dtype}, expected a floating "
                     f"point dtype ({expected.dtype}); the checkpoint is not a model's weights")
  array = np.asarray(array).astype(expected.dtype, copy=False)
  return jax.device_put(array, sharding) if sharding is not None else jax.device_put(array)


def save_params(directory: str | pathlib.Path, params: Params, cfg: ModelConfig,
                head: str = "lm") -> None:
  """Writes `params` (any sharding) and `cfg` to `directory`."""
  directory = pathlib.Path(directory)
  if directory.exists() and not directory.is_dir():
    raise ValueError(f"output {str(directory)!r} is a file; pass a directory (created if missing)")
  directory.mkdir(parents=True, exist_ok=True)
  tensors = {}
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    tensors[param_path(keypath)] = np.asarray(jax.device_get(leaf))
  # The tensors first, under a temporary name, and the config last: a failed save (a
  # full disk) leaves no directory that `load_params` takes for a whole one.
  partial = directory / (PARAMS_FILE + ".tmp")
  try:
    write_safetensors(tensors, partial)
    partial.replace(directory / PARAMS_FILE)
  finally:
    partial.unlink(missing_ok=True)
  (directory / CONFIG_FILE).write_text(model_config_json(cfg, head))


def write_safetensors(tensors: dict[str, np.ndarray], path: pathlib.Path,
                      metadata: dict[str, str] | None = None) -> None:
  """`safetensors.numpy.save_file`, whose write errors (a full disk) are an OSError
  naming `path`: the library raises its own SafetensorError, which the CLIs would
  print as a traceback."""
  try:
    save_file(tensors, path, metadata=metadata)
  except SafetensorError as error:
    raise OSError(f"cannot write {str(path)!r}: {error}") from error


def load_params(directory: str | pathlib.Path,
                mesh: jax.sharding.Mesh | None = None) -> tuple[ModelConfig, str, Params]:
  """Reads a params directory, placing each tensor on its sharding when `mesh` is given."""
  cfg, head = load_model_config(directory)
  with safe_open(pathlib.Path(directory) / PARAMS_FILE, framework="numpy") as f:
    stored = set(f.keys())
    # Unstacked layers have their own tensors: a config claiming more layers than the file
    # has tensors is refused before the per-layer param tree is built (10**9 layers hang).
    if not cfg.scan_layers and cfg.num_hidden_layers > len(stored):
      raise ValueError(f"{directory}: {CONFIG_FILE} has num_hidden_layers="
                       f"{cfg.num_hidden_layers}, more than the {len(stored)} tensors of "
                       f"{PARAMS_FILE}; the config does not belong to these params")
    abstract = abstract_params(cfg, head)
    shardings = param_shardings(cfg, mesh, head) if mesh is not None else None
    paths = [param_path(kp) for kp, _ in jax.tree_util.tree_flatten_with_path(abstract)[0]]
    missing = sorted(set(paths) - stored)
    unexpected = sorted(stored - set(paths))
    if missing or unexpected:
      raise ValueError(f"{directory}: params file does not match its config: missing "
                       f"{missing or 'none'}, unexpected {unexpected or 'none'}")

    def one(keypath, expected, sharding=None):
      path = param_path(keypath)
      return place(f.get_tensor(path), path, expected, sharding)

    if shardings is None:
      params = jax.tree_util.tree_map_with_path(one, abstract)
    else:
      params = jax.tree_util.tree_map_with_path(one, abstract, shardings)
  return cfg, head, params
