"""Where a run's time goes: the learner's step split into phases, and the samplers'.

    phases = StepPhases()                 # jobs.train makes it, learner.loop times with it
    with phases.timed("publish"):         # a phase of the step under way
      ...
    phases.cut(step)                      # the step's phases end here
    row = {**row, **phases.record(step)}  # time/learner/<phase>_s and time/learner/step_s

Learner. A step's interval runs from the previous step's cut (the end of its
`after_step`: publish, evaluation) to this one's. Inside it the learner's thread is
in one of `LEARNER_PHASES` (the checkpoint saved after the previous step, the wait
for this step's batch, the step's compute, logging the previous step's row, the
publish of its weights, an evaluation, the profiler writing a trace) or in the loop's
own bookkeeping, which is not timed. So the phases sum to the interval,
`time/learner/step_s`, up to that bookkeeping: within `TOLERANCE_S` +
`TOLERANCE_FRAC` x step_s (`accounted`; tests/test_phases.py checks a run's rows).
Compute is the host's view: from dispatching the step (its compile, the first time a
batch length is seen) until its result is ready; logging the previous row runs while
the device computes and counts as logging.

Sampler. `SamplerPhases` splits a sampler process's loop into `SAMPLER_PHASES` as
consecutive laps (each phase runs from the end of the previous one), so they sum to
its wall time exactly; the engine step is split further by the engine's own clocks
(prefill, decode) and the runner's environment wait, the rest of it being the host
work of the episode runner. Each trajectory a sampler hands over carries the
seconds since its previous one (`info["phases"]`); the learner sums a batch's
(`run.metrics.batch_metrics`) into `time/sampler/<phase>_s` and their wall time
`time/sampler/wall_s`, over all the sampler processes that made the batch (sampler
seconds, not wall-clock seconds: two samplers make two seconds a second). Time spent
on trajectories the learner drops (stale, failed) is not in any batch.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Mapping

from sao_jax.data.sampler_phases import SAMPLER_PHASES

# Learner phases, in the order a step meets them, and what each one times.
LEARNER_PHASES = {
    "checkpoint": "saving the checkpoint due after the previous step (0 when none was due)",
    "wait": "waiting for this step's batch of trajectories (learner/wait_s)",
    "compute": "the train step, from its dispatch (with its compile, the first time a "
               "batch length is seen) until its result is ready",
    "log": "writing the previous step's metrics row, progress line and TensorBoard "
           "events (while this step computes)",
    "publish": "publishing the step's weights to the samplers (when the policy changed)",
    "eval": "the held-out evaluation after the step (run.eval_every)",
    "profile": "starting or writing the profiler trace (sao-train --profile)",
}
STEP_KEY = "time/learner/step_s"
# How far the learner's phases may fall short of its step's wall time: the loop's
# untimed bookkeeping (a few dictionary merges and flag checks per step).
TOLERANCE_S, TOLERANCE_FRAC = 0.02, 0.05

SAMPLER_WALL_KEY = "time/sampler/wall_s"


def learner_key(phase: str) -> str:
  return f"time/learner/{phase}_s"


def sampler_key(phase: str) -> str:
  return f"time/sampler/{phase}_s"


def accounted(row: Mapping[str, float]) -> tuple[float, float]:
  """(sum of the learner's phases, the step's wall time) of a metrics row."""
  return sum(row[learner_key(p)] for p in LEARNER_PHASES), row[STEP_KEY]


class StepPhases:
  """The learner's per-step phases (module docstring). `clock`: seconds of a monotonic
  clock (a fake one in tests). Each phase is also a named span in a profiler trace
  (`learner/<phase>`)."""

  def __init__(self, clock: Callable[[], float] = time.perf_counter):
    self._clock = clock
    self._open = dict.fromkeys(LEARNER_PHASES, 0.0)
    self._records: dict[int, dict[str, float]] = {}
    self._since = clock()

  def restart(self) -> None:
    """The first step's interval starts now (after restore, the samplers' start-up)."""
    self._open = dict.fromkeys(LEARNER_PHASES, 0.0)
    self._since = self._clock()

  @contextlib.contextmanager
  def timed(self, phase: str) -> Iterator[None]:
    """Counts the time inside towards `phase` of the step under way."""
    if phase not in LEARNER_PHASES:
      raise ValueError(f"phase={phase!r}: expected one of {tuple(LEARNER_PHASES)}")
    from jax import profiler  # pylint: disable=import-outside-toplevel

    start = self._clock()
    try:
      with profiler.TraceAnnotation(f"learner/{phase}"):
        yield
    finally:
      self._open[phase] += self._clock() - start

  def cut(self, step: int) -> None:
    """Ends `step`'s interval: its phases are kept for `record(step)`."""
    now = self._clock()
    self._records[step] = {**{learner_key(p): s for p, s in self._open.items()},
                           STEP_KEY: now - self._since}
    self._open = dict.fromkeys(LEARNER_PHASES, 0.0)
    self._since = now

  def record(self, step: int) -> dict[str, float]:
    """`step`'s phases and wall time (once; {} when it was not cut)."""
    return self._records.pop(step, {})


class SamplerPhases:
  """A sampler loop's laps (module docstring). `engine.seconds` ("prefill", "decode")
  and `runner.env_wait_s` are the clocks inside the engine step."""

  def __init__(self, engine, runner, clock: Callable[[], float] = time.perf_counter):
    self._engine, self._runner, self._clock = engine, runner, clock
    self._laps = dict.fromkeys(SAMPLER_PHASES, 0.0)
    self._last = self._taken = clock()
    self._inner = self._inner_clocks()

  def _inner_clocks(self) -> dict[str, float]:
    return {"prefill": self._engine.seconds["prefill"],
            "decode": self._engine.seconds["decode"], "env_wait": self._runner.env_wait_s}

  def lap(self, phase: str) -> None:
    """The time since the previous lap was `phase` ("step": an engine step, split into
    prefill, decode, env_wait and host)."""
    now = self._clock()
    seconds, self._last = now - self._last, now
    if phase != "step":
      self._laps[phase] += seconds
      return
    inner = self._inner_clocks()
    parts = {name: inner[name] - self._inner[name] for name in inner}
    self._inner = inner
    for name, part in parts.items():
      self._laps[name] += part
    self._laps["host"] += seconds - sum(parts.values())

  def take(self) -> dict[str, float]:
    """The phases' seconds since the previous take, and "wall": their sum, the time
    between the two takes' last laps."""
    out = {**self._laps, "wall": self._last - self._taken}
    self._laps = dict.fromkeys(SAMPLER_PHASES, 0.0)
    self._taken = self._last
    return out


def sampler_metrics(reports: tuple[dict[str, float], ...]) -> dict[str, float]:
  """The batch's `time/sampler/*` keys: each phase's seconds summed over the reports
  of its trajectories (`data.sampler_phases.read_sampler_phases`), and their wall
  time; {} without any."""
  if not reports:
    return {}
  out = {sampler_key(p): sum(r.get(p, 0.0) for r in reports) for p in SAMPLER_PHASES}
  out[SAMPLER_WALL_KEY] = sum(r["wall"] for r in reports)
  return out


def progress_part(metrics: Mapping[str, float]) -> str:
  """The progress line's account of the step: `1.84 s/step (wait 61%, compute 35%,
  publish 2%) | sampler decode 70%, prefill 12%, env_wait 9%`: the three largest
  phases of each, as shares of their wall time; "" when the row has none."""
  parts = []
  if STEP_KEY in metrics and metrics[STEP_KEY] > 0:
    wall = metrics[STEP_KEY]
    parts.append(f"{wall:.2f} s/step (" + _largest(
        {p: metrics[learner_key(p)] / wall for p in LEARNER_PHASES}) + ")")
  if metrics.get(SAMPLER_WALL_KEY, 0.0) > 0:
    wall = metrics[SAMPLER_WALL_KEY]
    parts.append("sampler " + _largest(
        {p: metrics[sampler_key(p)] / wall for p in SAMPLER_PHASES}))
  return " | ".join(parts)


def _largest(shares: dict[str, float], n: int = 3) -> str:
  top = sorted(shares.items(), key=lambda item: -item[1])[:n]
  return ", ".join(f"{name} {share:.0%}" for name, share in top)
