"""A config a checkpoint saved, read by a later version of the config classes.

A run preempted before an upgrade of sao_jax is relaunched by the upgraded one, whose
config classes may have gained fields (always with the default that keeps the older
behaviour) or lost some. Comparing the saved config with the launch's field by field
would then refuse every such run ("model.hf_path: checkpoint None vs config
'<missing>'"). `as_this_version` first rewrites the saved config as this version would
have saved it, so that only real differences remain.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any


def as_this_version(saved: dict, current: Any) -> dict:
  """`saved` (a config section as a checkpoint stored it, JSON) as this version of
  `current`'s dataclass would store it, section by nested section:
    - a field the class no longer has is dropped when it was unset (None), and kept (so
      it differs, and is named) when it was set;
    - a field the class has gained takes the class default (JSON form), as the older
      version behaved;
    - every other field is kept as saved."""
  fields = {field.name: field for field in dataclasses.fields(current)}
  result = {}
  for key, value in saved.items():
    if key not in fields:
      if value is not None:
        result[key] = value
      continue
    nested = getattr(current, key)
    if dataclasses.is_dataclass(nested) and isinstance(value, dict):
      value = as_this_version(value, nested)
    result[key] = value
  for name, field in fields.items():
    if name in saved:
      continue
    if field.default is not dataclasses.MISSING:
      default = field.default
    elif field.default_factory is not dataclasses.MISSING:
      default = field.default_factory()
    else:
      continue  # a required field: absent from the saved config, and named as differing
    if dataclasses.is_dataclass(default):
      default = dataclasses.asdict(default)
    result[name] = json.loads(json.dumps(default))  # tuples as the JSON lists saved
  return result
