"""Simulated tool latency (`env.latency`, `config.env.StepLatency`) for any environment.

    delays = episode_delays(cfg.env.latency, seed=episode_seed)  # one stream per episode
    delay_s = next(delays)                                       # this step's added delay

`EpisodeRunner` draws one delay per environment step, in the episode's step order,
and its step thread sleeps that long after `env.step` returns (`time.sleep`: no
CPU, and the engine goes on decoding the other episodes). So the setting applies
at one seam to every environment, built-in or plugin, and the delays of a run are
reproducible: episode `seed`'s k-th step waits the same whatever the machine's
load or the order in which steps return.

Kinds (`LATENCY_KINDS`):
- "none": 0 (no stream is drawn from);
- "fixed": `seconds`, every step;
- "lognormal": `median_s * exp(sigma * z)`, z standard normal: median `median_s`,
  a long right tail (mean `median_s * exp(sigma**2 / 2)`).
Every delay is cut to `max_s`.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np

from sao_jax.config.env import StepLatency

# Mixed into an episode's seed so the latency stream is independent of the other uses
# of the same seed (the engine's sampling keys).
_STREAM = 0x1A7E


def episode_delays(latency: StepLatency, *, seed: int) -> Iterator[float]:
  """The added delays, in seconds, of one episode's environment steps (module docstring)."""
  if latency.kind == "none":
    return itertools.repeat(0.0)
  if latency.kind == "fixed":
    return itertools.repeat(min(float(latency.seconds), latency.max_s))
  rng = np.random.default_rng([_STREAM, seed % 2**63])
  return (min(latency.median_s * float(np.exp(latency.sigma * rng.standard_normal())),
              latency.max_s) for _ in itertools.count())
