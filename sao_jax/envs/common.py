"""What the shared `EnvConfig` fields give every environment that runs tools."""

from __future__ import annotations

import functools
import logging


@functools.cache
def _warn_unisolated() -> None:
  """Once per process, loudly: tool code runs without kernel isolation."""
  logging.getLogger(__name__).warning(
      "env.sandbox='unisolated': model-written code runs WITHOUT kernel isolation, as this "
      "process's user, with only resource limits. Only for trusted policies; install "
      "bubblewrap and use env.sandbox='bwrap' otherwise.")


def isolation(config) -> str:
  """`config.sandbox` (an `EnvConfig`'s), warning once per process when it is 'unisolated'."""
  if config.sandbox == "unisolated":
    _warn_unisolated()
  return config.sandbox
