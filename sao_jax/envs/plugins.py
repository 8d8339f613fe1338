"""Objects named by import path (`package.module:attribute`) or by installed entry point.

    load_object("my_pkg.env:SPEC", what="env.name='my_pkg.env:SPEC'")  # the attribute
    entry_points("sao_jax.environments")                  # {name: "module:attribute"}

User code is trusted: importing it runs it. What is refused, with an error
naming the value and the fix: a path that is not `module:attribute`, a module
that fails to import (its exception named: a missing dependency is the usual
cause), and an attribute the module lacks.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
from typing import Any

_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_import_path(text: str) -> bool:
  """Whether `text` is written `package.module:attribute`."""
  return bool(_PATH.match(text))


def load_object(path: str, *, what: str) -> Any:
  """The object `path` (`package.module:attribute`, dots after the colon walk
  attributes) names; ValueError starting with `what` (the config field and its value)
  otherwise."""
  if not is_import_path(path):
    raise ValueError(f"{what} is invalid: expected an import path "
                     "'package.module:attribute', e.g. 'my_rewards.score:compute'")
  module_name, _, attribute = path.partition(":")
  try:
    module = importlib.import_module(module_name)
  except Exception as error:  # user code: any exception at import is the plugin's
    raise ValueError(f"{what}: importing module {module_name!r} failed with "
                     f"{type(error).__name__}: {error}; install it (pip install -e your "
                     "package) or put its directory on PYTHONPATH") from error
  value = module
  for part in attribute.split("."):
    if not hasattr(value, part):
      raise ValueError(f"{what}: module {module_name!r} has no attribute "
                       f"{attribute!r}")
    value = getattr(value, part)
  return value


@functools.cache
def entry_points(group: str) -> dict[str, tuple[str, ...]]:
  """Installed entry points of `group` (each distribution's
  `[project.entry-points."<group>"]`): {name: the "module:attribute" values
  registered under it}, more than one when packages disagree."""
  found: dict[str, tuple[str, ...]] = {}
  for point in importlib.metadata.entry_points(group=group):
    values = found.get(point.name, ())
    if point.value not in values:
      found[point.name] = values + (point.value,)
  return found
