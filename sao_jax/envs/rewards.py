"""Reward functions written as plain Python (`env.reward_fn="package.module:function"`).

The function is called once per episode, on the episode's last assistant turn:

    def reward(response: str, task: Task, messages: list[dict]) -> float | Mapping[str, float]

- `response`: the text of the last assistant turn (untrusted: the policy wrote it);
- `task`: the `Task` (`answer` = the reference, e.g. verl's `reward_model.ground_truth`;
  `metadata` = the row's other fields: "source" (verl's `data_source`),
  "extra_info", ...);
- `messages`: the whole conversation, a copy, the last turn included.

It returns the reward as a number, or a mapping with the reward under "score"
and any other numbers, which are kept as the episode's metrics
(`StepResult.info`). With `env.reward_fn` set, the function's score replaces the
environment's own reward at the end of every episode the environment did not
fail (the environment's reward is kept as `info["env_reward"]`).

verl's reward functions are called as verl calls them, unmodified
(`verl/utils/reward_score/*.py`, a verl `custom_reward_function`):

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)
    def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0)

by keyword, with those of `data_source` (`metadata["source"]`), `solution_str`
(the response), `ground_truth` (`task.answer`) and `extra_info`
(`metadata["extra_info"]`, None without one) that the function names (all four
when it takes `**kwargs`); its other parameters keep their defaults. Which
convention a function follows is `env.reward_fn_convention`: "auto" (the
default) reads its signature, verl's when a parameter is named `solution_str`
(every verl scorer names it), else sao_jax's; "verl" or "sao" says it outright.
A verl function's result is read as verl's `default_compute_score` reads its
scorers': a mapping as is (its "score" the reward; of its other values, the
numbers and bools are kept as metrics, bools as 0/1, and the rest, e.g. a
predicted answer's text, are left out as verl keeps them out of its metrics), a
number or bool as a float, a tuple or list by its first item.

The function is user code and trusted; the text it grades is not: it must
never `eval`/`exec` the response or run it except through the sandbox
(`sao_jax.envs.sandbox.run_python`). A function that raises (SystemExit
included), does not return within `env.reward_timeout_s`, or returns a mapping
without "score" or with a value that is not a finite number fails that episode
as an environment failure naming the function (dropped and counted, never reward
0); the sampler goes on. The score itself is passed on as returned, and the
sampler checks it like every reward (`sao_jax.envs.contract`): one that is not a
finite real number (a bool, a string, None, NaN) fails the episode as
`bad_reward`, naming the environment, the function and the value. A function
past its deadline cannot be stopped (Python threads cannot be killed): its
thread is left to finish in the background, so a function that can hang should
bound its own work.
"""

from __future__ import annotations

import copy
import inspect
import threading
from typing import Any, Callable, Mapping

from sao_jax.envs import contract, plugins
from sao_jax.envs.base import Environment, Message, SampledTurn, StepResult, Task, Turn

_SHOWN_CHARS = 200  # of an error's message in a failure text


# env.reward_fn_convention's values: how a reward function is called (module docstring).
CONVENTIONS = ("auto", "sao", "verl")
# What a verl reward function may be given, by keyword (verl's reward managers' names).
VERL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")


def check_convention(convention: str) -> None:
  """ValueError naming `env.reward_fn_convention` unless it is one of `CONVENTIONS`."""
  if convention not in CONVENTIONS:
    raise ValueError(f"env.reward_fn_convention={convention!r} is invalid: allowed values are "
                     f"{', '.join(map(repr, CONVENTIONS))}")


def load_reward_fn(path: str, convention: str = "auto") -> Callable[..., Any]:
  """The callable `path` names, called as `fn(response, task, messages)` (a verl
  function behind `verl_adapter`, by `convention`); ValueError naming
  `env.reward_fn` otherwise."""
  check_convention(convention)
  fn = plugins.load_object(path, what=f"env.reward_fn={path!r}")
  if not callable(fn):
    raise ValueError(f"env.reward_fn={path!r} names a {type(fn).__name__}, which is not "
                     "callable; name a function reward(response, task, messages)")
  if convention == "verl" or (convention == "auto" and "solution_str" in _parameters(fn)):
    return verl_adapter(fn)
  return fn


def _parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
  """`fn`'s parameters by name; none when its signature cannot be read (a builtin)."""
  try:
    return dict(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    return {}


def verl_adapter(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn`, a verl reward function, as `reward(response, task, messages)` (module docstring)."""
  parameters = _parameters(fn)
  takes_all = not parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                    for p in parameters.values())
  names = [name for name in VERL_ARGUMENTS if takes_all or name in parameters]

  def reward(response: str, task: Task, messages: list[Message]) -> Any:
    del messages  # verl's functions grade the response alone
    given = {"data_source": task.metadata.get("source"), "solution_str": response,
             "ground_truth": task.answer, "extra_info": task.metadata.get("extra_info")}
    return verl_result(fn(**{name: given[name] for name in names}))

  return reward


def verl_result(value: Any) -> Any:
  """A verl function's result as sao_jax reads results: verl's `default_compute_score`
  normalisation (module docstring); anything else is passed on for the usual checks."""
  if isinstance(value, (tuple, list)) and value:
    value = value[0]  # verl's scorers that return (score, details)
  if isinstance(value, bool):
    return float(value)
  if isinstance(value, Mapping):
    return {key: value[key] if key == "score" else contract.metric_value(value[key])
            for key in value
            if key == "score" or contract.metric_value(value[key]) is not None}
  return value


def grade(fn: Callable[..., Any], path: str, timeout_s: float, response: str, task: Task,
          messages: list[Message], **info: Any) -> StepResult:
  """`fn(response, task, messages)` as a finished or failed `StepResult` (module docstring)."""
  box: dict[str, Any] = {}

  def call() -> None:
    try:
      box["value"] = fn(response, task, copy.deepcopy(messages))
    except BaseException as error:  # user code: whatever it raises fails the episode
      box["error"] = error

  thread = threading.Thread(target=call, name="reward-fn", daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    return StepResult.fail(f"reward function {path} did not return within "
                           f"env.reward_timeout_s={timeout_s}s", **info)
  if "error" in box:
    error = box["error"]
    return StepResult.fail(f"reward function {path} raised {type(error).__name__}: "
                           f"{str(error)[:_SHOWN_CHARS]}", **info)
  value = box["value"]
  if not isinstance(value, Mapping):
    # The score as returned: the sampler checks it like every reward (envs.contract).
    return StepResult.finish(value, "reward_fn", **info)
  if "score" not in value:
    return StepResult.fail(f"reward function {path} returned a mapping without 'score' "
                           f"(keys {sorted(map(str, value))[:10]})", **info)
  metrics: dict[str, float] = {}
  for key, item in value.items():
    if key == "score":
      continue
    number = contract.metric_value(item) if isinstance(key, str) else None
    if number is None:
      return StepResult.fail(f"reward function {path} returned {{{contract.shown(key)}: "
                             f"{contract.shown(item)}}}: every value of its mapping must be a "
                             "finite number", **info)
    metrics[key] = number
  return StepResult.finish(value["score"], "reward_fn", **info, **metrics)


class RewardFnEnv(Environment):
  """`inner` with its final reward replaced by `fn`'s (module docstring)."""

  def __init__(self, inner: Environment, fn: Callable[..., Any], *, path: str,
               timeout_s: float):
    # Not Environment.__init__: the turn budget, observation cap and counters are `inner`'s.
    self.inner, self.fn, self.path, self.timeout_s = inner, fn, path, timeout_s
    self.observation_role = inner.observation_role
    self._messages: list[Message] = []

  max_turns = property(lambda self: self.inner.max_turns)
  max_observation_chars = property(lambda self: self.inner.max_observation_chars)
  task = property(lambda self: self.inner.task)
  turn = property(lambda self: self.inner.turn)
  tool_calls = property(lambda self: self.inner.tool_calls)
  done = property(lambda self: self.inner.done)

  tools = property(lambda self: self.inner.tools)
  tool_format = property(lambda self: self.inner.tool_format)
  slow_reset = property(lambda self: self.inner.slow_reset)
  max_new_tokens = property(lambda self: self.inner.max_new_tokens)

  def observe_turn(self, turn: SampledTurn) -> None:
    self.inner.observe_turn(turn)

  def set_step(self, step: int) -> None:
    self.inner.set_step(step)

  def set_tool_format(self, tool_format: str) -> None:
    self.inner.set_tool_format(tool_format)

  def write_turn(self, turn: Turn) -> str:
    return self.inner.write_turn(turn)

  def close(self) -> None:
    self.inner.close()

  def reset(self, task: Task) -> list[Message]:
    messages = self.inner.reset(task)
    self._messages = copy.deepcopy(list(messages))
    return messages

  def step(self, action: str) -> StepResult:
    result = self.inner.step(action)
    if not isinstance(result, StepResult):
      return result  # the sampler's check refuses it, naming the environment (envs.contract)
    self._messages.append({"role": "assistant", "content": action})
    if not result.done:
      if result.new_segment:  # the conversation restarts from these messages
        self._messages = copy.deepcopy(list(result.messages or ()))
      elif result.messages is not None:
        self._messages.extend(copy.deepcopy(list(result.messages)))
      else:
        self._messages.append({"role": self.observation_role, "content": result.observation})
      return result
    if result.failure is not None:
      return result
    return grade(self.fn, self.path, self.timeout_s, action, self.inner.task, self._messages,
                 env_reward=result.reward, env_reason=result.reason)

  def _reset(self, task: Task) -> list[Message]:  # unused: reset is overridden
    raise NotImplementedError

  def _step(self, action: str) -> StepResult:  # unused: step is overridden
    raise NotImplementedError
