"""Shared validation helpers: every error names section.field, the value and what is allowed."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence


def fail(section: str, field: str, value: Any, allowed: str) -> None:
  raise ValueError(f"{section}.{field}={value!r} is invalid: {allowed}.")


def check_positive(section: str, obj: Any, *fields: str) -> None:
  for name in fields:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      fail(section, name, value, "expected a positive integer")


def check_choice(section: str, obj: Any, field: str, choices: Sequence[str]) -> None:
  value = getattr(obj, field)
  if value not in choices:
    fail(section, field, value, f"allowed values are {', '.join(map(repr, choices))}")


def check_finite(path: str, value: Any) -> None:
  """ValueError naming the first float under `value` (a config dataclass, walked through
  its fields, tuples and lists) that is NaN or infinite: `--set x=1e999` parses as inf,
  and NaN passes every `<`/`>` range check, so no per-field check would catch them."""
  if isinstance(value, float) and not math.isfinite(value):
    section, _, field = path.rpartition(".")
    fail(section or "config", field, value, "expected a finite number (NaN and infinity are "
         "not allowed; 1e999 overflows to infinity)")
  elif dataclasses.is_dataclass(value) and not isinstance(value, type):
    for f in dataclasses.fields(value):
      check_finite(f"{path}.{f.name}" if path else f.name, getattr(value, f.name))
  elif isinstance(value, (tuple, list)):
    for index, item in enumerate(value):
      check_finite(f"{path}[{index}]", item)


# The longest wait a `*_timeout_s` field may set: one week, longer than any single wait a
# run means (an environment step, a reward function, a judge's verdict, a tool run), and
# far inside what the runtime's waits take (`threading.TIMEOUT_MAX`, ~292 years on Linux):
# env.step_timeout_s=1e300 passed validation and then raised OverflowError ("timestamp out
# of range") in every step.
MAX_TIMEOUT_S = 7 * 24 * 3600


def check_timeout(section: str, obj: Any, field: str, *, zero_is_none: bool = False) -> None:
  """`obj.field` is a timeout the runtime can wait on: a number of seconds (int or
  float, not bool, not NaN or infinite) above 0 and at most `MAX_TIMEOUT_S`; or exactly
  0 where the field documents "0: none" (`zero_is_none`). ValueError naming the field,
  the value and what is allowed otherwise."""
  value = getattr(obj, field)
  number = not isinstance(value, bool) and isinstance(value, (int, float))
  low_ok = number and (value >= 0 if zero_is_none else value > 0)  # False for NaN
  if not (low_ok and value <= MAX_TIMEOUT_S):
    span = "from 0 (0: no timeout) to" if zero_is_none else "above 0, at most"
    fail(section, field, value, f"expected a finite number of seconds {span} {MAX_TIMEOUT_S} "
         "(one week, MAX_TIMEOUT_S)")
