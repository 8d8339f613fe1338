r"""One prompt, one reply, one reward: the environment for prompt/answer datasets.

The conversation is the task's chat messages when its source gave them (a
verl-style row's `prompt`), else an optional system prompt (`system_prompt`)
and the task's prompt as the user message. The policy answers once; the reply
is graded by `env.reward_fn` when one is set (`sao_jax.envs.rewards`), else by
`grader`: "boxed" = 1 if the reply's last `\boxed{...}` matches the task's
answer (`envs.math.answers.verify_answer`, math-verify), "exact" = 1 if the
reply, stripped of surrounding whitespace, equals the answer. It has no task
generator: set `env.task_source` to "jsonl", "parquet" or "hf_disk".
"""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import fail
from sao_jax.envs.base import Environment, EnvironmentSpec, Message, StepResult, Task
from sao_jax.envs.math import answers, checker

GRADERS = ("boxed", "exact")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SingleTurnOptions:
  """`env.options` of "single_turn"."""

  system_prompt: str = ""  # "" = none (a task that brings its messages brings its own)
  grader: str = "boxed"  # without env.reward_fn: one of GRADERS

  def validate(self) -> None:
    if self.grader not in GRADERS:
      fail("env.options", "grader", self.grader, f"allowed values are {', '.join(map(repr, GRADERS))}")


class SingleTurnEnv(Environment):
  """Reply once; reward by `grader` (module docstring)."""

  def __init__(self, options: SingleTurnOptions, *, max_observation_chars: int = 4096,
               start_checker: bool = True):
    """`start_checker=False`: the "boxed" grader's math-verify child starts at the first
    grade instead of now (when `env.reward_fn` grades, it never does)."""
    super().__init__(max_turns=1, max_observation_chars=max_observation_chars)
    self.options = options
    if options.grader == "boxed" and start_checker:
      checker.start()

  def _reset(self, task: Task) -> list[Message]:
    if task.messages:
      return [dict(message) for message in task.messages]
    system = ([{"role": "system", "content": self.options.system_prompt}]
              if self.options.system_prompt else [])
    return [*system, {"role": "user", "content": task.prompt}]

  def _step(self, action: str) -> StepResult:
    if self.options.grader == "exact":
      correct = action.strip() == self.task.answer
      return StepResult.finish(float(correct), "answer", correct=correct)
    predicted = answers.extract_boxed(action)
    correct = predicted is not None and answers.verify_answer(predicted, self.task.answer)
    return StepResult.finish(float(correct), "answer", correct=correct)


SPEC = EnvironmentSpec(
    name="single_turn", options=SingleTurnOptions,
    make=lambda options, config: SingleTurnEnv(
        options, max_observation_chars=config.max_observation_chars,
        start_checker=not config.reward_fn))
