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

from sao_jax.config.env import EnvConfig
from sao_jax.config.model import ModelConfig

# Every field a config class has lost, with the default it had when it was removed (the
# commit that removed it, and what took its place). A checkpoint that saved a removed
# field at that default ran as this version runs without it: the field is dropped. A
# value other than it (or a field missing from this table) is kept, so the resume
# names it as differing: this version cannot honour it.
REMOVED: dict[type, dict[str, Any]] = {
    ModelConfig: {
        "remat": False,  # ba0f330: model.remat_policy ("none")
        "hf_path": None,  # 2101cf9: run.init names the checkpoint
    },
    EnvConfig: {  # a477fe5: the env.tool section (SandboxLimits), the same defaults
        "tool_wall_time_s": 10.0, "tool_cpu_time_s": 5, "tool_memory_mb": 1024,
        "tool_file_size_mb": 16, "tool_max_output_bytes": 16384, "tool_site_packages": False,
    },
}


def _as_json(value: Any) -> Any:
  """`value` as a checkpoint's JSON holds it (tuples as lists, dataclasses as dicts)."""
  if dataclasses.is_dataclass(value):
    value = dataclasses.asdict(value)
  return json.loads(json.dumps(value))


def as_this_version(saved: dict, current: Any) -> dict:
  """`saved` (a config section as a checkpoint stored it, JSON) as this version of
  `current`'s dataclass would store it, section by nested section:
    - a field the class no longer has is dropped when it was saved at the default it
      had when it was removed (`REMOVED`), and kept (so it differs, and is named)
      otherwise;
    - a field the class has gained takes the class default (JSON form), as the older
      version behaved;
    - every other field is kept as saved."""
  fields = {field.name: field for field in dataclasses.fields(current)}
  removed = REMOVED.get(type(current), {})
  result = {}
  for key, value in saved.items():
    if key not in fields:
      if key not in removed or value != _as_json(removed[key]):
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
    result[name] = _as_json(default)  # tuples as the JSON lists saved
  return result
