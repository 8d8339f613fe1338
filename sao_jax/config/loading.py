"""Config files (`configs/<name>.py` with `get_config()`) and `--set section.field=value`."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import difflib
import importlib.util
import inspect
import json
import pathlib
import traceback
import types
import typing
from typing import Any, Iterator, Sequence

from sao_jax.config import init_model
from sao_jax.config.checks import check_finite
from sao_jax.config.conform import MISMATCH, conform, type_name
from sao_jax.config.mesh import MeshConfig
from sao_jax.config.root import Config

# Fields that were merged into another: a config or --set naming the old one is told
# the new name instead of "no such field".
RENAMED_FIELDS = {"model.hf_path": "run.init"}


def load_config(path: str | pathlib.Path, overrides: Sequence[str] = ()) -> Config:
  """Imports `path`, calls its `get_config()`, applies `--set` overrides, fills the
  model section from the checkpoint `run.init` names (`init_model.resolve`), validates.

  `FILE.py:ARG` calls `get_config(ARG)` (ml_collections' form): one file, several
  variants, e.g. `configs/qwen3_4b.py:v5p-8` for a host (`sao_jax.config.hosts`)."""
  path, arg = _split_argument(str(path))
  if path.is_dir():
    raise ValueError(f"config file {str(path)!r} is a directory; pass a file in it, like "
                     "configs/demo_cpu.py")
  if not path.is_file():
    raise FileNotFoundError(f"config file {str(path)!r} does not exist; pass a path like "
                            "configs/demo_cpu.py")
  if path.suffix != ".py":
    raise ValueError(f"config file {str(path)!r} is not a .py file; pass a Python file "
                     "defining get_config(), like configs/demo_cpu.py")
  spec = importlib.util.spec_from_file_location(f"_sao_config_{path.stem}", path)
  assert spec is not None and spec.loader is not None  # a .py file always has a loader
  module = importlib.util.module_from_spec(spec)
  with _config_code(path, "importing it"):
    spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ValueError(f"config file {str(path)!r} must define get_config() -> sao_jax.config.Config")
  if arg is not None and not inspect.signature(module.get_config).parameters:
    raise ValueError(f"config {str(path)}:{arg} passes {arg!r} to get_config(), which takes no "
                     f"argument; pass {str(path)!r} alone")
  with _config_code(path, "calling its get_config()"):
    config = module.get_config() if arg is None else module.get_config(arg)
  if not isinstance(config, Config):
    raise ValueError(f"{str(path)!r}: get_config() returned {type(config).__name__}, "
                     "expected sao_jax.config.Config")
  return init_model.resolve(apply_overrides(config, overrides)).validate()


def _split_argument(text: str) -> tuple[pathlib.Path, str | None]:
  """'configs/x.py:v6e-8' -> (Path('configs/x.py'), 'v6e-8'); a plain path -> (path, None)."""
  head, sep, arg = text.rpartition(".py:")
  if not sep:
    return pathlib.Path(text), None
  if not arg:
    raise ValueError(f"config {text!r} ends in ':' with no argument; pass {head + '.py'!r} or "
                     f"{head + '.py:ARG'!r}")
  return pathlib.Path(head + ".py"), arg


@contextlib.contextmanager
def _config_code(path: pathlib.Path, doing: str) -> Iterator[None]:
  """Turns an error raised by the config file's own code (a syntax error, a missing
  import, a bug in get_config) into a ValueError naming the file and the line: the
  CLIs print ValueErrors as one line, where any other exception is a traceback into
  sao_jax that hides that the mistake is in the user's file."""
  try:
    yield
  except Exception as error:  # pylint: disable=broad-except
    where = ""
    if isinstance(error, SyntaxError) and error.lineno is not None:
      where = f" line {error.lineno}"
    else:
      frames = [frame for frame in traceback.extract_tb(error.__traceback__)
                if pathlib.Path(frame.filename) == path]
      if frames:
        where = f" line {frames[-1].lineno}"
    message = error.msg if isinstance(error, SyntaxError) else str(error)
    for old, new in RENAMED_FIELDS.items():
      if isinstance(error, TypeError) and repr(old.rpartition(".")[2]) in message:
        message += f" ({old} is now {new})"
    raise ValueError(f"config file {str(path)!r}{where}: {type(error).__name__}: {message} "
                     f"(raised while {doing}); fix the file") from error


def apply_overrides(config: Config, overrides: Sequence[str]) -> Config:
  """Applies `section.field=value` strings, each value parsed by the field's type.

  - `str`: the text as written (`run.run_dir=runs/x`; no quotes needed).
  - `int`, `float`: a number (`learner.policy_lr=3e-4`; an int is taken for a float).
  - `bool`: `true` / `false`, any case (or `True` / `False`).
  - `X | None`: `None`, `none` or `null` for None, else as X.
  - a tuple of scalars: comma-separated items, each parsed by the item type
    (`run.loggers=tensorboard,wandb`, `run.eval_pass_k=1,4,16`; `run.loggers=` is the
    empty tuple), or a Python tuple / list literal (`run.eval_pass_k=(1, 4)`).
  - other tuples (of tuples): a Python literal only.
  - a mesh (`mesh`, `sampler.mesh`): `MeshConfig.parse`'s text, e.g. `fsdp=1,tensor=4`.
  """
  for item in overrides:
    key, sep, raw = item.partition("=")
    if not sep or not key:
      raise ValueError(f"override {item!r} is not of the form section.field=value, "
                       "e.g. --set algorithm.eps_low=0.2")
    if key.strip() in RENAMED_FIELDS:
      raise ValueError(f"override {item!r}: {key.strip()} is now "
                       f"{RENAMED_FIELDS[key.strip()]}; set --set "
                       f"{RENAMED_FIELDS[key.strip()]}={raw.strip()}")
    config = _replace_path(config, key.strip().split("."), raw.strip(), key.strip())
  return config


def _replace_path(obj: Any, parts: list[str], raw: str, full_key: str) -> Any:
  fields = {f.name: f for f in dataclasses.fields(obj)}
  name = parts[0]
  if name not in fields:
    raise ValueError(f"override {full_key!r}: {type(obj).__name__} has no field {name!r}; "
                     + _nearest_fields(full_key, parts, fields))
  current = getattr(obj, name)
  hint = typing.get_type_hints(type(obj))[name]
  allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  if len(parts) > 1 and isinstance(current, dict):  # a mapping field: env.options.KEY=VALUE
    return dataclasses.replace(obj, **{name: {**current, ".".join(parts[1:]): _literal(raw)}})
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
  if isinstance(current, dict):
    value = _literal(raw)
    if not isinstance(value, dict):
      raise ValueError(f"override {full_key}={raw!r}: expected a Python dict literal, e.g. "
                       f"{full_key}={{'difficulty': 3}}, or set one key: {full_key}.KEY=VALUE")
    return dataclasses.replace(obj, **{name: value})
  return dataclasses.replace(obj, **{name: _parse_value(raw, hint, full_key, current)})


def _nearest_fields(full_key: str, parts: list[str], fields) -> str:
  """'did you mean learner.steps?': the whole keys of the fields whose names are
  nearest the misspelt `parts[0]` (difflib), the rest of the key kept; the list of
  fields only when none is near."""
  keys = full_key.split(".")
  head, tail = keys[:len(keys) - len(parts)], parts[1:]
  near = difflib.get_close_matches(parts[0], list(fields), n=3, cutoff=0.6)
  if not near:
    return f"fields are {', '.join(sorted(fields))}"
  return "did you mean " + " or ".join(".".join([*head, name, *tail]) for name in near) + "?"


# A value of each scalar type as --set writes it, for a field whose value is None.
_EXAMPLES = {int: "8", float: "0.5", bool: "true", str: "text"}


def _example(current: Any, hint: Any) -> str | None:
  """A value for a field annotated `hint` as --set writes it: the field's `current`
  value, or, when that is None, one of its type (None for a type without one)."""
  if isinstance(current, bool):
    return str(current).lower()
  if isinstance(current, (int, float, str)):
    return str(current)
  if isinstance(current, tuple) and current and all(
      isinstance(item, _SCALARS) for item in current):
    return ",".join(_example(item, type(item)) or "" for item in current)
  if isinstance(current, tuple):
    return repr(current)
  allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  for kind in allowed:
    if kind in _EXAMPLES:
      return _EXAMPLES[kind]
    items = typing.get_args(kind)
    if typing.get_origin(kind) is tuple and len(items) == 2 and items[0] in _EXAMPLES:
      return f"{_EXAMPLES[items[0]]},{_EXAMPLES[items[0]]}"
  return None


def _parse_value(raw: str, hint: Any, key: str, current: Any = None) -> Any:
  """Parses `raw` for a field annotated `hint` (int, float, str, bool, tuple, Optional),
  by the rules of `apply_overrides`; a tuple's items must have the annotated item type
  (`(1.5,)` is no tuple[int, ...]). A value that does not parse is refused naming the
  field's type and an example (`current`, the field's value, when it has one)."""
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
    except (ValueError, SyntaxError, MemoryError, RecursionError):
      value = MISMATCH
    converted = MISMATCH if value is MISMATCH else conform(value, kind)
    if converted is MISMATCH and origin is tuple:
      converted = _comma_items(raw, kind)
    if converted is not MISMATCH:
      return converted
    if kind is float and value is not MISMATCH:  # 1e999 overflowed, or NaN: named as such
      check_finite(key, value)
  expected = " (expected true or false)" if bool in allowed else ""
  if any(typing.get_origin(kind) is tuple for kind in allowed):
    expected = (" (expected comma-separated items of that type, e.g. 1,4 or a,b, or a "
                "Python tuple literal, e.g. (1, 4) or ('a',))")
  example = _example(current, hint) if key else None
  if example is not None:
    now = " (its value now)" if current is not None else ""
    expected += f"; {key} is of type {type_name(hint)}, e.g. --set {key}={example}{now}"
  raise ValueError(f"override {key}={raw!r}: cannot parse as {type_name(hint)}{expected}")


_SCALARS = (int, float, str, bool)


def _comma_items(raw: str, kind: Any) -> Any:
  """`a,b,c` as a `tuple[X, ...]` of scalars X, each item parsed as a field of type X
  (`tensorboard,wandb` -> ('tensorboard', 'wandb'); `1,4` -> (1, 4)); the empty text is
  the empty tuple. `MISMATCH` for tuples of other items or an item that does not parse."""
  items = typing.get_args(kind)
  if len(items) != 2 or items[1] is not Ellipsis or items[0] not in _SCALARS:
    return MISMATCH
  if not raw.strip():
    return ()
  if raw.lstrip()[:1] in "([":  # meant as a literal, which did not parse: not items
    return MISMATCH
  try:
    return tuple(_parse_value(item.strip(), items[0], "") for item in raw.split(","))
  except ValueError:
    return MISMATCH


def _literal(raw: str) -> Any:
  """A mapping field's value: a Python literal, else the text itself (`word` = 'word');
  the field's owner checks its type (an environment's options: `sao_jax.envs.options`)."""
  try:
    return ast.literal_eval(raw)
  except (ValueError, SyntaxError, MemoryError, RecursionError):
    return raw


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
