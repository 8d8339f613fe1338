"""Shared validation helpers: every error names section.field, the value and what is allowed."""

from __future__ import annotations

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
