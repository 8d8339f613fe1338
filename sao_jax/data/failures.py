"""What the learner dropped, by kind, and the bound that stops a run of failures.

    intake = Intake(drops, max_fraction=cfg.run.max_failure_fraction,
                    window=cfg.run.failure_window)
    intake.judged(None)                        # admitted (pipeline.AdmitDataset)
    intake.judged("env_failure/ValueError")    # dropped: may raise TooManyFailures
    describe(drops)   # 'env_failure/ValueError 3 (first: step raised ValueError: ...)'

Drop kinds (`kinds`): the `pipeline.Drops` counters, each environment failure
under its own `env_failure/<failure_kind>` (whatever kind the sampler's
`info["failure_kind"]` names) rather than the `env_failure` total, which is
listed only for failures that named no kind. Each kind keeps its first message
(`Drops.examples`).

The bound: every trajectory admission judges on its own merits (admitted, or
dropped as an environment failure, malformed or too long) is one outcome in a
window of the last `window`; a trajectory dropped as stale or from a future policy
version is left out (it was late, not failed). Once the window is full and at
least `max_fraction` of it failed, `judged` raises `TooManyFailures` naming each
failure kind in the window, its count and first message, and how to fix it or
raise the bound (`run.max_failure_fraction`, `run.failure_window`). A healthy
run, whose environment fails now and then, stays far below 95% of 64 episodes;
a reward function that raises on every call reaches it at the 64th episode.
"""

from __future__ import annotations

import collections
import re
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # pipeline builds an Intake into its admission stage
  from sao_jax.data.pipeline import Drops
  from sao_jax.types import Trajectory

# Drop reasons that say a trajectory came late (or from a policy the learner has
# not made), not that its episode failed: outside the failure window.
LATE = ("stale", "future_version")
ENV_FAILURE = "env_failure"
SHOWN_KINDS = 8  # kinds named in one report line; the rest are summed
# A failure kind that becomes a metric key (`dropped/env_failure/<kind>`): a short name.
FAILURE_KIND = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]{0,63}")


def failure_key(traj: Trajectory) -> str:
  """The drop kind of a trajectory its environment failed: `env_failure/<kind>`
  for the sampler's `info["failure_kind"]` (an exception type, or the environment
  seam's name for a bad value), `env_failure` when it names no kind a metric key
  can hold (`FAILURE_KIND`; a peer's record can say anything)."""
  kind = traj.info.get("failure_kind")
  if isinstance(kind, str) and FAILURE_KIND.fullmatch(kind):
    return f"{ENV_FAILURE}/{kind}"
  return ENV_FAILURE


def kinds(drops: Mapping[str, int | float]) -> dict[str, int]:
  """Drop counts by kind, largest first: each `env_failure/<kind>` on its own, and
  `env_failure` only for the failures that named no kind. `drops`: a `Drops`, or its
  counts as read back from metrics (`dropped/<reason>` without the prefix)."""
  out = {key: int(count) for key, count in drops.items() if key != ENV_FAILURE and count}
  unnamed = int(drops.get(ENV_FAILURE, 0)) - sum(
      count for key, count in out.items() if key.startswith(ENV_FAILURE + "/"))
  if unnamed > 0:
    out[ENV_FAILURE] = unnamed
  return dict(sorted(out.items(), key=lambda item: (-item[1], item[0])))


def describe(drops: Drops, counts: dict[str, int] | None = None) -> str:
  """'kind N (first: message); ...' for `counts` (default: `kinds(drops)`), each
  with the first message `drops` kept for it; '' when nothing was dropped."""
  counts = kinds(drops) if counts is None else counts
  parts = [f"{kind} {count} (first: {drops.examples.get(kind, '-')})"
           for kind, count in list(counts.items())[:SHOWN_KINDS]]
  rest = list(counts.values())[SHOWN_KINDS:]
  if rest:
    parts.append(f"{len(rest)} more kinds {sum(rest)}")
  return "; ".join(parts)


def total(drops: Drops) -> int:
  """Trajectories dropped, each counted once (`kinds`)."""
  return sum(kinds(drops).values())


class TooManyFailures(ValueError):
  """The failure bound was reached (module docstring); the message says what failed."""


class Intake:
  """Counts the trajectories admission judged and keeps the failure window."""

  def __init__(self, drops: Drops, *, max_fraction: float = 1.0, window: int = 64):
    self.drops, self.max_fraction, self.window = drops, max_fraction, window
    self._recent: collections.deque[str | None] = collections.deque(maxlen=window)
    self.judged_total = 0  # trajectories admission judged (late ones included)
    self.admitted = 0

  def judged(self, drop_key: str | None) -> None:
    """One trajectory admitted (`drop_key` None) or dropped under `drop_key` (its
    `kinds` key); TooManyFailures once the bound is reached."""
    self.judged_total += 1
    if drop_key is None:
      self.admitted += 1
    elif drop_key in LATE:
      return
    self._recent.append(drop_key)
    failed = self.failed_in_window()
    if len(self._recent) == self.window and sum(failed.values()) >= self.max_fraction * (
        self.window):
      raise TooManyFailures(self._message(failed))

  def failed_in_window(self) -> dict[str, int]:
    """Failures among the last `window` judged trajectories, by kind, largest first."""
    counts = collections.Counter(key for key in self._recent if key is not None)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

  @property
  def failed_fraction(self) -> float:
    """The failed share of the window so far (0 before any trajectory was judged)."""
    return sum(self.failed_in_window().values()) / len(self._recent) if self._recent else 0.0

  def _message(self, failed: dict[str, int]) -> str:
    return (f"{sum(failed.values())} of the last {self.window} episodes the learner received "
            f"failed (run.max_failure_fraction={self.max_fraction:g} of run.failure_window="
            f"{self.window}), so the run stops rather than wait for a batch that may never "
            f"come: {describe(self.drops, failed)}. An env_failure/<kind> is an episode the "
            "environment or env.reward_fn failed (an exception's type, or the failure it "
            "returned): fix what its first message names (the sampler log holds the first "
            "traceback of each exception type); too_long: raise data.length_buckets or "
            "learner.row_length. If such failures are expected, raise run.max_failure_fraction "
            "(1.0 stops only when every episode of the window failed) or run.failure_window")

  def summary(self) -> dict:
    """The run summary's account of its trajectories: how many admission judged and
    admitted, and each drop kind's count and first message."""
    counts = kinds(self.drops)
    return {"trajectories_judged": self.judged_total, "trajectories_admitted": self.admitted,
            "dropped": dict(self.drops), "dropped_by_kind": counts,
            "dropped_first_message": {kind: self.drops.examples.get(kind, "")
                                      for kind in counts}}

  def closing_line(self) -> str:
    """The run's last word on its trajectories: how many were dropped, and why."""
    dropped = total(self.drops)
    line = (f"trajectories: {self.judged_total} judged, {self.admitted} admitted, {dropped} "
            "dropped")
    return line + (f": {describe(self.drops)}" if dropped else "")
