"""Multi-turn episodes: the engine generates actions, environments answer them.

`EpisodeRunner` keeps up to `max_episodes` episodes in flight on one `Engine`:
it renders an environment's messages with the run's chat format
(`sao_jax.chat`: the checkpoint's template, or ChatML), submits the prompt, and
for every turn the engine returns it decodes the action text, calls
`env.step`, and either appends the observation (`ChatFormat.continuation`: the
template's text after the turn's end token, the observation message as the
template renders its role, and the generation prompt, all action_mask 0) or
finishes the episode into a `records.Trajectory` with the reward on the last
action token. The episode keeps every message, so the template renders each
observation in context.

A turn that ended on the format's end token (`<|im_end|>`, `<|eot_id|>`, ...)
already closed its message; a turn cut by a stop pattern (a complete python tool
call) or a length limit gets the end token first, as observation glue: the
policy is credited only for tokens it sampled.

Environments step in parallel: the turns one engine step ends have their
action decoded and `env.step` run on up to `env_threads` threads
(`sampler.env_threads`), so a burst of tool calls (each a sandboxed process, a
judge's HTTP call) waits for the slowest, not for their sum; the results are
then taken in turn order, so the trajectories, their order and every engine
call are what one at a time gives. Each episode has its own `Environment`;
what they share is thread-safe (the math checker takes turns under a lock).

An environment failure ends the episode with `env_failure` set, so the learner
counts and drops it instead of training on reward 0. An episode that runs out of
context is finished with reward 0 and `info["truncated"] = True`; so is, with
`info["end"] = "turn_text"`, one whose turn spells the end token's text (in
ordinary tokens) under a template that rewrites earlier turns, where the turn
boundary cannot be found (`chat.TurnTextError`): as a failure it would be
dropped, a way out of any episode the policy was losing. `info["end"]`
is why the episode ended (the environment's reason, e.g. "answer" or
"max_turns", "truncated" or "turn_text"), `info["last_turn_end"]` why its last turn did
(the engine's finish_reason: "max_new_tokens" / "max_seq_len" = cut by length)
and `info["tool_calls"]` how many tools the environment ran (`Environment.tool_calls`);
`info["source"]` is the task's `metadata["source"]` (its data source, when it has
one) and `info["metrics"]` the numbers of the final `StepResult.info`
(`episode_metrics`), which the learner logs per batch.

One episode's fault is never the runner's: any exception from `env.reset`,
`env.step` (a judge, a tool, a parser inside it) or from encoding the prompt or
an observation ends that episode as an environment failure with
`info["failure_kind"]` = the exception's type (environment-declared failures
get `ENV_DECLARED`), which the learner counts as `dropped/env_failure/<kind>`.
`failures` counts them here too; the first traceback of each kind is logged
(its messages escaped, `log_text.traceback_text`: they can quote the policy's
text, a judge's reply or a tool's output), later ones only counted. An episode
that fails before it reaches the engine still yields a (token-less) failed
trajectory, so a GRPO group stays complete.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np

from sao_jax.chat import ChatFormat, TurnTextError
from sao_jax.config import ModelConfig, SamplerConfig
from sao_jax.envs.base import Environment, Message, StepResult, Task
from sao_jax.log_text import traceback_text
from sao_jax.models.transformer import Params
from sao_jax.sampler.engine import Engine, Turn, stop_token_ids
from sao_jax.sampler.kv_layout import kv_layout
from sao_jax.sampler.prompt_ids import prompt_slot
from sao_jax.types import Trajectory


def make_engine(cfg: SamplerConfig, model_cfg: ModelConfig, params: Params, chat: ChatFormat, *,
                version: int = 0, mesh: jax.sharding.Mesh | None = None) -> Engine:
  """The engine of `sampler.kv_layout` (`sao_jax.sampler.kv_layout`: a `PagedEngine`
  for "paged") that stops on the chat format's end token and `sampler.stop_tokens`,
  its stop-pattern text decoded by the format's tokenizer."""
  tokenizer = chat.tokenizer
  return kv_layout(cfg).engine(
      cfg, model_cfg, params, version=version, mesh=mesh,
      stop_token_ids=stop_token_ids(tokenizer, (chat.end_token, *cfg.stop_tokens)),
      detokenize=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False))


ENV_DECLARED = "env_declared"  # failure_kind of a failure the environment returned
MAX_EPISODE_METRICS = 16  # numbers of a final StepResult.info kept as info["metrics"]
MAX_LABEL_CHARS = 64  # of a metric name or a task's source kept in a trajectory


def episode_metrics(result_info: Mapping[str, Any]) -> dict[str, float]:
  """The finite numbers (booleans as 0/1) of a finished episode's `StepResult.info`, the
  first `MAX_EPISODE_METRICS` with names of at most `MAX_LABEL_CHARS` characters: what
  an environment or a reward function (`envs.rewards`) reports beside the reward."""
  out = {}
  for key, value in result_info.items():
    if len(out) == MAX_EPISODE_METRICS:
      break
    if (isinstance(key, str) and 0 < len(key) <= MAX_LABEL_CHARS
        and isinstance(value, (int, float)) and math.isfinite(value)):
      out[key] = float(value)
  return out


@dataclasses.dataclass
class _Live:
  env: Environment
  task: Task
  prompt_id: int
  messages: list[Message]  # the conversation so far, the policy's turns as decoded text
  turns: int = 0
  last_turn_end: str = ""  # the engine's finish_reason of the latest turn


class EpisodeRunner:
  """Drives episodes of `make_env()` environments through `engine`.

  `failures` counts episodes that raised, by exception type; `log` receives the
  first traceback of each type.
  """

  def __init__(self, engine: Engine, chat: ChatFormat, make_env: Callable[[], Environment], *,
               max_episodes: int, env_threads: int = 1, log: Callable[[str], None] = print):
    if env_threads < 1:
      raise ValueError(f"env_threads={env_threads!r}: expected >= 1 (1: one at a time)")
    self.engine, self._chat, self._make_env = engine, chat, make_env
    self.max_episodes, self.env_threads = max_episodes, env_threads
    self.failures: collections.Counter[str] = collections.Counter()
    self._log = log
    self._logged: set[str] = set()
    self._live: dict[int, _Live] = {}
    self._failed: list[Trajectory] = []  # failed before reaching the engine; out at next step
    self._next_id = 0

  @property
  def in_flight(self) -> int:
    return len(self._live) + len(self._failed)

  def start(self, task: Task, *, prompt_id: int, seed: int) -> None:
    env = self._make_env()
    try:
      # Environments that change during training (the style schedule) see the policy
      # version the episode starts with.
      env.set_step(self.engine.version)
      # Native tool calls: the environment parses the template's format, and the
      # template is given the environment's tools (sao_jax.chat.tool_calls).
      env.set_tool_format(self._chat.tool_format if env.tools else "fenced")
      messages = list(env.reset(task))
      prompt = self._chat.prompt(messages, tools=env.tools or None)
      self.engine.submit(self._next_id, prompt, seed=seed % 2**32)
    except Exception as error:  # this episode's fault, never the runner's
      self._release(env, task)
      version = self.engine.version
      empty = np.zeros(0, np.float32)
      self._failed.append(Trajectory(
          tokens=np.zeros(0, np.int32), action_mask=np.zeros(0, np.int8), behavior_logp=empty,
          rewards=empty, prompt_id=prompt_id, policy_versions=(version, version),
          env_failure=self._failure("reset", task, error),
          info={"task": task.id, "turns": 0, "end": "env_failure", "truncated": False,
                "tool_calls": 0, "failure_kind": type(error).__name__}))
      return
    self._live[self._next_id] = _Live(env, task, prompt_id, messages)
    self._next_id += 1

  def step(self) -> list[Trajectory]:
    """One engine step; returns the episodes that finished."""
    finished, self._failed = self._failed, []
    turns = self.engine.step()
    for turn, outcome in zip(turns, self._env_steps(turns)):
      done = self._advance(turn, *outcome)
      if done is not None:
        finished.append(done)
    return finished

  def _env_steps(self, turns: list[Turn]) -> list[tuple[str, StepResult | Exception]]:
    """Each turn's action text and its environment's step result (or the exception it
    raised), on up to `env_threads` threads, in turn order (module docstring)."""
    def env_step(turn: Turn) -> tuple[str, StepResult | Exception]:
      action = ""
      try:
        action = self._chat.tokenizer.decode(turn.tokens.tolist(), skip_special_tokens=True)
        return action, self._live[turn.episode_id].env.step(action)
      except Exception as error:  # this episode's fault, never the runner's
        return action, error
    threads = min(self.env_threads, len(turns))
    if threads <= 1:
      return [env_step(turn) for turn in turns]
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="env-step") as pool:
      return list(pool.map(env_step, turns))

  def close(self) -> None:
    """Ends every episode in flight without a trajectory, releasing what its
    environment holds (files, processes)."""
    for episode_id in list(self._live):
      self.engine.finish(episode_id)
      live = self._live.pop(episode_id)
      self._release(live.env, live.task)
    self._failed = []

  def _advance(self, turn: Turn, action: str, result: StepResult | Exception
               ) -> Trajectory | None:
    live = self._live[turn.episode_id]
    live.turns += 1
    if isinstance(result, Exception):
      return self._fail(turn.episode_id, "step", result)
    live.last_turn_end = turn.finish_reason
    if result.done:
      return self._finish(turn.episode_id, reward=result.reward or 0.0,
                          failure=result.failure, reason=result.reason,
                          kind=None if result.failure is None else ENV_DECLARED,
                          result_info=result.info)
    closed = bool(turn.tokens.size) and int(turn.tokens[-1]) == self._chat.end_token_id
    live.messages.append({"role": "assistant", "content": action})
    message = {"role": live.env.observation_role, "content": result.observation}
    try:
      tokens = self._chat.continuation(live.messages, [message], closed=closed,
                                       tools=live.env.tools or None)
    except TurnTextError:  # the policy's own text: scored 0, never an unscored failure
      return self._finish(turn.episode_id, reward=0.0, failure=None, reason="turn_text")
    except Exception as error:
      return self._fail(turn.episode_id, "encode", error)
    live.messages.append(message)
    if tokens.size >= self.engine.room(turn.episode_id):
      return self._finish(turn.episode_id, reward=0.0, failure=None, reason="truncated")
    self.engine.submit(turn.episode_id, tokens)
    return None

  def _failure(self, stage: str, task: Task, error: Exception) -> str:
    """Counts `error` by type, logs its first traceback of that type; the failure text."""
    kind = type(error).__name__
    self.failures[kind] += 1
    self._log_once(kind, f"episode of task {task.id!r} failed in {stage} with {kind}; it is "
                   "dropped as an environment failure (later ones are only counted, as "
                   f"dropped/env_failure/{kind})", error)
    return f"{stage} raised {kind}: {str(error)[:200]}"

  def _release(self, env: Environment, task: Task) -> None:
    """`env.close()`; an error there leaks the episode's files at worst, so it is
    logged (once per type) and the episode's outcome stands."""
    try:
      env.close()
    except Exception as error:
      self._log_once(f"close/{type(error).__name__}", f"closing the environment of task "
                     f"{task.id!r} failed with {type(error).__name__}", error)

  def _log_once(self, key: str, text: str, error: Exception) -> None:
    if key not in self._logged:
      self._logged.add(key)
      # The message can hold policy text (a parser quoting it), a judge's reply or a
      # tool's output: escaped, so it cannot forge log lines or drive the terminal.
      self._log(f"{text}:\n" + traceback_text(error, limit=-20))

  def _fail(self, episode_id: int, stage: str, error: Exception) -> Trajectory:
    failure = self._failure(stage, self._live[episode_id].task, error)
    return self._finish(episode_id, reward=0.0, failure=failure, reason="env_failure",
                        kind=type(error).__name__)

  def _finish(self, episode_id: int, *, reward: float, failure: str | None,
              reason: str | None, kind: str | None = None,
              result_info: Mapping[str, Any] | None = None) -> Trajectory:
    live = self._live.pop(episode_id)
    tool_calls = live.env.tool_calls
    self._release(live.env, live.task)
    out = self.engine.finish(episode_id)
    rewards = np.zeros(out.tokens.shape, np.float32)
    action_positions = np.flatnonzero(out.action_mask)
    if action_positions.size:
      rewards[action_positions[-1]] = reward
    versions = out.policy_versions or (self.engine.version, self.engine.version)
    info = {"task": live.task.id, "turns": live.turns, "end": reason or "",
            "truncated": reason == "truncated", "last_turn_end": live.last_turn_end,
            "tool_calls": tool_calls}
    if kind is not None:
      info["failure_kind"] = kind
    source = live.task.metadata.get("source")
    if isinstance(source, str) and source:
      info["source"] = source[:MAX_LABEL_CHARS]
    metrics = episode_metrics(result_info or {})
    if metrics:
      info["metrics"] = metrics
    return Trajectory(tokens=out.tokens.astype(np.int32), action_mask=out.action_mask.astype(np.int8),
                      behavior_logp=out.behavior_logp.astype(np.float32), rewards=rewards,
                      prompt_id=live.prompt_id, policy_versions=tuple(versions),
                      env_failure=failure, info=info)


def run_to_completion(runner: EpisodeRunner, tasks: Iterator[Task], count: int, *,
                      num_slots: int, seed: int,
                      progress: Callable[[int], object] = lambda finished: None
                      ) -> list[Trajectory]:
  """Runs `count` episodes (e.g. an evaluation), keeping the runner saturated;
  `progress(k)` hears of every k episodes that finish (a progress bar's update)."""
  done: list[Trajectory] = []
  started = 0
  while len(done) < count:
    while started < count and runner.in_flight < runner.max_episodes:
      task = next(tasks)
      runner.start(task, prompt_id=prompt_slot(task, num_slots), seed=seed + started)
      started += 1
    finished = runner.step()
    done.extend(finished)
    if finished:
      progress(len(finished))
  return done
