"""Config files (`configs/<name>.py` with `get_config()`) and `--set section.field=value`."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import pathlib
import types
import typing
from typing import Any, Sequence

from sao_jax.config.mesh import MeshConfig
from sao_jax.config.root import Config


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
  """Applies `section.field=value` strings (values parsed as Python literals; a mesh
  field takes `MeshConfig.parse`'s text, e.g. `sampler.mesh=fsdp=1,tensor=4`)."""
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
  hint = typing.get_type_hints(type(obj))[name]
  allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  if len(parts) > 1:
    if current is None and MeshConfig in allowed:
      keys = full_key.split(".")
      field = ".".join(keys[:len(keys) - len(parts) + 1])
      raise ValueError(f"override {full_key!r}: {field} is None (unset); set the whole mesh, "
                       f"e.g. --set {field}=fsdp=1,tensor=4")
    if not dataclasses.is_dataclass(current):
      raise ValueError(f"override {full_key!r}: {name!r} is not a section")
    return dataclasses.replace(obj, **{name: _replace_path(current, parts[1:], raw, full_key)})
  if MeshConfig in allowed:  # a mesh has a one-line text form: data=1,fsdp=-1,tensor=4
    if raw in ("None", "none", "null") and type(None) in allowed:
      return dataclasses.replace(obj, **{name: None})
    try:
      return dataclasses.replace(obj, **{name: MeshConfig.parse(raw)})
    except ValueError as error:
      raise ValueError(f"override {full_key}={raw!r}: {error}") from None
  if dataclasses.is_dataclass(current):
    raise ValueError(f"override {full_key!r} names a whole section; set one of its fields")
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
    if origin is bool and raw.lower() in ("true", "false"):
      return raw.lower() == "true"
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
  expected = " (expected true or false)" if bool in allowed else ""
  raise ValueError(f"override {key}={raw!r}: cannot parse as {hint}{expected}")


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m sao_jax.config CONFIG [--set a.b=c ...]` prints the resolved config."""
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
