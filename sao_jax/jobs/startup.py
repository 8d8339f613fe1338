"""What every job checks of its config when it starts, before any sampler starts or
anything compiles:

    cfg = startup.check(cfg)                     # a Config built in code
    cfg = startup.load(path, overrides)          # a config file (what the commands do)

`Config.validate()` checks what the config itself can know (types, ranges, one
section against another). The names a config gives to code are checked against
that code here, the layer that may import it:

  - the environment (`env.name`, `env.options`, the task source, `env.reward_fn`):
    `sao_jax.envs.registry.check` imports it and checks its options;
  - the variant's advantage estimator and policy loss: `sao_jax.learner.step.
    check_variant`, against the registries where those functions live.

Each error names the field, the value and what is allowed.
"""

from __future__ import annotations

import pathlib
from typing import Sequence

from sao_jax.config import Config, load_config
from sao_jax.envs import registry
from sao_jax.learner import step


def check(cfg: Config) -> Config:
  """`cfg`, validated whole (module docstring); ValueError naming what is wrong."""
  cfg.validate()
  registry.check(cfg.env)
  step.check_variant(cfg.algorithm)
  return cfg


def load(path: str | pathlib.Path, overrides: Sequence[str] = ()) -> Config:
  """`sao_jax.config.load_config(path, overrides)`, then `check`ed."""
  return check(load_config(path, overrides))
