"""An environment's options checked against its dataclass (`sao_jax.envs.options`),
through `sao_jax.config.conform`, which `--set` overrides use too (tests/test_config.py):
unions, non-finite numbers, nested dataclasses and wrong types."""

import dataclasses
import math
import types

import pytest

from sao_jax.envs.options import build_options


@dataclasses.dataclass(frozen=True)
class Inner:
  depth: int = 1


@dataclasses.dataclass(frozen=True)
class Options:
  limit: int | None = None
  scale: float = 1.0
  pair: tuple[int, str] = (1, "a")
  schedule: tuple[float, ...] = ()
  inner: Inner = dataclasses.field(default_factory=Inner)


SPEC = types.SimpleNamespace(name="probe", options=Options)


@pytest.mark.parametrize("given, field, value", [
    ({"limit": 3}, "limit", 3),  # int | None
    ({"limit": None}, "limit", None),
    ({"scale": 2}, "scale", 2.0),  # an int taken as the float
    ({"pair": [2, "b"]}, "pair", (2, "b")),  # a list taken as the tuple, item by item
    ({"schedule": [1, 2.5]}, "schedule", (1.0, 2.5)),
    ({"inner": Inner(depth=3)}, "inner", Inner(depth=3)),  # a nested dataclass: an instance
])
def test_values_that_fit_the_annotation_are_taken(given, field, value):
  got = getattr(build_options(SPEC, given), field)
  assert got == value and type(got) is type(value)


@pytest.mark.parametrize("given, message", [
    ({"limit": 2.5}, r"env.options.limit=2.5 is invalid for environment 'probe': expected "
                     r"int \| None"),
    ({"limit": True}, r"env.options.limit=True is invalid .* expected int \| None"),
    ({"scale": math.inf}, r"env.options.scale=inf is invalid .* expected float \(a finite "
                          r"number\)"),
    ({"scale": math.nan}, r"env.options.scale=nan is invalid .* \(a finite number\)"),
    ({"schedule": (1.0, -math.inf)}, r"env.options.schedule=\(1.0, -inf\) is invalid .* "
                                     r"expected tuple\[float, \.\.\.\]"),
    ({"scale": "1"}, r"env.options.scale='1' is invalid .* expected float"),
    ({"pair": (1, 2)}, r"env.options.pair=\(1, 2\) is invalid .* expected tuple\[int, str\]"),
    ({"pair": (1,)}, r"expected tuple\[int, str\]"),
    # A nested dataclass takes an instance, not a mapping of its fields.
    ({"inner": {"depth": 3}}, r"env.options.inner=\{'depth': 3\} is invalid .* expected Inner"),
])
def test_values_that_do_not_fit_are_refused_naming_field_and_type(given, message):
  with pytest.raises(ValueError, match=message):
    build_options(SPEC, given)
