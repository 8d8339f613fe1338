"""An environment's options: `env.options` (a mapping) checked against its dataclass.

    options = build_options(spec, {"difficulty": 3})   # an instance of spec.options

Every key must be a field of `spec.options` (unknown keys are refused, listing
the allowed ones); every value must fit the field's annotation: `bool`, `int`,
`float` (an int is taken as a float), `str`, `tuple[X, ...]` / `tuple[X, Y]`
(a list is taken as a tuple, item by item), a union of these (`int | None`),
`dict` / `Mapping` (any mapping) or `Any`; a float must be finite. A field
without a default must be given. Then the dataclass's own `validate()`, if it
has one, checks what types cannot (ranges, allowed values). Every error names
the environment and `env.options.<field>`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from typing import Any, Mapping

_MISMATCH = object()


def build_options(spec, given: Mapping[str, Any]) -> Any:
  """`spec.options(**given)`, checked (module docstring); ValueError naming the
  environment and the field."""
  cls = spec.options
  where = f"environment {spec.name!r}"
  if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
    raise ValueError(f"{where}: its options must be a dataclass type, got {cls!r}")
  if not isinstance(given, collections.abc.Mapping):
    raise ValueError(f"env.options={given!r} is invalid: expected a mapping of option names "
                     "to values")
  fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
  allowed = ", ".join(map(repr, fields)) or "none"
  for key in given:
    if key not in fields:
      raise ValueError(f"env.options.{key} is not an option of {where}; its options are "
                       f"{allowed}")
  missing = [name for name, f in fields.items() if name not in given
             and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  if missing:
    raise ValueError(f"env.options.{missing[0]} is required by {where} (no default); set it "
                     f"with --set env.options.{missing[0]}=VALUE")
  hints = typing.get_type_hints(cls)
  values = {}
  for key, value in given.items():
    converted = _conform(value, hints.get(key, Any))
    if converted is _MISMATCH:
      raise ValueError(f"env.options.{key}={value!r} is invalid for {where}: expected "
                       f"{_type_name(hints.get(key, Any))}"
                       + (" (a finite number)" if isinstance(value, float) else ""))
    values[key] = converted
  try:
    options = cls(**values)
    validate = getattr(options, "validate", None)
    if callable(validate):
      validate()
  except (TypeError, ValueError) as error:
    raise ValueError(f"{where}: {error}") from None
  return options


def _conform(value: Any, hint: Any) -> Any:
  """`value` as annotation `hint` allows it, or `_MISMATCH`."""
  if hint is Any or hint is object:
    return value
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    for kind in typing.get_args(hint):
      converted = _conform(value, kind)
      if converted is not _MISMATCH:
        return converted
    return _MISMATCH
  if hint is type(None):
    return None if value is None else _MISMATCH
  if hint is bool:
    return value if isinstance(value, bool) else _MISMATCH
  if hint is int:
    return value if isinstance(value, int) and not isinstance(value, bool) else _MISMATCH
  if hint is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
      return float(value)
    return _MISMATCH
  if hint is str:
    return value if isinstance(value, str) else _MISMATCH
  if hint is tuple or origin is tuple:
    if not isinstance(value, (tuple, list)):
      return _MISMATCH
    items = typing.get_args(hint)
    if not items:
      return tuple(value)
    if len(items) == 2 and items[1] is Ellipsis:
      items = (items[0],) * len(value)
    elif len(items) != len(value):
      return _MISMATCH
    converted = tuple(_conform(item, kind) for item, kind in zip(value, items))
    return _MISMATCH if any(item is _MISMATCH for item in converted) else converted
  if hint in (dict, collections.abc.Mapping) or origin in (dict, collections.abc.Mapping):
    return dict(value) if isinstance(value, collections.abc.Mapping) else _MISMATCH
  check = origin or hint
  if isinstance(check, type):
    return value if isinstance(value, check) else _MISMATCH
  return value  # an annotation this module does not interpret: the dataclass's validate() decides


def _type_name(hint: Any) -> str:
  return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
