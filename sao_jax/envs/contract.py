"""What an environment's step may return, checked where every step result enters a trajectory.

    bad = check_result(env.step(action))   # None, or which field is wrong and how
    if bad is not None:
      fail the episode as bad.kind ("bad_reward", ...), its text naming the
      environment and bad.problem

The sampler's `EpisodeRunner` (`sao_jax.sampler.episodes`) calls `check_result`
on every value `env.step` returns, before it reads any field of it: the built-in
environments, plugins, `StepResult.finish` and a reward function's grade
(`sao_jax.envs.rewards` passes the function's score on unconverted) all pass
this one check. A step result must be a `StepResult` whose

- `done` is True or False, and whose `observation`, while the episode goes on,
  is a str;
- `reward` is a finite real number: an int, a float, a numpy integer or
  floating scalar (`numbers.Real`); not a bool (True is not a score), not a
  string, None, a list or an array, not NaN or infinite, and not beyond the
  range of the float32 the learner trains it as (`REWARD_LIMIT`: 1e39, 10**400
  would be trained as infinity, which skips the whole batch's update);
- `failure` and `reason` are None or a str, and `info` is a mapping;
- `messages` (an observation as several chat messages) is None or, while the
  episode goes on, a non-empty tuple of mappings each with a str "role" and a str
  "content" (what the chat format then checks further), and `new_segment` a bool.

A result that breaks it fails its episode as the environment's failure of kind
`bad_<field>` (`KINDS`; the learner counts `dropped/env_failure/bad_reward`, ...),
the failure text naming the environment and the value (`shown`: its repr, escaped
and cut at `SHOWN_CHARS`). The value is never converted: a reward of "0.9" is
not trained as 0.9, nor None as 0.0. Nothing an environment returns ends the
sampler.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
from typing import Any, Mapping

import numpy as np

from sao_jax.envs.base import StepResult
from sao_jax.log_text import untrusted

SHOWN_CHARS = 200  # of a value's repr in a failure text
# The fields check_result checks, in order; a result failing one fails as "bad_<field>"
# ("result": not a StepResult at all).
FIELDS = ("result", "done", "observation", "reward", "failure", "reason", "info", "messages")
KINDS = tuple(f"bad_{field}" for field in FIELDS)

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = SHOWN_CHARS  # containers: their first few items
# The largest reward magnitude: trajectories hold rewards as float32 (`types.Trajectory`).
REWARD_LIMIT = float(np.finfo(np.float32).max)
REWARD_EXPECTED = ("expected a finite real number (int, float or a numpy number; not a bool, "
                   f"a string, None or a sequence, not NaN, infinite or beyond ±{REWARD_LIMIT:.4g})")


def shown(value: Any) -> str:
  """`value`'s repr for an error message, bounded (`reprlib`, then `SHOWN_CHARS`) and
  escaped (`log_text.untrusted`)."""
  return untrusted(_REPR.repr(value), SHOWN_CHARS)


def _field(name: str, value: Any) -> str:
  """"name=value (type)" for a refused field: "reward='0.9' (str)"."""
  return f"{name}={shown(value)} ({type(value).__name__})"


def reward_value(value: Any) -> float | None:
  """`value` as a float if it is a reward (module docstring), else None."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    return None
  try:
    number = float(value)
  except Exception:  # pylint: disable=broad-except  # 10**400; a Real subclass that refuses
    return None
  return number if math.isfinite(number) and abs(number) <= REWARD_LIMIT else None


def metric_value(value: Any) -> float | None:
  """`value` as a float if it is an episode metric (a number of `StepResult.info`): a
  reward value, or a bool (as 0 or 1); else None (such info is not a metric)."""
  return float(value) if isinstance(value, bool) else reward_value(value)


@dataclasses.dataclass(frozen=True)
class BadResult:
  """Which field of a step result breaks the contract (`field`, one of `FIELDS`), and
  how (`problem`: the field, its value and what is allowed)."""

  field: str
  problem: str

  @property
  def kind(self) -> str:
    """The episode's `failure_kind`: "bad_<field>"."""
    return f"bad_{self.field}"


def check_result(result: Any) -> BadResult | None:
  """None if `result` keeps the contract (module docstring), else the first field that
  does not."""
  if not isinstance(result, StepResult):
    return BadResult("result", f"{shown(result)} ({type(result).__name__}): expected a "
                     "sao_jax.envs.base.StepResult (StepResult.next, .finish or .fail)")
  if not isinstance(result.done, bool):
    return BadResult("done", f"{_field('done', result.done)}: expected True or False")
  if not result.done and not isinstance(result.observation, str):
    return BadResult("observation", f"{_field('observation', result.observation)}: expected the "
                     "text (a str) that goes back to the model")
  if reward_value(result.reward) is None:
    return BadResult("reward", f"{_field('reward', result.reward)}: {REWARD_EXPECTED}")
  for field in ("failure", "reason"):
    value = getattr(result, field)
    if value is not None and not isinstance(value, str):
      return BadResult(field, f"{_field(field, value)}: expected None or a str")
  if not isinstance(result.info, Mapping):
    return BadResult("info", f"{_field('info', result.info)}: expected a mapping (the keyword "
                     "arguments of StepResult.next/finish/fail)")
  return _check_messages(result)


def _check_messages(result: StepResult) -> BadResult | None:
  messages = result.messages
  if messages is None and result.new_segment is False:
    return None
  fine = (not result.done and isinstance(messages, tuple) and messages
          and isinstance(result.new_segment, bool)
          and all(isinstance(m, Mapping) and isinstance(m.get("role"), str)
                  and isinstance(m.get("content"), str) for m in messages))
  if fine:
    return None
  return BadResult("messages", f"{_field('messages', messages)} with new_segment="
                   f"{shown(result.new_segment)}: expected, while the episode goes on, a "
                   "non-empty tuple of {'role': str, 'content': str, ...} messages "
                   "(StepResult.next_messages)")
