"""Environments by name, plugin or import path, built from an `EnvConfig`.

    env = make_env(config)        # a fresh Environment (one per concurrent episode)
    tasks = make_tasks(config)    # an endless iterator of Task
    tasks = make_tasks(config, start=k)  # the same stream from its k-th task on
    check_tasks(config)           # every row of a file task source read and checked
    demo = demonstration(config)  # task -> scripted assistant turns, or None

`env.name` resolves to an `EnvironmentSpec` (`base`) by one path for every
environment, the built-ins included:

1. a name maps to an import path: the built-ins' (`BUILTIN_ENVIRONMENTS`), or
   an installed package's entry point in the group `ENTRY_POINT_GROUP`
   (`[project.entry-points."sao_jax.environments"] my_env = "my_pkg.env:SPEC"`);
   a name that is itself an import path (`package.module:attribute`) is used as one;
2. the path is imported (`plugins.load_object`);
3. the object is an `EnvironmentSpec`, or a function of no arguments returning one
   (a factory, called once per process).

Then `env.options` (plus deprecated `EnvConfig` spellings, `LEGACY_OPTIONS`) is
checked against the spec's options dataclass (`options.build_options`), the
task source against the spec's (`task_sources`: its own, then `SHARED_TASK_SOURCES`
for every environment that does not define them itself: "jsonl" rows of
`env.jsonl_path` (`tasks.load_jsonl`), "parquet" and "hf_disk" rows of
`env.dataset` (`dataset_tasks`)), and `env.reward_fn` is imported and must be
callable (`rewards`). `check(config)` runs all of this after `EnvConfig.validate()`
(the fields the config itself can check), and every job calls it at start-up
(`sao_jax.jobs.startup`), so a plugin that does not import, an object that is not
an environment, bad options or a bad reward function are refused before any
sampler starts or anything compiles. Loaded tasks come back in a fresh seeded
order each epoch. `check_tasks` reads every row of the shared file sources ("jsonl":
the whole file, as a sampler loads it; "parquet", "hf_disk": `dataset_tasks.check_rows`),
so a bad row is refused, naming file, row and column, before a run starts
(`jobs.startup.check`). A stream starts at any position (`make_tasks(start=k)`, what a
restarted sampler continues from): the shared sources seek to it, an environment's
own source is advanced by drawing k tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from typing import Any, Callable, Iterator

from sao_jax.config.dataset import DATASET_SOURCES
from sao_jax.config.env import LEGACY_OPTIONS, EnvConfig
from sao_jax.envs import dataset_tasks, plugins, rewards, tasks
from sao_jax.envs.base import Environment, EnvironmentSpec, Task
from sao_jax.envs.common import _warn_unisolated  # noqa: F401  (tests clear its once-cache)
from sao_jax.envs.options import build_options

ENTRY_POINT_GROUP = "sao_jax.environments"
# The built-in environments: names for import paths, exactly as an entry point gives them.
BUILTIN_ENVIRONMENTS = {
    "math_tool": "sao_jax.envs.math.spec:SPEC",
    "style": "sao_jax.envs.style.spec:SPEC",
    "coding": "sao_jax.envs.coding.spec:SPEC",
    "sanity": "sao_jax.envs.sanity:SPEC",
    "single_turn": "sao_jax.envs.single_turn:SPEC",
    "agent": "sao_jax.envs.agent.spec:SPEC",
}

# (options, config, start position) -> the stream from that position.
SHARED_TASK_SOURCES: dict[str, Callable[[Any, EnvConfig, int], Iterator[Task]]] = {
    "jsonl": lambda options, c, start: tasks.iterate_shuffled(
        tasks.load_jsonl(c.jsonl_path), seed=c.seed, start=start),
    **{source: lambda options, c, start, s=source: dataset_tasks.iterate_shuffled(
        dataset_tasks.TaskTable(c.dataset, s), seed=c.seed, start=start)
       for source in DATASET_SOURCES},
}
_REQUIRED = ("name", "make", "options", "task_sources")  # what an EnvironmentSpec has


def known_names() -> dict[str, str]:
  """Environment names -> import paths: the built-ins, then installed entry points."""
  names = dict(BUILTIN_ENVIRONMENTS)
  for name, paths in plugins.entry_points(ENTRY_POINT_GROUP).items():
    names.setdefault(name, paths[0])
  return names


def _import_path(name: str) -> str:
  if plugins.is_import_path(name):
    return name
  paths = list(plugins.entry_points(ENTRY_POINT_GROUP).get(name, ()))
  if name in BUILTIN_ENVIRONMENTS:
    paths = [BUILTIN_ENVIRONMENTS[name]] + [p for p in paths if p != BUILTIN_ENVIRONMENTS[name]]
    if len(paths) > 1:
      raise ValueError(f"env.name={name!r} is a built-in environment, and an installed package "
                       f"registers {paths[1]!r} under the same name in {ENTRY_POINT_GROUP}; "
                       f"rename the plugin's entry point or name it by import path")
  if not paths:
    raise ValueError(f"env.name={name!r} is invalid: known environments are "
                     f"{', '.join(map(repr, known_names()))} (built-in, or installed with an "
                     f"entry point in {ENTRY_POINT_GROUP!r}); or name one by import path, "
                     "'package.module:attribute'")
  if len(paths) > 1:
    raise ValueError(f"env.name={name!r}: installed packages register it more than once in "
                     f"{ENTRY_POINT_GROUP} ({', '.join(map(repr, paths))}); uninstall one or "
                     "name the environment by import path")
  return paths[0]


@functools.cache
def load_spec(name: str) -> EnvironmentSpec:
  """The `EnvironmentSpec` `env.name=name` resolves to (module docstring)."""
  path = _import_path(name)
  value = plugins.load_object(path, what=f"env.name={name!r}" + (
      f" ({path})" if path != name else ""))
  if callable(value) and not isinstance(value, (EnvironmentSpec, type)):
    try:
      value = value()
    except Exception as error:  # user code
      raise ValueError(f"env.name={name!r}: the factory {path} raised "
                       f"{type(error).__name__}: {error}") from error
  if isinstance(value, type) and issubclass(value, Environment):
    raise ValueError(f"env.name={name!r}: {path} is an Environment class, not an environment "
                     "spec; export sao_jax.envs.base.EnvironmentSpec(name=..., make=lambda "
                     "options, config: YourEnv(...), ...) and name that")
  if not isinstance(value, EnvironmentSpec):
    missing = [field for field in _REQUIRED if not hasattr(value, field)]
    raise ValueError(f"env.name={name!r}: {path} is a {type(value).__name__}, not an "
                     "environment: expected a sao_jax.envs.base.EnvironmentSpec (or a function "
                     "of no arguments returning one)"
                     + (f"; it has no {', '.join(missing)}" if missing else ""))
  if not callable(value.make):
    raise ValueError(f"env.name={name!r}: {path}.make is not callable")
  return value


def task_sources(spec: EnvironmentSpec) -> dict[str, Callable[..., Iterator[Task]]]:
  """The task sources `spec` accepts, its own first (the first is the default); the
  shared ones take the start position too (`make_tasks`)."""
  return {**spec.task_sources,
          **{name: build for name, build in SHARED_TASK_SOURCES.items()
             if name not in spec.task_sources}}


@dataclasses.dataclass(frozen=True)
class Resolved:
  """What `env` resolves to: the spec, its options, the task source, the reward function."""

  spec: EnvironmentSpec
  options: Any
  task_source: str
  reward_fn: Callable[..., Any] | None


@functools.cache
def _legacy_warning(old: str, new: str) -> None:
  logging.getLogger(__name__).warning(
      f"env.{old} is deprecated: write env.options.{new} (e.g. --set env.options.{new}=...); "
      "the old spelling will be removed")


def merged_options(config: EnvConfig, spec: EnvironmentSpec) -> dict[str, Any]:
  """`config.options` plus what deprecated fields set, for the options `spec` has."""
  fields = {f.name for f in dataclasses.fields(spec.options)} if dataclasses.is_dataclass(
      spec.options) else set()
  options = dict(config.options)
  defaults = {f.name: f.default for f in dataclasses.fields(config)}
  for old, new in LEGACY_OPTIONS.items():
    value = getattr(config, old)
    if value == defaults[old] or new not in fields:
      continue  # unset, or an option of another environment (ignored, as it always was)
    _legacy_warning(old, new)
    if new in options and options[new] != value:
      raise ValueError(f"env.{old}={value!r} (deprecated) and env.options.{new}="
                       f"{options[new]!r} disagree; keep only env.options.{new}")
    options[new] = value
  return options


def resolve(config: EnvConfig) -> Resolved:
  """Checks everything environment-specific in `config` (module docstring)."""
  spec = load_spec(config.name)
  options = build_options(spec, merged_options(config, spec))
  sources = task_sources(spec)
  source = config.task_source or next(iter(spec.task_sources), "")
  if not source:
    raise ValueError(f"env.task_source='' is invalid: environment {spec.name!r} has no task "
                     f"generator; set env.task_source to one of {', '.join(map(repr, sources))}")
  if source not in sources:
    raise ValueError(f"env.task_source={source!r} is invalid: {spec.name!r} accepts "
                     f"{', '.join(map(repr, sources))}")
  if source in DATASET_SOURCES:
    dataset_tasks.check_columns(config.dataset, source)
  if source == "jsonl" and not config.jsonl_path:
    raise ValueError("env.jsonl_path='' is invalid: task_source='jsonl' needs an existing "
                     "JSONL file")
  if spec.check is not None:
    try:
      spec.check(options, config)
    except ValueError as error:
      raise ValueError(f"environment {spec.name!r}: {error}") from None
  rewards.check_convention(config.reward_fn_convention)
  reward_fn = (rewards.load_reward_fn(config.reward_fn, config.reward_fn_convention)
               if config.reward_fn else None)
  return Resolved(spec, options, source, reward_fn)


def check(config: EnvConfig) -> Resolved:
  """`config` checked whole: its own fields (`EnvConfig.validate`), then everything
  environment-specific (`resolve`); what it resolves to."""
  config.validate()
  return resolve(config)


def describe(config: EnvConfig) -> str:
  """How failure texts name `config`'s environment: its name, the import path it
  resolves to (the plugin's module) and the reward function grading it, e.g.
  "'echo' (my_pkg.env:SPEC) graded by env.reward_fn='my_pkg.score:reward'"."""
  path = _import_path(config.name)
  text = repr(config.name) + (f" ({path})" if path != config.name else "")
  return text + (f" graded by env.reward_fn={config.reward_fn!r}" if config.reward_fn else "")


def make_env(config: EnvConfig) -> Environment:
  """A new environment named by `config.name`, graded by `config.reward_fn` if set."""
  resolved = check(config)
  env = resolved.spec.make(resolved.options, config)
  if not isinstance(env, Environment):
    raise ValueError(f"env.name={config.name!r}: make() returned a {type(env).__name__}, not a "
                     "sao_jax.envs.base.Environment")
  if resolved.reward_fn is not None:
    env = rewards.RewardFnEnv(env, resolved.reward_fn, path=config.reward_fn,
                              timeout_s=config.reward_timeout_s)
  return env


def make_tasks(config: EnvConfig, *, start: int = 0) -> Iterator[Task]:
  """An endless task iterator for `config.name` from its task source, from its task
  number `start` on (module docstring)."""
  resolved = check(config)
  own = resolved.spec.task_sources.get(resolved.task_source)
  if own is None:  # a shared source: it seeks
    return SHARED_TASK_SOURCES[resolved.task_source](resolved.options, config, start)
  return itertools.islice(own(resolved.options, config), start, None)


def check_tasks(config: EnvConfig) -> None:
  """ValueError naming a bad row of `config`'s shared file task source, after reading
  every row (module docstring); other sources are made as they are served."""
  source = resolve(config).task_source
  if source in DATASET_SOURCES:
    dataset_tasks.check_rows(config.dataset, source)
  elif source == "jsonl":
    tasks.load_jsonl(config.jsonl_path)


def demonstration(config: EnvConfig) -> Callable[[Task], list[str]] | None:
  """Scripted ideal assistant turns per task for `config`'s environment (what the SFT
  warm-start imitates and a run's own tokenizer is trained on), or None if it has none."""
  resolved = check(config)
  if resolved.spec.demonstration is None:
    return None
  demo, options = resolved.spec.demonstration, resolved.options
  return lambda task: demo(task, options)
