"""The built-in "style" environment as an `EnvironmentSpec` (options, tasks, demonstrations)."""

from __future__ import annotations

import dataclasses

from sao_jax.config.checks import check_timeout, fail
from sao_jax.config.env import DEFAULT_STYLE_SCHEDULE, ENV_JUDGES, JUDGE_MAX_TOKENS
from sao_jax.envs.base import EnvironmentSpec
from sao_jax.envs.style import env as style
from sao_jax.envs.style import judge


@dataclasses.dataclass(frozen=True, kw_only=True)
class StyleOptions:
  """`env.options` of "style"."""

  # (first policy version, style) phases. The sampler's policy version counts policy
  # updates (= learner steps after critic warm-up).
  schedule: tuple[tuple[int, str], ...] = DEFAULT_STYLE_SCHEDULE
  judge: str = "rule"  # one of ENV_JUDGES
  judge_base_url: str = ""
  judge_model: str = ""
  judge_api_key_env: str = ""  # Name of the variable holding the key; "" = no auth.
  judge_timeout_s: float = 30.0  # one deadline per verdict: connect, reads and retries together
  judge_retries: int = 2
  judge_max_tokens: int = JUDGE_MAX_TOKENS

  def validate(self) -> None:
    try:
      style.StyleSchedule(self.schedule)
    except ValueError as error:
      fail("env.options", "schedule", self.schedule, str(error).rstrip("."))
    if self.judge not in ENV_JUDGES:
      fail("env.options", "judge", self.judge, f"allowed values are {', '.join(map(repr, ENV_JUDGES))}")
    check_timeout("env.options", self, "judge_timeout_s")
    if self.judge_retries < 0:
      fail("env.options", "judge_retries", self.judge_retries, "expected an integer >= 0")
    if self.judge_max_tokens < 1:
      fail("env.options", "judge_max_tokens", self.judge_max_tokens, "expected an integer >= 1 "
           "(tokens the judge may answer with; raise it for a judge that reasons before its verdict)")
    if self.judge == "http":
      if not self.judge_base_url.startswith(("http://", "https://")):
        fail("env.options", "judge_base_url", self.judge_base_url,
             "judge='http' needs an http(s) URL such as 'http://127.0.0.1:8000/v1'")
      if not self.judge_model:
        fail("env.options", "judge_model", self.judge_model,
             "judge='http' needs the model name to request")


def _make(options: StyleOptions, config) -> style.StyleEnv:
  grader = style.rule_judge
  if options.judge == "http":
    grader = judge.HttpJudge(base_url=options.judge_base_url, model=options.judge_model,
                             api_key_env=options.judge_api_key_env,
                             timeout_s=options.judge_timeout_s, retries=options.judge_retries,
                             max_tokens=options.judge_max_tokens)
  return style.StyleEnv(schedule=style.StyleSchedule(options.schedule), judge=grader,
                        max_observation_chars=config.max_observation_chars)


SPEC = EnvironmentSpec(
    name="style", make=_make, options=StyleOptions,
    task_sources={"builtin": lambda o, c: style.iterate_builtin(seed=c.seed)},
    demonstration=lambda task, o: style.demonstration(task))
