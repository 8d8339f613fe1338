"""The built-in "math_tool" environment as an `EnvironmentSpec` (options, tasks, demonstrations)."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import fail
from sao_jax.config.env import DEFAULT_DIFFICULTY, ENV_PROBLEM_KINDS
from sao_jax.envs import common
from sao_jax.envs.base import EnvironmentSpec
from sao_jax.envs.math import tasks as math_tasks
from sao_jax.envs.math import tool
from sao_jax.envs.math.tasks import MAX_DIFFICULTY


@dataclasses.dataclass(frozen=True, kw_only=True)
class MathOptions:
  """`env.options` of "math_tool"."""

  difficulty: int = DEFAULT_DIFFICULTY  # generated tasks: 1..MAX_DIFFICULTY
  problem_kind: str = "mixed"  # generated tasks: one of ENV_PROBLEM_KINDS
  # The share of SFT demonstrations that call the tool; the rest answer at once
  # without it (the demo's warm-start, so RL has a strategy to find).
  demo_tool_rate: float = 1.0
  # The share of SFT demonstrations from a careless expert who guesses the
  # question's first number without the tool (imperfect data only RL can correct).
  demo_guess_rate: float = 0.0
  # A difficulty mix (generated tasks): this share of tasks is hard, generated at
  # hard_difficulty (more operands or steps, larger numbers) instead of difficulty,
  # so the value of a prompt differs by prompt (0: every task at difficulty).
  hard_share: float = 0.0
  hard_difficulty: int = MAX_DIFFICULTY  # the difficulty of hard tasks, above difficulty

  def validate(self) -> None:
    if self.difficulty not in range(1, MAX_DIFFICULTY + 1):
      fail("env.options", "difficulty", self.difficulty, f"expected an integer in 1..{MAX_DIFFICULTY}")
    if self.problem_kind not in ENV_PROBLEM_KINDS:
      fail("env.options", "problem_kind", self.problem_kind,
           f"allowed values are {', '.join(map(repr, ENV_PROBLEM_KINDS))}")
    for field in ("demo_tool_rate", "demo_guess_rate", "hard_share"):
      if not 0 <= getattr(self, field) <= 1:
        fail("env.options", field, getattr(self, field), "expected a number in [0, 1]")
    if self.hard_difficulty not in range(1, MAX_DIFFICULTY + 1):
      fail("env.options", "hard_difficulty", self.hard_difficulty,
           f"expected an integer in 1..{MAX_DIFFICULTY}")
    if self.hard_share and self.hard_difficulty <= self.difficulty:
      fail("env.options", "hard_difficulty", self.hard_difficulty,
           f"hard tasks must be harder than env.options.difficulty={self.difficulty}: set "
           f"it in {self.difficulty + 1}..{MAX_DIFFICULTY}, or lower difficulty")


def _make(options: MathOptions, config) -> tool.MathToolEnv:
  del options  # the options shape tasks and demonstrations, not the episode
  return tool.MathToolEnv(max_turns=config.max_turns,
                          max_observation_chars=config.max_observation_chars,
                          sandbox_limits=config.tool, isolation=common.isolation(config))


SPEC = EnvironmentSpec(
    name="math_tool", make=_make, options=MathOptions,
    task_sources={"generator": lambda o, c: math_tasks.iterate_generated(
        seed=c.seed, difficulty=o.difficulty, kind=o.problem_kind, hard_share=o.hard_share,
        hard_difficulty=o.hard_difficulty)},
    demonstration=lambda task, o: math_tasks.demonstration(task, o.demo_tool_rate,
                                                          o.demo_guess_rate))
