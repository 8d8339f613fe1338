"""The built-in "coding" environment as an `EnvironmentSpec` (options, tasks, demonstrations)."""

from __future__ import annotations

import dataclasses
import os

from sao_jax.config.checks import fail
from sao_jax.config.env import DEFAULT_DIFFICULTY, ENV_CODING_BUG_KINDS
from sao_jax.envs import common, tasks
from sao_jax.envs.base import EnvironmentSpec
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import generator
from sao_jax.envs.coding import tasks as coding_tasks


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodingOptions:
  """`env.options` of "coding"."""

  difficulty: int = DEFAULT_DIFFICULTY  # generated tasks: 1..generator.MAX_DIFFICULTY
  bug_kind: str = "mixed"  # generated tasks: one of ENV_CODING_BUG_KINDS
  task_dir: str = ""  # task_source="dir": a directory of task dirs/archives
  # The reward: False = 1 iff every hidden test passes; True = the fraction that pass.
  partial_reward: bool = False
  # Task directories whose hidden tests cannot be rewritten into calls graded outside
  # the agent's interpreter (`coding.convert`) are refused at load; True grades them in
  # that interpreter instead, where an always-equal object passes `assert f(x) == y`.
  allow_forgeable_grading: bool = False

  def validate(self) -> None:
    if self.difficulty not in range(1, generator.MAX_DIFFICULTY + 1):
      fail("env.options", "difficulty", self.difficulty,
           f"expected an integer in 1..{generator.MAX_DIFFICULTY}")
    if self.bug_kind not in ENV_CODING_BUG_KINDS:
      fail("env.options", "bug_kind", self.bug_kind,
           f"allowed values are {', '.join(map(repr, ENV_CODING_BUG_KINDS))}")


def _check(options: CodingOptions, config) -> None:
  if config.task_source == "dir" and not os.path.isdir(options.task_dir):
    fail("env.options", "task_dir", options.task_dir,
         "task_source='dir' needs an existing directory of task directories or archives")


def _make(options: CodingOptions, config) -> coding.CodingEnv:
  return coding.CodingEnv(max_turns=config.max_turns,
                          max_observation_chars=config.max_observation_chars,
                          sandbox_limits=config.tool, isolation=common.isolation(config),
                          partial_reward=options.partial_reward)


SPEC = EnvironmentSpec(
    name="coding", make=_make, options=CodingOptions, check=_check,
    task_sources={
        "generator": lambda o, c: generator.iterate_generated(
            seed=c.seed, difficulty=o.difficulty, kind=o.bug_kind),
        "dir": lambda o, c: tasks.iterate_shuffled(coding_tasks.load_task_root(
            o.task_dir, allow_forgeable_grading=o.allow_forgeable_grading), seed=c.seed),
        # Rows pointing at task dirs/archives: another format than the shared "jsonl".
        "jsonl": lambda o, c: tasks.iterate_shuffled(coding_tasks.load_jsonl(
            c.jsonl_path, allow_forgeable_grading=o.allow_forgeable_grading), seed=c.seed),
    },
    demonstration=lambda task, o: generator.solution_actions(task))
