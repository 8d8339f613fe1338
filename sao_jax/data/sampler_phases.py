"""What a trajectory says about its sampler's time: `info["phases"]`, read by the learner.

A sampler process (`sao_jax.sampler.worker`, timed by `sao_jax.run.phases.SamplerPhases`)
puts in each trajectory it hands over the seconds its loop spent in each of
`SAMPLER_PHASES` since its previous trajectory, and "wall", their sum. The learner's
pipeline reads them with `read_sampler_phases` (a peer's records are read: only
these names, only finite seconds in [0, MAX_PHASE_S]) into `BatchInfo.sampler_phases`.
"""

from __future__ import annotations

import math

# Sampler phases (consecutive laps of the sampler loop) and what each one times.
SAMPLER_PHASES = {
    "adopt": "taking a newly published weight version: converting and placing it on the "
             "sampler's devices (the copy finishes asynchronously, inside the next call)",
    "start": "starting episodes: making tasks, environment resets, tokenising prompts",
    "prefill": "the engine's prefill calls (prompts and observations into the KV cache, "
               "each turn's first token)",
    "decode": "the engine's decode calls (launch, waiting for the tokens, recording them)",
    "env_wait": "waiting for environment steps with nothing to decode",
    "host": "the episode runner's other host work: applying environment results, "
            "tokenising observations, finishing episodes",
    "handover": "handing trajectories to the transport (waiting when it is full: the "
                "learner is behind)",
    "version_wait": "waiting, with no episode in flight, for the policy version the next "
                    "batch is sampled with (data.fixed_lag only: the learner has not "
                    "published it yet)",
}
# The most seconds one trajectory's phases may report (a peer's records are read).
MAX_PHASE_S = 1e6


def read_sampler_phases(value) -> dict[str, float]:
  """A trajectory's `info["phases"]` as {phase or "wall": seconds}: the known names
  only, each a finite number in [0, MAX_PHASE_S]; {} when it is not such a mapping
  (a peer that does not report them, or reports nonsense)."""
  if not isinstance(value, dict):
    return {}
  out = {}
  for name in (*SAMPLER_PHASES, "wall"):
    seconds = value.get(name)
    if (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        and math.isfinite(seconds) and 0 <= seconds <= MAX_PHASE_S):
      out[name] = float(seconds)
  return out if "wall" in out else {}
