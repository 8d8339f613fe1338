"""Environments: which one, which task source, their limits."""

from __future__ import annotations

import dataclasses
import os

from sao_jax.config.checks import check_positive, fail
from sao_jax.config.dataset import DATASET_SOURCES, DatasetConfig

# Task sources each environment accepts; the first is the default.
ENV_TASK_SOURCES = {"math_tool": ("generator", "jsonl") + DATASET_SOURCES,
                    "style": ("builtin", "jsonl"),
                    "coding": ("generator", "dir", "jsonl"), "sanity": ("generator",)}
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxLimits:
  """Resource limits of one tool run (`sao_jax.envs.sandbox`; the `env.tool` section).
  Sizes in MiB / bytes, times in seconds."""

  wall_time_s: float = 10.0
  cpu_time_s: int = 5
  memory_mb: int = 1024
  file_size_mb: int = 16
  max_open_files: int = 64
  max_output_bytes: int = 16384
  # Each private tmpfs of a run (work directory, /tmp, /dev/shm) holds at most
  # disk_mb of data and max_files files, directories and links; their user xattrs
  # share the kernel's max_files KiB inode budget. The work directory also holds
  # the copy a coding episode starts from (at most 2000 entries); the coding
  # environment refuses less than a full grading copy needs (48 MiB with 4 KiB
  # pages, 4002 files).
  disk_mb: int = 64
  max_files: int = 4096
  # Let the code import the caller's installed packages (e.g. sympy, numpy),
  # read-only. Off by default: the stdlib alone is the smaller surface.
  site_packages: bool = False

  def validate(self) -> None:
    if isinstance(self.wall_time_s, bool) or not isinstance(self.wall_time_s, (int, float)) or (
        not self.wall_time_s > 0):
      fail("env.tool", "wall_time_s", self.wall_time_s, "expected a number of seconds > 0")
    check_positive("env.tool", self, "cpu_time_s", "memory_mb", "file_size_mb", "max_open_files",
                   "max_output_bytes", "disk_mb", "max_files")
    if self.max_open_files < 16:
      fail("env.tool", "max_open_files", self.max_open_files, "the interpreter needs at least 16")
    if self.max_files < 16:
      fail("env.tool", "max_files", self.max_files,
           "at least 16 (the sandbox's own mount points take a few)")
    if not isinstance(self.site_packages, bool):
      fail("env.tool", "site_packages", self.site_packages, "expected True or False")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvConfig:
  """Which environment and task source, and their limits (semantics: `sao_jax.envs`).

  The names accepted for `name` and `task_source` are defined here
  (`ENV_TASK_SOURCES`); `sao_jax.envs.registry` builds each of them.
  """

  name: str = "math_tool"
  task_source: str = ""  # "" = the environment's default (first in ENV_TASK_SOURCES).
  jsonl_path: str = ""  # task_source="jsonl" (coding: rows pointing at task dirs/archives).
  # task_source in DATASET_SOURCES ("parquet", "hf_disk"): the file and its column mapping.
  dataset: DatasetConfig = dataclasses.field(default_factory=DatasetConfig)
  seed: int = 0
  max_turns: int = 8  # Assistant turns per episode (style is always single-turn).
  max_observation_chars: int = 4096
  # Generated tasks (math_tool and coding).
  difficulty: int = 2  # 1..5
  problem_kind: str = "mixed"  # math_tool
  # math_tool: the share of SFT demonstrations that call the tool; the rest answer
  # at once without it (the demo's warm-start, so RL has a strategy to find).
  demo_tool_rate: float = 1.0
  # math_tool: the share of SFT demonstrations from a careless expert who guesses the
  # question's first number without the tool (imperfect data that only RL can correct).
  demo_guess_rate: float = 0.0
  coding_bug_kind: str = "mixed"  # coding
  # Coding: a directory of task dirs/archives (task_source="dir"), and the reward
  # shape (False: 1 iff every hidden test passes; True: the fraction that pass).
  coding_task_dir: str = ""
  coding_partial_reward: bool = False
  # Python tool sandbox (math_tool; coding's run_tests, python and grading).
  tool: SandboxLimits = dataclasses.field(default_factory=SandboxLimits)
  sandbox: str = DEFAULT_SANDBOX  # One of SANDBOX_MODES.
  # Style environment: (first policy version, style) phases, and the judge. The
  # sampler's policy version counts policy updates (= learner steps after critic warm-up).
  style_schedule: tuple[tuple[int, str], ...] = ((0, "academic"), (200, "cute"),
                                                 (400, "chuunibyou"))
  judge: str = "rule"
  judge_base_url: str = ""
  judge_model: str = ""
  judge_api_key_env: str = ""  # Name of the variable holding the key; "" = no auth.
  judge_timeout_s: float = 30.0  # one deadline per verdict: connect, reads and retries together
  judge_retries: int = 2
  judge_max_tokens: int = JUDGE_MAX_TOKENS
  # One environment step's wall-time bound (a tool run, a judge's verdict with its
  # retries): past it the episode fails as StepTimeout (sao_jax.sampler.env_steps). 0: none.
  step_timeout_s: float = 300.0

  @property
  def resolved_task_source(self) -> str:
    """`task_source`, or the environment's default when it is empty."""
    return self.task_source or ENV_TASK_SOURCES.get(self.name, ("",))[0]

  def validate(self) -> None:
    if self.name not in ENV_TASK_SOURCES:
      fail("env", "name", self.name, f"known environments are {', '.join(map(repr, ENV_TASK_SOURCES))}")
    sources = ENV_TASK_SOURCES[self.name]
    if self.task_source and self.task_source not in sources:
      fail("env", "task_source", self.task_source,
            f"{self.name!r} accepts {', '.join(map(repr, sources))}")
    if self.resolved_task_source == "jsonl" and not os.path.isfile(self.jsonl_path):
      fail("env", "jsonl_path", self.jsonl_path, "task_source='jsonl' needs an existing JSONL file")
    if not isinstance(self.dataset, DatasetConfig):
      fail("env", "dataset", self.dataset, "expected a DatasetConfig (sao_jax.config.dataset)")
    if self.resolved_task_source in DATASET_SOURCES:
      self.dataset.validate(self.resolved_task_source)
    if self.resolved_task_source == "dir" and not os.path.isdir(self.coding_task_dir):
      fail("env", "coding_task_dir", self.coding_task_dir,
           "task_source='dir' needs an existing directory of task directories or archives")
    check_positive("env", self, "max_turns", "max_observation_chars")
    timeout = self.step_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
      fail("env", "step_timeout_s", timeout, "expected seconds >= 0 (0: no timeout)")
    for field in ("demo_tool_rate", "demo_guess_rate"):
      rate = getattr(self, field)
      if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        fail("env", field, rate, "expected a number in [0, 1]")
    if not isinstance(self.tool, SandboxLimits):
      fail("env", "tool", self.tool, "expected a SandboxLimits (sao_jax.config.env)")
    self.tool.validate()
    if self.sandbox not in SANDBOX_MODES:
      fail("env", "sandbox", self.sandbox,
           f"allowed values are {', '.join(map(repr, SANDBOX_MODES))}")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int):
      fail("env", "seed", self.seed, "expected an integer")
    if isinstance(self.difficulty, bool) or self.difficulty not in range(1, 6):
      fail("env", "difficulty", self.difficulty, "expected an integer in 1..5")
    if self.problem_kind not in ENV_PROBLEM_KINDS:
      fail("env", "problem_kind", self.problem_kind,
            f"allowed values are {', '.join(map(repr, ENV_PROBLEM_KINDS))}")
    if self.coding_bug_kind not in ENV_CODING_BUG_KINDS:
      fail("env", "coding_bug_kind", self.coding_bug_kind,
           f"allowed values are {', '.join(map(repr, ENV_CODING_BUG_KINDS))}")
    if not isinstance(self.coding_partial_reward, bool):
      fail("env", "coding_partial_reward", self.coding_partial_reward, "expected True or False")
    value = self.judge_timeout_s
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
      fail("env", "judge_timeout_s", value, "expected a number of seconds > 0")
    if isinstance(self.judge_retries, bool) or not isinstance(self.judge_retries, int) or (
        self.judge_retries < 0):
      fail("env", "judge_retries", self.judge_retries, "expected an integer >= 0")
    value = self.judge_max_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      fail("env", "judge_max_tokens", value, "expected an integer >= 1 (tokens the judge may "
           "answer with; raise it for a judge that reasons before its verdict)")
    self._validate_style()

  def _validate_style(self) -> None:
    schedule = self.style_schedule
    if (not schedule or not all(isinstance(p, tuple) and len(p) == 2 for p in schedule)
        or schedule[0][0] != 0):
      fail("env", "style_schedule", schedule, "expected ((0, style), (step, style), ...) starting at 0")
    steps = [step for step, _ in schedule]
    if any(isinstance(s, bool) or not isinstance(s, int) for s in steps) or (
        steps != sorted(set(steps))):
      fail("env", "style_schedule", schedule, "steps must be integers in strictly increasing order")
    for _, style in schedule:
      if style not in ENV_STYLES:
        fail("env", "style_schedule", schedule,
              f"unknown style {style!r}; styles are {', '.join(map(repr, ENV_STYLES))}")
    if self.judge not in ENV_JUDGES:
      fail("env", "judge", self.judge, f"allowed values are {', '.join(map(repr, ENV_JUDGES))}")
    if self.judge == "http":
      if not self.judge_base_url.startswith(("http://", "https://")):
        fail("env", "judge_base_url", self.judge_base_url,
              "judge='http' needs an http(s) URL such as 'http://127.0.0.1:8000/v1'")
      if not self.judge_model:
        fail("env", "judge_model", self.judge_model, "judge='http' needs the model name to request")
