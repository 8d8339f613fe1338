"""A sanity setting where RL alone does the learning: "answer with the word named".

One turn per episode, no tool and no sandbox: the prompt names one of `WORDS`
("Answer with the word blue."); the reward is 1 if the reply, stripped of
surrounding whitespace, is exactly that word, else 0 (checked in microseconds).
The optimum is reward 1 on every task.

Demonstrations (`demonstration`, the SFT warm-start's scripted answers) teach
only the format: each answers with a word drawn from `WORDS` by a hash of the
task id, independently of the word the prompt names. A warm-started policy
therefore answers with some word of the list and stops, but picks it at chance
(expected sampled reward 1 / len(WORDS) = 0.25): the gain above chance can only
come from RL. From that start every variant should reach a sampled training
reward near 1 within a few dozen steps (`configs/sanity_cpu.py`).
"""

from __future__ import annotations

import itertools
import random
import types
from typing import Iterator

from sao_jax.envs.base import Environment, Message, StepResult, Task

WORDS = ("red", "blue", "green", "gold")
SYSTEM_PROMPT = "Reply with one word."


def generate_task(index: int, *, seed: int = 0) -> Task:
  """The `index`-th task for `seed` (string-seeded, so the same on any machine)."""
  word = random.Random(f"sao-sanity/{seed}/{index}").choice(WORDS)
  return Task(id=f"sanity-s{seed}-{index}", prompt=f"Answer with the word {word}.", answer=word,
              metadata=types.MappingProxyType({}))


def iterate_generated(*, seed: int = 0) -> Iterator[Task]:
  """Tasks 0, 1, 2, ... without end."""
  for index in itertools.count():
    yield generate_task(index, seed=seed)


def demonstration(task: Task) -> list[str]:
  """One assistant turn in the answer format, with a word chosen independently of
  the one the prompt names (module docstring): format, not the answer."""
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
