r"""Unit conversion, a multi-turn sao_jax environment with one tool.

Each task asks how many `to_unit` are in `value from_unit` (e.g. "How many m are
in 7 km?"). The policy may call the tool `convert(value, from_unit, to_unit)`,
whose result comes back as a tool message, and answers with `\boxed{number}`:
reward 1 if the number is within a relative `tolerance` of the true one, else 0.
The tool is declared as a JSON-schema function: with a chat template that has a
native tool-call format (Qwen's `<tool_call>`, Llama 3.1's JSON) the template
shows it and the policy calls it in that format; with ChatML it is described in
the system prompt as a ```tool block (`sao_jax.chat.tool_calls`).

Everything sao_jax needs is `SPEC`, registered under the entry point
`unit_conversion` (pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import re

from sao_jax.chat import tool_calls
from sao_jax.envs.base import Environment, EnvironmentSpec, StepResult, Task, ToolCall, Turn

# unit -> (dimension, size in the dimension's base unit)
UNITS = {"mm": ("length", 0.001), "cm": ("length", 0.01), "m": ("length", 1.0),
         "km": ("length", 1000.0), "g": ("mass", 0.001), "kg": ("mass", 1.0),
         "t": ("mass", 1000.0), "ms": ("time", 0.001), "s": ("time", 1.0),
         "min": ("time", 60.0), "h": ("time", 3600.0)}
CONVERT = tool_calls.function(
    "convert", "Convert a quantity from one unit to another of the same dimension.",
    {"value": {"type": "number", "description": "The quantity in from_unit."},
     "from_unit": {"type": "string", "description": f"One of {', '.join(UNITS)}."},
     "to_unit": {"type": "string", "description": "The unit to convert to."}})
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
  """`env.options` of this environment (checked by sao_jax at start-up)."""

  max_value: int = 100  # task values are integers in 1..max_value
  tolerance: float = 1e-3  # relative error an answer may have

  def validate(self) -> None:
    if self.max_value < 1:
      raise ValueError(f"env.options.max_value={self.max_value!r} is invalid: expected >= 1")
    if not 0 <= self.tolerance < 1:
      raise ValueError(f"env.options.tolerance={self.tolerance!r} is invalid: expected a "
                       "number in [0, 1)")


def convert(value: float, from_unit: str, to_unit: str) -> float:
  """`value` in `from_unit` expressed in `to_unit`; ValueError naming a bad unit."""
  for unit in (from_unit, to_unit):
    if unit not in UNITS:
      raise ValueError(f"unknown unit {unit[:20]!r}; the units are {', '.join(UNITS)}")
  if UNITS[from_unit][0] != UNITS[to_unit][0]:
    raise ValueError(f"cannot convert {UNITS[from_unit][0]} ({from_unit}) to "
                     f"{UNITS[to_unit][0]} ({to_unit})")
  return value * UNITS[from_unit][1] / UNITS[to_unit][1]


def generate_task(index: int, *, seed: int, max_value: int) -> Task:
  rng = random.Random(f"unit-conversion/{seed}/{index}")
  dimension = rng.choice(("length", "mass", "time"))
  from_unit, to_unit = rng.sample([u for u, (d, _) in UNITS.items() if d == dimension], 2)
  value = rng.randint(1, max_value)
  answer = convert(value, from_unit, to_unit)
  return Task(id=f"units-s{seed}-{index}", prompt=f"How many {to_unit} are in {value} {from_unit}?",
              answer=repr(answer), metadata={"value": value, "from_unit": from_unit,
                                             "to_unit": to_unit})


class UnitConversionEnv(Environment):
  """Tool calls until a `\\boxed{}` answer (module docstring)."""

  observation_role = "tool"
  tools = (CONVERT,)

  def __init__(self, options: Options, *, max_turns: int, max_observation_chars: int):
    super().__init__(max_turns=max_turns, max_observation_chars=max_observation_chars)
    self.options = options

  def _reset(self, task):
    system = "Answer the question. Give the final answer as \\boxed{number}."
    if self.tool_format == "fenced":  # the template cannot show the tool: the prompt does
      system += "\n" + tool_calls.describe_fenced(self.tools)
    else:
      system += " You may call the convert tool."
    return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

  def _step(self, action):
    answer = _BOXED.findall(action)
    if answer:
      try:
        predicted = float(answer[-1].replace(",", ""))
      except ValueError:
        return StepResult.finish(0.0, "answer", correct=False)
      expected = float(self.task.answer)
      correct = math.isclose(predicted, expected, rel_tol=self.options.tolerance)
      return StepResult.finish(float(correct), "answer", correct=correct,
                               tool_calls=self.tool_calls)
    try:
      call = tool_calls.read(action, self.tool_format, self.tools)
      if call is None:
        return StepResult.next("Call the convert tool or answer with \\boxed{number}.")
      result = convert(float(call.arguments["value"]), call.arguments["from_unit"],
                       call.arguments["to_unit"])
    except (tool_calls.ToolCallError, ValueError) as error:
      return StepResult.next(str(error) if str(error).startswith("error:") else f"error: {error}")
    self.tool_calls += 1
    return StepResult.next(repr(result))


def _tasks(options: Options, config):
  for index in itertools.count():
    yield generate_task(index, seed=config.seed, max_value=options.max_value)


def demonstration(task: Task, options: Options) -> list[str | Turn]:
  """A call of the tool (a `Turn`: sao_jax writes it in the run's tool-call format, a
  ```tool block under ChatML), then the boxed result."""
  call = ToolCall("convert", {"value": task.metadata["value"],
                              "from_unit": task.metadata["from_unit"],
                              "to_unit": task.metadata["to_unit"]})
  return [Turn("", call), f"\\boxed{{{float(task.answer):.6g}}}"]


SPEC = EnvironmentSpec(
    name="unit_conversion", options=Options, task_sources={"generator": _tasks},
    make=lambda options, config: UnitConversionEnv(
        options, max_turns=config.max_turns, max_observation_chars=config.max_observation_chars),
    demonstration=demonstration)
