"""A sao_jax params directory's `model_config.json` <-> `ModelConfig` (and its head kind).

    model_config_json(cfg, head="lm")  -> the file's text
    load_model_config(directory)       -> (ModelConfig, head)

The file holds the `ModelConfig` fields plus "head" ("lm" or "value"); the tensors
beside it (`PARAMS_FILE`) are read and written by `sao_jax.models.params_io`. This
module touches no array, so a config can be resolved from a params directory
(`init_model`) without importing a model.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from sao_jax import bounded_json
from sao_jax.config.model import ModelConfig

CONFIG_FILE = "model_config.json"
PARAMS_FILE = "params.safetensors"
# ModelConfig fields holding tuples; an older params directory may lack them (then ()).
_TUPLE_FIELDS = ("mlp_only_layers", "layer_types")


def model_config_json(cfg: ModelConfig, head: str = "lm") -> str:
  """The text of `CONFIG_FILE` for a params directory of `cfg`'s `head`."""
  return json.dumps({**dataclasses.asdict(cfg), "head": head}, indent=2)


def load_model_config(directory: str | pathlib.Path) -> tuple[ModelConfig, str]:
  """The `ModelConfig` and head kind stored in a params directory."""
  path = pathlib.Path(directory) / CONFIG_FILE
  if not path.is_file():
    raise FileNotFoundError(f"{str(path)!r} not found; a sao_jax params directory is written by "
                            "save_params or `sao-convert hf-to-sao`")
  # The directory may come from a shared bucket: its JSON is capped like any input's.
  fields = bounded_json.loads(path.read_bytes(), max_bytes=2**20, max_depth=4, what=str(path))
  if not isinstance(fields, dict):
    raise ValueError(f"{str(path)!r} holds a {type(fields).__name__}, not a JSON object")
  head = fields.pop("head", "lm")
  fields.pop("hf_path", None)  # written by older versions (always None); merged into run.init
  for name in _TUPLE_FIELDS:  # JSON has lists; a config is hashable (jit static) with tuples
    fields[name] = tuple(fields.get(name, ()))
  unknown = sorted(set(fields) - {field.name for field in dataclasses.fields(ModelConfig)})
  if unknown:
    raise ValueError(f"{str(path)!r} has fields {unknown} that ModelConfig does not know; it was "
                     "not written by this version of save_params")
  cfg = ModelConfig(**fields)
  cfg.validate()
  return cfg, head
