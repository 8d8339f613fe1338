"""A sampler run for tests: the first worker process dies before sending anything
(as a sampler that crashes on start-up), every later one is the real sampler."""

import os
import pathlib

from sao_jax.sampler.worker import run_sampler


def die_once(spec, alive) -> None:
  marker = pathlib.Path(os.environ["SAO_TEST_DIED_ONCE"])
  if not marker.exists():
    marker.write_text("died")
    os._exit(3)
  run_sampler(spec, alive)
