"""Environments and task sources by name, built from an `EnvConfig`.

    env = make_env(config)        # a fresh Environment (one per concurrent episode)
    tasks = make_tasks(config)    # an endless iterator of Task

Environments: "math_tool" (`math.tool.MathToolEnv`), "style"
(`style.env.StyleEnv`), "coding" (`coding.env.CodingEnv`) and "sanity"
(`sanity.SanityEnv`, generated tasks only). Task sources (the first
is the default when `task_source` is empty): for math_tool "generator" (seeded
`math.tasks.generate_task`), "jsonl", "parquet" or "hf_disk" (rows of the
`env.dataset` file, `dataset_tasks`); for style "builtin"
(`style.env.builtin_task`) or "jsonl"; for coding "generator" (seeded
`coding.generator.generate_task`), "dir" (`coding.tasks.load_task_root` of
`coding_task_dir`) or "jsonl" (`coding.tasks.load_jsonl`, a different row
format from the other two). Loaded tasks come back in a fresh seeded order
each epoch.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Iterator

from sao_jax.envs import dataset_tasks, sanity, tasks
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.coding import tasks as coding_tasks
from sao_jax.envs.math import tasks as math_tasks
from sao_jax.envs.math import tool as math_tool
from sao_jax.envs.style import env as style
from sao_jax.envs.style import judge
from sao_jax.envs.base import Environment, Task
from sao_jax.config import EnvConfig
from sao_jax.config.dataset import DATASET_SOURCES


@functools.cache
def _warn_unisolated() -> None:
  """Once per process, loudly: tool code runs without kernel isolation."""
  logging.getLogger(__name__).warning(
      "env.sandbox='unisolated': model-written code runs WITHOUT kernel isolation, as this "
      "process's user, with only resource limits. Only for trusted policies; install "
      "bubblewrap and use env.sandbox='bwrap' otherwise.")


def _isolation(config: EnvConfig) -> str:
  if config.sandbox == "unisolated":
    _warn_unisolated()
  return config.sandbox


def _math_env(config: EnvConfig) -> Environment:
  return math_tool.MathToolEnv(max_turns=config.max_turns,
                               max_observation_chars=config.max_observation_chars,
                               sandbox_limits=config.tool, isolation=_isolation(config))


def _coding_env(config: EnvConfig) -> Environment:
  return coding.CodingEnv(max_turns=config.max_turns,
                          max_observation_chars=config.max_observation_chars,
                          sandbox_limits=config.tool, isolation=_isolation(config),
                          partial_reward=config.coding_partial_reward)


def _style_env(config: EnvConfig) -> Environment:
  grader = style.rule_judge
  if config.judge == "http":
    grader = judge.HttpJudge(base_url=config.judge_base_url, model=config.judge_model,
                             api_key_env=config.judge_api_key_env,
                             timeout_s=config.judge_timeout_s, retries=config.judge_retries,
                             max_tokens=config.judge_max_tokens)
  return style.StyleEnv(schedule=style.StyleSchedule(config.style_schedule), judge=grader,
                        max_observation_chars=config.max_observation_chars)


# The names are `config.env.ENV_TASK_SOURCES` (validated there); these tables
# say how to build each.
ENVIRONMENTS: dict[str, Callable[[EnvConfig], Environment]] = {
    "math_tool": _math_env,
    "style": _style_env,
    "coding": _coding_env,
    "sanity": lambda c: sanity.SanityEnv(max_observation_chars=c.max_observation_chars),
}

TASK_SOURCES: dict[str, dict[str, Callable[[EnvConfig], Iterator[Task]]]] = {
    "math_tool": {
        "generator": lambda c: math_tasks.iterate_generated(
            seed=c.seed, difficulty=c.difficulty, kind=c.problem_kind),
        "jsonl": lambda c: tasks.iterate_shuffled(tasks.load_jsonl(c.jsonl_path), seed=c.seed),
        **{source: lambda c, s=source: dataset_tasks.iterate_shuffled(
            dataset_tasks.TaskTable(c.dataset, s), seed=c.seed) for source in DATASET_SOURCES},
    },
    "style": {
        "builtin": lambda c: style.iterate_builtin(seed=c.seed),
        "jsonl": lambda c: tasks.iterate_shuffled(tasks.load_jsonl(c.jsonl_path), seed=c.seed),
    },
    "coding": {
        "generator": lambda c: coding_generator.iterate_generated(
            seed=c.seed, difficulty=c.difficulty, kind=c.coding_bug_kind),
        "dir": lambda c: tasks.iterate_shuffled(coding_tasks.load_task_root(
            c.coding_task_dir, allow_forgeable_grading=c.allow_forgeable_grading), seed=c.seed),
        "jsonl": lambda c: tasks.iterate_shuffled(coding_tasks.load_jsonl(
            c.jsonl_path, allow_forgeable_grading=c.allow_forgeable_grading), seed=c.seed),
    },
    "sanity": {"generator": lambda c: sanity.iterate_generated(seed=c.seed)},
}

# Scripted ideal turns per environment ((task, env config) -> the assistant turns
# that earn full reward): what the SFT warm-start (`sao_jax.warm_start`) imitates
# and a run's own tokenizer is trained on.
DEMONSTRATIONS: dict[str, Callable[[Task, EnvConfig], list[str]]] = {
    "math_tool": lambda task, c: math_tasks.demonstration(task, c.demo_tool_rate,
                                                             c.demo_guess_rate),
    "coding": lambda task, c: coding_generator.solution_actions(task),
    "style": lambda task, c: style.demonstration(task),
    "sanity": lambda task, c: sanity.demonstration(task),
}


def make_env(config: EnvConfig) -> Environment:
  """A new environment named by `config.name`."""
  config.validate()
  return ENVIRONMENTS[config.name](config)


def make_tasks(config: EnvConfig) -> Iterator[Task]:
  """An endless task iterator for `config.name` from `config.task_source`."""
  config.validate()
  return TASK_SOURCES[config.name][config.resolved_task_source](config)
