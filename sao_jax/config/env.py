"""Environments: which one, its options, which task source, their shared limits."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from sao_jax.config.checks import MAX_TIMEOUT_S, check_positive, check_timeout, fail
from sao_jax.config.dataset import DatasetConfig

ENV_JUDGES = ("rule", "http")
# The most tokens an HTTP judge may answer with (`sao_jax.envs.style.judge`): a verdict is
# ~15 tokens, and a response must not be able to talk the judge into writing until its
# deadline; raise it for a judge that reasons before its verdict.
JUDGE_MAX_TOKENS = 512
# Generated-task kinds: math problems, and the bugs planted in coding tasks
# ("mixed" draws one of the others per task).
ENV_PROBLEM_KINDS = ("arithmetic", "word", "mixed")
CODING_BUG_KINDS = ("off_by_one", "wrong_operator", "missing_edge_case", "wrong_value")
ENV_CODING_BUG_KINDS = CODING_BUG_KINDS + ("mixed",)
ENV_STYLES = ("academic", "cute", "chuunibyou", "classical")
# How tool code is isolated (`sao_jax.envs.sandbox`): "bwrap" = kernel namespaces,
# refused where they cannot be set up; "unisolated" = rlimits only (logged loudly).
SANDBOX_MODES = ("bwrap", "unisolated")
DEFAULT_SANDBOX = SANDBOX_MODES[0]
# The largest size limit in MiB whose bytes a kernel rlimit holds (a C long): beyond it the
# sandbox's setrlimit raised OverflowError and every tool run failed to start.
MAX_RLIMIT_MB = (2**63 - 1) >> 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxLimits:
  """Resource limits of one tool run (`sao_jax.envs.sandbox`; the `env.tool` section).
  Sizes in MiB / bytes, times in seconds."""

  wall_time_s: float = 10.0  # wall-clock limit of one tool run, seconds
  cpu_time_s: int = 5  # CPU-time limit of one tool run, seconds (RLIMIT_CPU)
  memory_mb: int = 1024  # address-space limit of one tool run, MiB (RLIMIT_AS)
  file_size_mb: int = 16  # largest file a tool run may write, MiB (RLIMIT_FSIZE)
  max_open_files: int = 64  # open file descriptors of a tool run (RLIMIT_NOFILE)
  max_output_bytes: int = 16384  # stdout + stderr bytes kept from a tool run
  # Each private tmpfs of a run (work directory, /tmp, /dev/shm) holds at most
  # disk_mb of data and max_files files, directories and links; their user xattrs
  # share the kernel's max_files KiB inode budget. The work directory also holds
  # the copy a coding episode starts from (at most 2000 entries); the coding
  # environment refuses less than a full grading copy needs (48 MiB with 4 KiB
  # pages, 4002 files).
  disk_mb: int = 64
  max_files: int = 4096  # files, directories and links per private tmpfs (see disk_mb)
  # Let the code import the caller's installed packages (e.g. sympy, numpy),
  # read-only. Off by default: the stdlib alone is the smaller surface.
  site_packages: bool = False

  def validate(self) -> None:
    check_timeout("env.tool", self, "wall_time_s")
    check_positive("env.tool", self, "cpu_time_s", "memory_mb", "file_size_mb", "max_open_files",
                   "max_output_bytes", "disk_mb", "max_files")
    # What the kernel's rlimits take (10**30 passed and then failed every tool run).
    if self.cpu_time_s > MAX_TIMEOUT_S:
      fail("env.tool", "cpu_time_s", self.cpu_time_s,
           f"at most {MAX_TIMEOUT_S} seconds (one week, MAX_TIMEOUT_S)")
    for name in ("memory_mb", "file_size_mb"):
      if getattr(self, name) > MAX_RLIMIT_MB:
        fail("env.tool", name, getattr(self, name),
             f"at most {MAX_RLIMIT_MB} MiB (what a kernel rlimit holds, MAX_RLIMIT_MB)")
    if self.max_open_files < 16:
      fail("env.tool", "max_open_files", self.max_open_files, "the interpreter needs at least 16")
    if self.max_files < 16:
      fail("env.tool", "max_files", self.max_files,
           "at least 16 (the sandbox's own mount points take a few)")
    if not isinstance(self.site_packages, bool):
      fail("env.tool", "site_packages", self.site_packages, "expected True or False")


# How env.latency draws the delay added to each environment step (sao_jax.sampler.latency):
# "none" adds nothing, "fixed" the same seconds every step, "lognormal" a long tail.
LATENCY_KINDS = ("none", "fixed", "lognormal")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepLatency:
  """Simulated tool latency for any environment (the `env.latency` section; semantics:
  `sao_jax.sampler.latency`): every environment step of a training rollout returns
  after an added delay, slept on its step thread (no CPU; other episodes go on
  decoding). Delays are drawn from a random stream per episode, seeded by the
  episode's seed, so a run's delays repeat; each is cut to `max_s`. The slow,
  long-tailed episodes of a rollout-bound run (docs/explanation/rollout-bound.md)."""

  kind: str = "none"  # one of LATENCY_KINDS: none, fixed or lognormal
  seconds: float = 1.0  # kind="fixed": every step's delay, seconds
  median_s: float = 1.0  # kind="lognormal": the median delay, seconds
  # kind="lognormal": standard deviation of the delay's log; the tail: with 1.0,
  # one step in 20 waits more than 5.2 x median_s.
  sigma: float = 1.0
  max_s: float = 60.0  # every delay is cut to this many seconds

  def validate(self) -> None:
    if self.kind not in LATENCY_KINDS:
      fail("env.latency", "kind", self.kind,
           f"allowed values are {', '.join(map(repr, LATENCY_KINDS))}")
    for name in ("seconds", "median_s", "sigma", "max_s"):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, (int, float))
          or not 0 <= value <= MAX_TIMEOUT_S):
        fail("env.latency", name, value, f"expected a finite number >= 0, at most "
             f"{MAX_TIMEOUT_S} (MAX_TIMEOUT_S)")
    if self.kind == "lognormal" and not self.median_s > 0:
      fail("env.latency", "median_s", self.median_s, "a log-normal delay needs a median > 0 "
           "seconds; for no delay set env.latency.kind=none")
    if self.kind != "none" and not self.max_s > 0:
      fail("env.latency", "max_s", self.max_s, "expected the largest delay in seconds, > 0")
    if self.kind == "fixed" and self.seconds > self.max_s:
      fail("env.latency", "seconds", self.seconds, f"more than env.latency.max_s={self.max_s}, "
           "which cuts every delay: raise max_s or lower seconds")


# Defaults the built-in options share with their deprecated EnvConfig spellings.
DEFAULT_DIFFICULTY = 2
DEFAULT_STYLE_SCHEDULE = ((0, "academic"), (200, "cute"), (400, "chuunibyou"))
# Deprecated EnvConfig fields -> the option of the built-in environment they moved to
# (`env.options.<name>`; `sao_jax.envs.registry.merged_options` carries them over with a
# warning, for the environment whose options have that name).
LEGACY_OPTIONS = {
    "difficulty": "difficulty", "problem_kind": "problem_kind",
    "demo_tool_rate": "demo_tool_rate", "demo_guess_rate": "demo_guess_rate",
    "coding_bug_kind": "bug_kind", "coding_task_dir": "task_dir",
    "coding_partial_reward": "partial_reward", "style_schedule": "schedule",
    "judge": "judge", "judge_base_url": "judge_base_url", "judge_model": "judge_model",
    "judge_api_key_env": "judge_api_key_env", "judge_timeout_s": "judge_timeout_s",
    "judge_retries": "judge_retries", "judge_max_tokens": "judge_max_tokens",
}


class Options(dict):
  """`env.options`: a mapping that hashes by its contents, so a `Config` holding it
  stays hashable (jitted steps take the config as a static argument). Treat it as
  read-only: a config is frozen, and its hash must not change."""

  def __hash__(self) -> int:  # type: ignore[override]
    return hash(json.dumps(self, sort_keys=True, default=repr))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvConfig:
  """Which environment and task source, and what every environment shares
  (semantics: `sao_jax.envs`; how `name` resolves: `sao_jax.envs.registry`).

  `name`: a built-in ("math_tool", "style", "coding", "sanity", "single_turn"),
  an installed plugin's entry-point name, or an import path
  "package.module:attribute". `options`: that environment's own options (its
  options dataclass's fields; `--set env.options.FIELD=VALUE`). The fields
  after `reward_timeout_s` are deprecated spellings of built-in options
  (`LEGACY_OPTIONS`), with the options' defaults.
  """

  # The environment: a built-in name, an installed plugin's entry-point name, or an
  # import path "package.module:attribute" (sao_jax.envs.registry).
  name: str = "math_tool"
  # The environment's own options (its options dataclass's fields), e.g.
  # --set env.options.difficulty=3; validated against the environment at start-up
  # (sao_jax.envs.registry.check).
  options: dict[str, Any] = dataclasses.field(default_factory=dict)
  task_source: str = ""  # "" = the environment's default (its first task source).
  jsonl_path: str = ""  # task_source="jsonl" (coding: rows pointing at task dirs/archives).
  # task_source in DATASET_SOURCES ("parquet", "hf_disk"): the file and its column mapping.
  dataset: DatasetConfig = dataclasses.field(default_factory=DatasetConfig)
  seed: int = 0  # seed of the task generator and shuffling
  max_turns: int = 8  # Assistant turns per episode (style and single_turn: always one).
  # Characters of one observation kept (longer tool output is cut).
  max_observation_chars: int = 4096
  # Python tool sandbox (math_tool; coding's run_tests, python and grading; plugins).
  tool: SandboxLimits = dataclasses.field(default_factory=SandboxLimits)
  sandbox: str = DEFAULT_SANDBOX  # tool isolation, one of SANDBOX_MODES: bwrap or unisolated
  # One environment step's wall-time bound (a tool run, a judge's verdict with its
  # retries): past it the episode fails as StepTimeout (sao_jax.sampler.env_steps). 0: none.
  step_timeout_s: float = 300.0
  # "package.module:function" grading each episode's last turn in place of the
  # environment's reward (`sao_jax.envs.rewards`); "" = the environment's own reward.
  reward_fn: str = ""
  reward_timeout_s: float = 30.0  # per call of reward_fn; past it the episode fails
  # How reward_fn is called (sao_jax.envs.rewards.CONVENTIONS): "auto" reads its signature
  # (verl's compute_score(data_source, solution_str, ground_truth, extra_info) when it has
  # a `solution_str` parameter), "sao" reward(response, task, messages), "verl" verl's.
  reward_fn_convention: str = "auto"
  # Delay added to every environment step of training rollouts, any environment
  # (StepLatency, sao_jax.sampler.latency): e.g. --set env.latency.kind=lognormal.
  latency: StepLatency = dataclasses.field(default_factory=StepLatency)
  # Deprecated (LEGACY_OPTIONS): write env.options.<option> instead. A value other
  # than the default is carried over to the option (the defaults are the options').
  difficulty: int = DEFAULT_DIFFICULTY  # deprecated: env.options.difficulty
  problem_kind: str = "mixed"  # deprecated: env.options.problem_kind (math_tool)
  demo_tool_rate: float = 1.0  # deprecated: env.options.demo_tool_rate (math_tool)
  demo_guess_rate: float = 0.0  # deprecated: env.options.demo_guess_rate (math_tool)
  coding_bug_kind: str = "mixed"  # deprecated: env.options.bug_kind (coding)
  coding_task_dir: str = ""  # deprecated: env.options.task_dir (coding)
  coding_partial_reward: bool = False  # deprecated: env.options.partial_reward (coding)
  # deprecated: env.options.schedule (style)
  style_schedule: tuple[tuple[int, str], ...] = DEFAULT_STYLE_SCHEDULE
  judge: str = "rule"  # deprecated: env.options.judge (style)
  judge_base_url: str = ""  # deprecated: env.options.judge_base_url (style)
  judge_model: str = ""  # deprecated: env.options.judge_model (style)
  judge_api_key_env: str = ""  # deprecated: env.options.judge_api_key_env (style)
  judge_timeout_s: float = 30.0  # deprecated: env.options.judge_timeout_s (style)
  judge_retries: int = 2  # deprecated: env.options.judge_retries (style)
  judge_max_tokens: int = JUDGE_MAX_TOKENS  # deprecated: env.options.judge_max_tokens (style)

  def __post_init__(self):
    if isinstance(self.options, Mapping) and not isinstance(self.options, Options):
      object.__setattr__(self, "options", Options(self.options))  # hashable (Options)

  def validate(self) -> None:
    """The shared fields, what the config itself can know. The environment's own
    (its name, options, task source and reward function) only the environment's
    code can check: `sao_jax.envs.registry.check` does, when a job starts
    (`sao_jax.jobs.startup`), before any sampler starts or anything compiles."""
    if not isinstance(self.name, str) or not self.name:
      fail("env", "name", self.name, "expected an environment name or an import path "
           "'package.module:attribute'")
    if not isinstance(self.options, Mapping):
      fail("env", "options", self.options, "expected a mapping of option names to values")
    if self.task_source == "jsonl" and not os.path.isfile(self.jsonl_path):
      fail("env", "jsonl_path", self.jsonl_path, "task_source='jsonl' needs an existing JSONL file")
    if not isinstance(self.dataset, DatasetConfig):
      fail("env", "dataset", self.dataset, "expected a DatasetConfig (sao_jax.config.dataset)")
    check_positive("env", self, "max_turns", "max_observation_chars")
    check_timeout("env", self, "step_timeout_s", zero_is_none=True)
    if not isinstance(self.tool, SandboxLimits):
      fail("env", "tool", self.tool, "expected a SandboxLimits (sao_jax.config.env)")
    self.tool.validate()
    if not isinstance(self.latency, StepLatency):
      fail("env", "latency", self.latency, "expected a StepLatency (sao_jax.config.env)")
    self.latency.validate()
    if self.latency.kind != "none" and self.step_timeout_s and (
        self.latency.max_s >= self.step_timeout_s):
      fail("env.latency", "max_s", self.latency.max_s, f"the added delay alone would reach "
           f"env.step_timeout_s={self.step_timeout_s} and fail the step: keep max_s below it, "
           "or raise step_timeout_s")
    if self.sandbox not in SANDBOX_MODES:
      fail("env", "sandbox", self.sandbox,
           f"allowed values are {', '.join(map(repr, SANDBOX_MODES))}")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int):
      fail("env", "seed", self.seed, "expected an integer")
    if not isinstance(self.reward_fn, str):
      fail("env", "reward_fn", self.reward_fn, "expected '' or 'package.module:function'")
    check_timeout("env", self, "reward_timeout_s")
    check_timeout("env", self, "judge_timeout_s")  # deprecated, still carried over
