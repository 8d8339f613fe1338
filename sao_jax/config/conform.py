"""A value as a type annotation allows it: what `--set` overrides (`loading`) and an
environment's options (`sao_jax.envs.options`) both check a parsed value with.

    conform(value, hint)   -> the value, converted, or MISMATCH
    type_name(hint)        -> 'int', 'tuple[int, ...]', 'float | None'

Allowed, by annotation:
  - `bool`, `int`, `str`: a value of exactly that type (a bool is no int);
  - `float`: an int or float, returned as a float, and finite: NaN passes every
    `<` / `>` range check and `1e999` parses as infinity, so neither is a setting;
  - `tuple[X, ...]`, `tuple[X, Y]`, `tuple`: a tuple or list, item by item;
  - a union (`int | None`): the first member the value conforms to;
  - `dict` / `Mapping`: any mapping, as a dict;
  - `Any` / `object`: anything;
  - any other class (a nested dataclass, say): an instance of it, unchanged;
  - an annotation none of these covers: the value unchanged, for its owner's
    `validate()` to decide.
"""

from __future__ import annotations

import collections.abc
import math
import types
import typing
from typing import Any

MISMATCH = object()


def conform(value: Any, hint: Any) -> Any:
  """`value` as annotation `hint` allows it (module docstring), or `MISMATCH`."""
  if hint is Any or hint is object:
    return value
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    for kind in typing.get_args(hint):
      converted = conform(value, kind)
      if converted is not MISMATCH:
        return converted
    return MISMATCH
  if hint is type(None):
    return None if value is None else MISMATCH
  if hint is bool:
    return value if isinstance(value, bool) else MISMATCH
  if hint is int:
    return value if isinstance(value, int) and not isinstance(value, bool) else MISMATCH
  if hint is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
      return float(value)
    return MISMATCH
  if hint is str:
    return value if isinstance(value, str) else MISMATCH
  if hint is tuple or origin is tuple:
    if not isinstance(value, (tuple, list)):
      return MISMATCH
    items = typing.get_args(hint)
    if not items:  # a bare `tuple` annotation: any items
      return tuple(value)
    if len(items) == 2 and items[1] is Ellipsis:
      items = (items[0],) * len(value)
    elif len(items) != len(value):
      return MISMATCH
    converted = tuple(conform(item, kind) for item, kind in zip(value, items))
    return MISMATCH if any(item is MISMATCH for item in converted) else converted
  if hint in (dict, collections.abc.Mapping) or origin in (dict, collections.abc.Mapping):
    return dict(value) if isinstance(value, collections.abc.Mapping) else MISMATCH
  check = origin or hint
  if isinstance(check, type):
    return value if isinstance(value, check) else MISMATCH
  return value  # an annotation this module does not interpret: its owner's validate() decides


def type_name(hint: Any) -> str:
  """'int', 'tuple[int, ...]', 'float | None': the annotation as written."""
  return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
