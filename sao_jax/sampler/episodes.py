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

Environments never stall decoding (`overlap=True`, docs/explanation/
episode-lifecycle.md): a turn that ends hands its action's detokenisation and
`env.step` to a pool of at most `env_threads` step threads
(`sao_jax.sampler.env_steps`); its slot stays parked (the engine keeps its
cache) and `step` returns after the engine step without waiting. The next
`step` first collects the environment steps that completed and submits their
observations, then steps the engine, which prefills them with the decoding it
does anyway. The engine step is split (`Engine.dispatch` / `complete`): on an
accelerator (`Engine.overlaps_host`), while its decode call runs on the device,
the runner applies the environment steps that complete (their observations
tokenised and queued for the next step), looking every `DEVICE_POLL_S` whether
the call is done, so that host work overlaps the device instead of following it.
The runner waits for an environment only when the engine has nothing to run
(every episode in flight is waiting on one), and then only for the first to
complete. An episode's sampling keys are per episode and position (its seed, its
task), not per step of the runner. Its logits, though, may move in the last bits with
timing: which episodes are prefilled or decoded together (and share prompt pages)
changes float sums, measured at ~1e-7 in behavior_logp on the paged engine on CPU
(a token can change only where those bits decide between two). Use `overlap=False`
when bits matter, as `experiments/drift.py` does. Which episodes finish first also depends on timing: `info["episode"]` is each trajectory's start index, and
`release="start"` hands trajectories out in start order instead of finish
order (holding each until every earlier-started one is out; the held ones count
in `in_flight`, so a slow episode also pauses admission). `overlap=False` is
the runner before: every step's env steps run (on the same pool) before `step`
returns and are applied in turn order. Each episode has its own `Environment`;
what they share must be thread-safe (the math checker's pool of processes).

Simulated tool latency (`latency`, `env.latency`; `sao_jax.sampler.latency`):
each environment step's thread sleeps a delay drawn from the episode's own stream
(seeded by its seed, in step order) after `env.step` returns, so delays are
reproducible and, the sleep using no CPU, the engine decodes the other episodes
meanwhile. A sleeping step holds its step thread, so with latency on the pool
has a thread per episode in flight (`max(env_threads, max_episodes)`): a slow
step never queues another episode's step behind it. The delay counts towards
`step_timeout_s` (`config.env` keeps `latency.max_s` below it). An environment
that waits on the outside (`Environment.slow_reset`: an agent program, whose
reset waits for its first call and each step for its next, while the program
runs its own tools) holds a step thread the same way, so the pool grows to a
thread per episode in flight when the first such episode starts.

A step that runs past `step_timeout_s` (`env.step_timeout_s`) fails its episode
as `StepTimeout` and frees its slot; the step's thread cannot be killed, so it
is abandoned (`env_steps.abandoned`) and the environment closed on a thread of
its own; more abandoned steps still running than `env_threads` raise
`env_steps.StuckSteps`, which ends a sampler process (its supervisor starts a
fresh one, and the stuck threads end with the old). `can_start` refuses new
episodes while `max_episodes` are in flight (decoding, queued, waiting on an environment or held for release) or while
steps wait for a free step thread. `close` ends within `close_grace_s` plus the
environments' own close.

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

An environment whose `reset` waits on something outside the process
(`Environment.slow_reset`: an agent program's first call, `sao_jax.envs.agent`)
has it run on a step thread like a step, under the same `step_timeout_s`; its
prompt is submitted when it returns. Such environments also use the rest of the
seam the agent endpoint needs: `observe_turn` gives the environment each turn's
sampled ids and behavior_logp before `step`; a `StepResult.messages` observation
is several chat messages (tool results); `new_segment` restarts the episode from
those messages as a fresh prompt (a client that rewrote its history): the tokens
so far are dropped, never trained, the trajectory is the last segment and
`info["segments"]` counts them; `Environment.max_new_tokens` caps the next turn
below `sampler.max_new_tokens`.

One episode's fault is never the runner's: any exception from `env.reset`,
`env.step` (a judge, a tool, a parser inside it) or from encoding the prompt or
an observation ends that episode as an environment failure with
`info["failure_kind"]` = the exception's type (environment-declared failures
get `ENV_DECLARED`), which the learner counts as `dropped/env_failure/<kind>`.
Environment code that calls `sys.exit` fails its episode the same way (kind
"SystemExit"), in `reset`, `step` or `close`; a KeyboardInterrupt on the
runner's thread (Ctrl-C) still ends the runner, and one raised by a step on its
step thread is that step's (`env_steps`). Every value `env.step` returns passes
one check before any field of it is read (`sao_jax.envs.contract`): a result
that is not a `StepResult`, a reward that is not a finite real number (a bool,
"0.9", None, [1.0], NaN, 10**400), an observation that is not text, ... fails
its episode as `bad_<field>` ("bad_reward", ...), the text naming the
environment (`env_name`: `registry.describe`, the name and import path) and the
value; nothing is converted.
`failures` counts them here too; the first traceback of each kind is logged
(its messages escaped, `log_text.traceback_text`: they can quote the policy's
text, a judge's reply or a tool's output), later ones only counted. An episode
that fails before it reaches the engine still yields a (token-less) failed
trajectory, so a GRPO group stays complete; so does each episode of a task that
could not be made (`reject`: a bad dataset row, `failure_kind` "BadRow").
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np

from sao_jax.chat import ChatFormat, TurnTextError, tool_calls
from sao_jax.config import ModelConfig, SamplerConfig
from sao_jax.config.env import StepLatency
from sao_jax.config.sampler import RELEASE_ORDERS
from sao_jax.envs import contract
from sao_jax.envs.base import Environment, Message, SampledTurn, StepResult, Task
from sao_jax.log_text import traceback_text
from sao_jax.models.transformer import Params
from sao_jax.sampler.engine import Engine, Turn, stop_token_ids
from sao_jax.sampler.env_steps import EnvSteps, StepTimeout
from sao_jax.sampler.kv_layout import kv_layout
from sao_jax.sampler.latency import episode_delays
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
# What environment code raises on the runner's thread (reset, close) that fails only its
# episode: every Exception, and SystemExit (a plugin calling sys.exit). KeyboardInterrupt
# is left to end the runner: there it is how Ctrl-C arrives.
ENV_ERRORS = (Exception, SystemExit)
MAX_EPISODE_METRICS = 16  # numbers of a final StepResult.info kept as info["metrics"]
MAX_LABEL_CHARS = 64  # of a metric name or a task's source kept in a trajectory
# How long the runner waits for an environment outcome before it looks again whether
# the decode call in flight is done: the most a finished call can wait for the host.
DEVICE_POLL_S = 0.0005


def episode_metrics(result_info: Mapping[str, Any]) -> dict[str, float]:
  """The finite numbers (booleans as 0/1) of a finished episode's `StepResult.info`, the
  first `MAX_EPISODE_METRICS` with names of at most `MAX_LABEL_CHARS` characters: what
  an environment or a reward function (`envs.rewards`) reports beside the reward."""
  out = {}
  for key, value in result_info.items():
    if len(out) == MAX_EPISODE_METRICS:
      break
    number = contract.metric_value(value)  # None for text, NaN, 10**400, ...
    if isinstance(key, str) and 0 < len(key) <= MAX_LABEL_CHARS and number is not None:
      out[key] = number
  return out


@dataclasses.dataclass
class _Live:
  env: Environment
  task: Task
  prompt_id: int
  messages: list[Message]  # the conversation so far, the policy's turns as decoded text
  delays: Iterator[float]  # the added latency of each of its environment steps
  seed: int = 0
  started: bool = True  # submitted to the engine (False while a slow reset runs)
  turns: int = 0
  last_turn_end: str = ""  # the engine's finish_reason of the latest turn
  closed: bool = False  # the latest turn ended on the format's end token
  segments: int = 1  # token segments: a new one each time the environment restarts the prompt


class EpisodeRunner:
  """Drives episodes of `make_env()` environments through `engine`.

  `failures` counts failed episodes by kind (the exception's type, or the
  `bad_<field>` of a result the contract refuses); `log` receives the first
  traceback (or message) of each kind. `env_name` is how failure texts name the
  environment (`registry.describe`; "" = its class). `env_wait_s` is the wall time `step` spent
  waiting on environments with nothing to decode (overlap) or after every engine
  step (overlap=False). `latency` (`env.latency`) delays every environment step
  (module docstring).
  """

  def __init__(self, engine: Engine, chat: ChatFormat, make_env: Callable[[], Environment], *,
               max_episodes: int, env_threads: int = 1, overlap: bool = True,
               step_timeout_s: float = 0.0, release: str = "finish",
               close_grace_s: float = 5.0, log: Callable[[str], None] = print,
               env_name: str = "", latency: StepLatency | None = None):
    if env_threads < 1:
      raise ValueError(f"env_threads={env_threads!r}: expected >= 1 (1: one at a time)")
    if release not in RELEASE_ORDERS:
      raise ValueError(f"release={release!r}: expected one of {RELEASE_ORDERS} "
                       "(sampler.release_order)")
    self.engine, self._chat, self._make_env = engine, chat, make_env
    self.max_episodes, self.env_threads = max_episodes, env_threads
    self.overlap, self.release, self._close_grace_s = overlap, release, close_grace_s
    self._latency = latency or StepLatency()
    self.env_steps = EnvSteps(env_threads, step_timeout_s)
    if self._latency.kind != "none":
      self._thread_per_episode()
    self.failures: collections.Counter[str] = collections.Counter()
    self.env_wait_s = 0.0
    self._log, self._env_name = log, env_name
    self._logged: set[str] = set()
    self._live: dict[int, _Live] = {}
    self._failed: list[tuple[int, Trajectory]] = []  # failed before the engine; out next step
    self._held: dict[int, Trajectory] = {}  # release="start": finished, not yet released
    self._next_release = 0
    self._next_id = 0

  @property
  def in_flight(self) -> int:
    """Episodes started and not yet handed out by `step` (held ones included)."""
    return len(self._live) + len(self._failed) + len(self._held)

  def can_start(self, n: int = 1) -> bool:
    """Whether `n` more episodes may start: room under `max_episodes`, and no
    environment step waiting for a free step thread."""
    return self.in_flight + n <= self.max_episodes and not self.env_steps.backlog

  def start(self, task: Task, *, prompt_id: int, seed: int) -> int:
    """Starts an episode of `task`; its id (`info["episode"]` of its trajectory)."""
    env = self._make_env()
    episode_id, self._next_id = self._next_id, self._next_id + 1
    try:
      # Environments that change during training (the style schedule) see the policy
      # version the episode starts with.
      env.set_step(self.engine.version)
      # Native tool calls: the environment parses the template's format, and the
      # template is given the environment's tools (sao_jax.chat.tool_calls). An
      # environment that learns its tools in reset (an agent's first call) is given the
      # template's format: `format_for` falls back to "fenced" only for no tools at all.
      env.set_tool_format(tool_calls.format_for(env.tools or env.slow_reset,
                                                self._chat.tool_format))
      if env.slow_reset:  # on a step thread: the prompt is submitted when it returns
        self._thread_per_episode()
        live = _Live(env, task, prompt_id, [], episode_delays(self._latency, seed=seed),
                     seed=seed % 2**32, started=False)
        self._live[episode_id] = live
        self.env_steps.submit(episode_id, functools.partial(env.reset, task))
        return episode_id
      messages = list(env.reset(task))
      self._submit_prompt(episode_id, env, messages, seed % 2**32)
    except ENV_ERRORS as error:  # this episode's fault, never the runner's
      self._live.pop(episode_id, None)
      self._release(env, task)
      self._fail_unstarted(episode_id, task, prompt_id, "reset", error)
      return episode_id
    self._live[episode_id] = _Live(env, task, prompt_id, messages,
                                   episode_delays(self._latency, seed=seed), seed=seed % 2**32)
    return episode_id

  def _thread_per_episode(self) -> None:
    """A step thread per episode in flight, at least: for steps that hold their thread
    while nothing runs on it (a simulated delay asleep, a program working between calls),
    so that no episode's step waits behind another's (module docstring)."""
    self.env_steps.widen(self.max_episodes)

  def _submit_prompt(self, episode_id: int, env: Environment, messages: list[Message],
                     seed: int) -> None:
    prompt = self._chat.prompt(messages, tools=env.tools or None)
    self.engine.submit(episode_id, prompt, seed=seed, **self._turn_limit(env))

  def _turn_limit(self, env: Environment) -> dict[str, int]:
    """`submit`'s arguments for the next turn's length: the environment's
    `max_new_tokens`, never past the config's; none when it sets no limit."""
    limit = env.max_new_tokens
    if limit is None:
      return {}
    return {"max_new_tokens": max(1, min(int(limit), self.engine.cfg.max_new_tokens))}

  def reject(self, task: Task, error: Exception, *, prompt_id: int) -> int:
    """An episode of a task that could not be made (`error`: a bad dataset row, naming
    its file, row and column; `task` holds only an id for it): a failed token-less
    trajectory, out at the next `step` and counted like a failure of `start`; its id."""
    episode_id, self._next_id = self._next_id, self._next_id + 1
    self._fail_unstarted(episode_id, task, prompt_id, "task", error)
    return episode_id

  def _fail_unstarted(self, episode_id: int, task: Task, prompt_id: int, stage: str,
                      error: BaseException) -> None:
    self._failed.append((episode_id, self._unstarted(episode_id, task, prompt_id, stage, error)))

  def _unstarted(self, episode_id: int, task: Task, prompt_id: int, stage: str,
                 error: BaseException) -> Trajectory:
    """The token-less failed trajectory of an episode that never reached the engine."""
    version = self.engine.version
    empty = np.zeros(0, np.float32)
    return (Trajectory(
        tokens=np.zeros(0, np.int32), action_mask=np.zeros(0, np.int8), behavior_logp=empty,
        rewards=empty, prompt_id=prompt_id, policy_versions=(version, version),
        env_failure=self._failure(stage, task, error),
        info={"task": task.id, "episode": episode_id, "turns": 0, "end": "env_failure",
              "truncated": False, "tool_calls": 0, "failure_kind": type(error).__name__}))

  def step(self) -> list[Trajectory]:
    """Applies the environment steps that completed, steps the engine and hands
    the turns that ended to the step threads; returns the episodes released
    (module docstring)."""
    finished, self._failed = self._failed, []
    if not self.overlap:
      turns = self.engine.step()
      self._hand_over(turns)
      outcomes = dict(self._wait_for_env(until_all=True))
      for turn in turns:  # turn order: what one at a time gives
        if turn.episode_id in outcomes:
          self._advance(turn.episode_id, outcomes.pop(turn.episode_id), finished)
      for episode_id, outcome in outcomes.items():  # slow resets
        self._advance(episode_id, outcome, finished)
      return self._released(finished)
    outcomes = self.env_steps.collect(wait=False)
    if not outcomes and self.env_steps.pending and not self.engine.busy:
      outcomes = self._wait_for_env(until_all=False)  # nothing else can run
    for episode_id, outcome in outcomes:
      self._advance(episode_id, outcome, finished)
    in_flight = self.engine.dispatch()
    # While the device decodes, environment steps that complete are applied (their
    # observations tokenised and queued for the next step's prefill), as they come.
    while (self.engine.overlaps_host and self.env_steps.pending
           and not self.engine.ready(in_flight)):
      for episode_id, outcome in self.env_steps.collect(wait=True, timeout_s=DEVICE_POLL_S):
        self._advance(episode_id, outcome, finished)
    self._hand_over(self.engine.complete(in_flight))
    return self._released(finished)

  def _wait_for_env(self, *, until_all: bool) -> list[tuple[int, object]]:
    start = time.monotonic()
    outcomes = self.env_steps.collect(wait=True)
    while until_all and self.env_steps.pending:
      outcomes += self.env_steps.collect(wait=True)
    self.env_wait_s += time.monotonic() - start
    return outcomes

  def _hand_over(self, turns: list[Turn]) -> None:
    """Queues each turn's detokenisation and env step on the step threads."""
    for turn in turns:
      live = self._live[turn.episode_id]
      live.turns += 1
      live.last_turn_end = turn.finish_reason
      live.closed = bool(turn.tokens.size) and int(turn.tokens[-1]) == self._chat.end_token_id
      self.env_steps.submit(turn.episode_id, functools.partial(
          self._env_step, live.env, turn, next(live.delays)))

  def _token_text(self, token: int) -> str:
    return self._chat.tokenizer.decode([int(token)], skip_special_tokens=False)

  def _env_step(self, env: Environment, turn: Turn, delay_s: float) -> tuple[str, StepResult]:
    """On a step thread: the action's text and the environment's answer to it, returned
    `delay_s` seconds (simulated latency, asleep) after the environment answered. The
    environment sees the sampled turn first (`Environment.observe_turn`)."""
    env.observe_turn(SampledTurn(
        tokens=tuple(turn.tokens.tolist()), behavior_logp=tuple(turn.behavior_logp.tolist()),
        finish_reason=turn.finish_reason, policy_versions=tuple(turn.policy_versions),
        token_text=self._token_text, context_tokens=turn.context_tokens))
    action = self._chat.tokenizer.decode(turn.tokens.tolist(), skip_special_tokens=True)
    result = env.step(action)
    if delay_s:
      time.sleep(delay_s)
    return action, result

  def _released(self, finished: list[tuple[int, Trajectory]]) -> list[Trajectory]:
    """The trajectories `step` hands out: all of `finished` in finish order, or
    (release="start") those whose every earlier-started episode is out."""
    if self.release == "finish":
      return [traj for _, traj in finished]
    self._held.update(finished)
    out = []
    while self._next_release in self._held:
      out.append(self._held.pop(self._next_release))
      self._next_release += 1
    return out

  def close(self) -> None:
    """Ends every episode in flight without a trajectory, releasing what its
    environment holds (files, processes): waits up to `close_grace_s` for the
    environment steps running, closes the environments of those that do not
    return on threads of their own (their steps are abandoned)."""
    stuck = set(self.env_steps.close(self._close_grace_s))
    for episode_id in list(self._live):
      live = self._live.pop(episode_id)
      if live.started:
        self.engine.finish(episode_id)
      self._release(live.env, live.task, background=episode_id in stuck)
    self._failed, self._held = [], {}

  def _advance(self, episode_id: int, outcome, finished: list[tuple[int, Trajectory]]) -> None:
    """Applies an environment step's outcome ((action, StepResult) or the exception
    it raised): the episode finishes, fails, or its observation is submitted."""
    done = self._apply(episode_id, outcome)
    if done is not None:
      finished.append((episode_id, done))

  def _apply(self, episode_id: int, outcome) -> Trajectory | None:
    live = self._live[episode_id]
    if not live.started:
      return self._start_slow(episode_id, outcome)
    if isinstance(outcome, BaseException):  # SystemExit included (env_steps)
      return self._fail(episode_id, "step", outcome)
    action, result = outcome
    bad = contract.check_result(result)  # before any field of it is read
    if bad is not None:
      return self._refuse(episode_id, bad)
    if result.done:
      return self._finish(episode_id, reward=float(result.reward),
                          failure=result.failure, reason=result.reason,
                          kind=None if result.failure is None else ENV_DECLARED,
                          result_info=result.info)
    live.messages.append({"role": "assistant", "content": action})
    if result.new_segment:
      return self._new_segment(episode_id, list(result.messages))
    new = (list(result.messages) if result.messages is not None
           else [{"role": live.env.observation_role, "content": result.observation}])
    try:
      tokens = self._chat.continuation(live.messages, new, closed=live.closed,
                                       tools=live.env.tools or None)
    except TurnTextError:  # the policy's own text: scored 0, never an unscored failure
      return self._finish(episode_id, reward=0.0, failure=None, reason="turn_text")
    except Exception as error:
      return self._fail(episode_id, "encode", error)
    live.messages.extend(new)
    if tokens.size >= self.engine.room(episode_id):
      return self._finish(episode_id, reward=0.0, failure=None, reason="truncated")
    self.engine.submit(episode_id, tokens, **self._turn_limit(live.env))
    return None

  def _start_slow(self, episode_id: int, outcome) -> Trajectory | None:
    """A slow reset returned (`outcome`: its messages or what it raised): the prompt is
    submitted, or the episode fails token-less like a failure of `start`."""
    live = self._live[episode_id]
    try:
      if isinstance(outcome, BaseException):
        raise outcome
      messages = list(outcome)
      self._submit_prompt(episode_id, live.env, messages, live.seed)
    except ENV_ERRORS as error:
      del self._live[episode_id]
      self._release(live.env, live.task, background=isinstance(error, StepTimeout))
      return self._unstarted(episode_id, live.task, live.prompt_id, "reset", error)
    live.messages, live.started = messages, True
    return None

  def _new_segment(self, episode_id: int, messages: list[Message]) -> Trajectory | None:
    """The environment restarted the conversation (`StepResult.new_segment`): the
    tokens so far are dropped (never trained: they do not continue into what follows)
    and counted, and the episode goes on from `messages` as a new prompt."""
    live = self._live[episode_id]
    try:
      prompt = self._chat.prompt(messages, tools=live.env.tools or None)
    except Exception as error:
      return self._fail(episode_id, "encode", error)
    if prompt.size >= self.engine.cfg.max_seq_len - 1:
      return self._finish(episode_id, reward=0.0, failure=None, reason="truncated")
    self.engine.finish(episode_id)
    live.segments += 1
    live.messages = messages
    self.engine.submit(episode_id, prompt, seed=(live.seed + live.segments) % 2**32,
                       **self._turn_limit(live.env))
    return None

  def _refuse(self, episode_id: int, bad: contract.BadResult) -> Trajectory:
    """Fails the episode whose step returned `bad` (module docstring)."""
    live = self._live[episode_id]
    name = self._env_name or f"{type(live.env).__module__}.{type(live.env).__qualname__}"
    text = f"environment {name} returned {bad.problem}"
    self.failures[bad.kind] += 1
    self._log_once(bad.kind, f"episode of task {live.task.id!r} failed: {text}; it is dropped "
                   "as an environment failure (later ones are only counted, as "
                   f"dropped/env_failure/{bad.kind})")
    return self._finish(episode_id, reward=0.0, failure=text, reason="env_failure",
                        kind=bad.kind)

  def _failure(self, stage: str, task: Task, error: BaseException) -> str:
    """Counts `error` by type, logs its first traceback of that type; the failure text."""
    kind = type(error).__name__
    self.failures[kind] += 1
    self._log_once(kind, f"episode of task {task.id!r} failed in {stage} with {kind}; it is "
                   "dropped as an environment failure (later ones are only counted, as "
                   f"dropped/env_failure/{kind})", error)
    return f"{stage} raised {kind}: {str(error)[:200]}"

  def _release(self, env: Environment, task: Task, *, background: bool = False) -> None:
    """`env.close()`; an error there leaks the episode's files at worst, so it is
    logged (once per type) and the episode's outcome stands. `background`: on a
    daemon thread of its own (its step is abandoned, and may hold what close needs)."""
    if background:
      threading.Thread(target=self._release, args=(env, task), daemon=True,
                       name="env-close").start()
      return
    try:
      env.close()
    except ENV_ERRORS as error:
      self._log_once(f"close/{type(error).__name__}", f"closing the environment of task "
                     f"{task.id!r} failed with {type(error).__name__}", error)

  def _log_once(self, key: str, text: str, error: BaseException | None = None) -> None:
    if key not in self._logged:
      self._logged.add(key)
      # The message can hold policy text (a parser quoting it), a judge's reply or a
      # tool's output: escaped, so it cannot forge log lines or drive the terminal
      # (a refused value is escaped by contract.shown).
      self._log(text if error is None else f"{text}:\n" + traceback_text(error, limit=-20))

  def _fail(self, episode_id: int, stage: str, error: BaseException) -> Trajectory:
    failure = self._failure(stage, self._live[episode_id].task, error)
    # A timed-out step still runs on its abandoned thread, using the environment.
    return self._finish(episode_id, reward=0.0, failure=failure, reason="env_failure",
                        kind=type(error).__name__, background=isinstance(error, StepTimeout))

  def _finish(self, episode_id: int, *, reward: float, failure: str | None,
              reason: str | None, kind: str | None = None,
              result_info: Mapping[str, Any] | None = None,
              background: bool = False) -> Trajectory:
    live = self._live.pop(episode_id)
    tool_calls = live.env.tool_calls
    self._release(live.env, live.task, background=background)
    out = self.engine.finish(episode_id)
    rewards = np.zeros(out.tokens.shape, np.float32)
    action_positions = np.flatnonzero(out.action_mask)
    if action_positions.size:
      rewards[action_positions[-1]] = reward
    versions = out.policy_versions or (self.engine.version, self.engine.version)
    info = {"task": live.task.id, "episode": episode_id, "turns": live.turns, "end": reason or "",
            "truncated": reason == "truncated", "last_turn_end": live.last_turn_end,
            "tool_calls": tool_calls}
    if live.segments > 1:  # the trajectory is the last segment (`_new_segment`)
      info["segments"] = live.segments
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
                      env_failure=failure, info=info, routed_experts=out.routed_experts)


def run_to_completion(runner: EpisodeRunner, tasks: Iterator[Task], count: int, *,
                      num_slots: int, seed: int,
                      progress: Callable[[int], object] = lambda finished: None
                      ) -> list[Trajectory]:
  """Runs `count` episodes (e.g. an evaluation), keeping the runner saturated;
  `progress(k)` hears of every k episodes that finish (a progress bar's update)."""
  done: list[Trajectory] = []
  started = 0
  while len(done) < count:
    while started < count and runner.can_start():
      task = next(tasks)
      runner.start(task, prompt_id=prompt_slot(task, num_slots), seed=seed + started)
      started += 1
    finished = runner.step()
    done.extend(finished)
    if finished:
      progress(len(finished))
  return done
