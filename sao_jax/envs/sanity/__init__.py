"""A sanity setting where RL alone does the learning: a four-armed bandit in chat form.

One turn per episode, no tool and no sandbox: every prompt says "Answer with the
word red." (`TARGET`); the reward is 1 if the reply, stripped of surrounding
whitespace, is exactly that word, else 0 (checked in microseconds). The optimum
is reward 1 on every task.

Demonstrations (`demonstration`, the SFT warm-start's scripted answers) teach
only the format: each answers with one of `WORDS` drawn by a hash of the task
id, whatever the prompt says. A warm-started policy therefore answers with a
word of the list and stops, but picks it at chance (expected sampled reward
1 / len(WORDS) = 0.25): the gain above chance can only come from RL. From that
start every variant should reach a sampled training reward near 1 within a few
dozen steps (`configs/sanity_cpu.py`).

Why one target word and not a different word per prompt: with the named word
drawn from `WORDS` per task (a contextual bandit: the policy must also learn to
read the prompt), neither SAO nor GRPO rose above chance within 100 steps at
policy learning rates 1e-3 or 3e-3 on the sanity model, and at 1e-2 both lost
entropy to one answer within ~10 steps. That setting tests representation
learning as much as RL; this one isolates the RL update.
"""

from __future__ import annotations

import itertools
import random
import types
from typing import Iterator

from sao_jax.envs.base import Environment, EnvironmentSpec, Message, StepResult, Task

WORDS = ("red", "blue", "green", "gold")
TARGET = WORDS[0]
SYSTEM_PROMPT = "Reply with one word."


def generate_task(index: int, *, seed: int = 0) -> Task:
  """The `index`-th task for `seed`: all name `TARGET`; ids differ (demonstrations hash them)."""
  return Task(id=f"sanity-s{seed}-{index}", prompt=f"Answer with the word {TARGET}.",
              answer=TARGET, metadata=types.MappingProxyType({}))


def iterate_generated(*, seed: int = 0) -> Iterator[Task]:
  """Tasks 0, 1, 2, ... without end."""
  for index in itertools.count():
    yield generate_task(index, seed=seed)


def demonstration(task: Task) -> list[str]:
  """One assistant turn in the answer format, with a word of `WORDS` drawn from the
  task id alone (module docstring): format, not the answer."""
  return [random.Random(f"sao-sanity-demo/{task.id}").choice(WORDS)]


class SanityEnv(Environment):
  """Single turn: reward 1 iff the reply is exactly the named word."""

  def __init__(self, *, max_observation_chars: int):
    super().__init__(max_turns=1, max_observation_chars=max_observation_chars)

  def _reset(self, task: Task) -> list[Message]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.prompt}]

  def _step(self, action: str) -> StepResult:
    correct = action.strip() == self.task.answer
    return StepResult.finish(float(correct), "answer", correct=correct)


SPEC = EnvironmentSpec(
    name="sanity", make=lambda options, config: SanityEnv(
        max_observation_chars=config.max_observation_chars),
    task_sources={"generator": lambda options, config: iterate_generated(seed=config.seed)},
    demonstration=lambda task, options: demonstration(task))
