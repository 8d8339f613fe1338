"""The "agent" environment: `env.name="agent"`, its options and their checks.

    --set env.name=agent --set env.options.program=my_agent:run --set env.task_source=jsonl

Tasks come from the shared task sources (`env.task_source` "jsonl", "parquet" or
"hf_disk"); the options below are the endpoint's one config section (bind address,
limits) and the program's time limit (docs/reference/agent-endpoint.md).
"""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_positive, check_timeout, fail
from sao_jax.config.env import EnvConfig
from sao_jax.envs.agent.env import AgentEnv
from sao_jax.envs.agent.server import Limits
from sao_jax.envs.base import EnvironmentSpec

LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentOptions:
  """`env.options` of the agent environment."""

  # What runs once per task: "package.module:function" (called as function(task,
  # base_url, api_key)) or a command line (OPENAI_BASE_URL / OPENAI_API_KEY set).
  program: str
  # Wall-clock seconds an episode's program may run before it is failed as AgentTimeout.
  time_limit_s: float = 120.0
  # Where the endpoint listens: loopback by default; another address needs
  # allow_remote=True (the episode keys are bearer tokens sent in the clear).
  host: str = "127.0.0.1"
  port: int = 0  # 0: a free port, given to each program as OPENAI_BASE_URL
  allow_remote: bool = False  # permit a host that is not loopback
  max_sessions: int = 256  # agent episodes open at once in one sampler process
  max_body_bytes: int = 4 * 2**20  # of one request body; larger ones get 413
  max_messages: int = 256  # messages in one call; more get 400
  model_name: str = "policy"  # the model id /v1/models lists

  def validate(self) -> None:
    if not self.program.strip():
      fail("env.options", "program", self.program,
           "an import path 'package.module:function' or a command line")
    check_timeout("env.options", self, "time_limit_s")
    if self.host not in LOOPBACK_HOSTS and not self.allow_remote:
      fail("env.options", "host", self.host, f"a loopback address {LOOPBACK_HOSTS}, or set "
           "env.options.allow_remote=True to listen beyond this machine")
    if not 0 <= self.port < 65536:
      fail("env.options", "port", self.port, "0 (any free port) to 65535")
    check_positive("env.options", self, "max_sessions", "max_body_bytes", "max_messages")


def check(options: AgentOptions, config: EnvConfig) -> None:
  if config.step_timeout_s and options.time_limit_s >= config.step_timeout_s:
    raise ValueError(f"env.options.time_limit_s={options.time_limit_s} is not below "
                     f"env.step_timeout_s={config.step_timeout_s}: a program's wait would be cut "
                     "as a stuck step; keep time_limit_s below it, or raise step_timeout_s")


def limits(options: AgentOptions) -> Limits:
  """What the endpoint of `options` binds to and bounds."""
  return Limits(host=options.host, port=options.port, max_sessions=options.max_sessions,
                max_body_bytes=options.max_body_bytes, max_messages=options.max_messages,
                model_name=options.model_name)


def make(options: AgentOptions, config: EnvConfig) -> AgentEnv:
  return AgentEnv(program=options.program, time_limit_s=options.time_limit_s,
                  limits=limits(options),
                  graded=bool(config.reward_fn), max_turns=config.max_turns,
                  max_observation_chars=config.max_observation_chars)


SPEC = EnvironmentSpec(name="agent", make=make, options=AgentOptions, check=check)
