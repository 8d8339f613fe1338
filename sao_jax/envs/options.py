"""An environment's options: `env.options` (a mapping) checked against its dataclass.

    options = build_options(spec, {"difficulty": 3})   # an instance of spec.options

Every key must be a field of `spec.options` (unknown keys are refused, listing
the allowed ones); every value must fit the field's annotation as
`sao_jax.config.conform` allows it (as `--set` overrides must): `bool`, `int`,
`float` (an int is taken as a float; finite), `str`, `tuple[X, ...]` /
`tuple[X, Y]` (a list is taken as a tuple, item by item), a union of these
(`int | None`), `dict` / `Mapping` (any mapping), a nested dataclass (an instance
of it) or `Any`. A field without a default must be given. Then the dataclass's own `validate()`, if it
has one, checks what types cannot (ranges, allowed values). Every error names
the environment and `env.options.<field>`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import typing
from typing import Any, Mapping

from sao_jax.config.conform import MISMATCH, conform, type_name


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
      # The usual cause besides a typo: a config's options for its own environment, kept
      # when `--set env.name=...` picks another one.
      raise ValueError(f"env.options.{key} is not an option of {where}; its options are "
                       f"{allowed} (options of another environment, e.g. the config's own "
                       "before --set env.name=..., are cleared with --set 'env.options={}')")
  missing = [name for name, f in fields.items() if name not in given
             and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  if missing:
    raise ValueError(f"env.options.{missing[0]} is required by {where} (no default); set it "
                     f"with --set env.options.{missing[0]}=VALUE")
  hints = typing.get_type_hints(cls)
  values = {}
  for key, value in given.items():
    converted = conform(value, hints.get(key, Any))
    if converted is MISMATCH:
      raise ValueError(f"env.options.{key}={value!r} is invalid for {where}: expected "
                       f"{type_name(hints.get(key, Any))}"
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
