"""The text-level multi-turn environment protocol.

The sampler drives an `Environment` with chat messages, never tokens:

    messages = env.reset(task)                 # [{"role": ..., "content": ...}, ...]
    while True:
      action = generate(messages)              # one assistant turn, as text
      messages.append({"role": "assistant", "content": action})
      result = env.step(action)
      if result.done:
        break
      messages.append({"role": env.observation_role, "content": result.observation})

`step` returns a `StepResult` that is exactly one of: an observation (the
episode continues), a reward (done), or an environment failure (done, no
reward). A failure means the environment could not judge the episode (tool
harness crashed, judge unreachable); it is not reward 0, and the trainer should
drop and count such episodes instead of learning from them.

`Environment` enforces two limits for every environment: at most `max_turns`
assistant turns (an action on the last turn that would continue the episode
ends it with reward 0 and reason "max_turns" instead), and observations longer
than `max_observation_chars` are cut with a note saying how much was dropped.

`EnvironmentSpec` is how an environment is made known to the trainer: its
name, how to build one (`make(options, config)`), its options (a frozen
dataclass, filled from `env.options`), its task sources and, optionally, its
scripted demonstrations. The built-in environments are specs like any other
(`sao_jax.envs.registry` resolves `env.name` to one; docs/tutorials/your-own-environment.md).
This module, `Task`, `StepResult`, `Environment`, `EnvironmentSpec` and (for
demonstrations that call tools) `Turn` and `ToolCall` are the public interface
for environments written outside `sao_jax`.
"""

from __future__ import annotations

import abc
import dataclasses
import types
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from sao_jax.chat import tool_calls
from sao_jax.chat.tool_calls import ToolCall, Turn

__all__ = ["Environment", "EnvironmentSpec", "Message", "NoOptions", "SampledTurn", "StepResult",
           "Task", "ToolCall", "Transcript", "Turn", "play"]

if TYPE_CHECKING:
  from sao_jax.config.env import EnvConfig

Message = dict[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
  """One problem: `answer` is the reference the environment checks against.

  `messages`: the prompt as chat messages when the task source gave it so (a
  verl-style row); `prompt` is then the text of its last user message, for
  environments that build their own conversation. `metadata["source"]` (when
  present) names the data source the task's metrics are grouped under.
  """

  id: str
  prompt: str
  answer: str
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
  messages: tuple[Mapping[str, str], ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampledTurn:
  """One turn of the policy as the engine sampled it (`Environment.observe_turn`):
  `tokens` its ids, `behavior_logp` the log-prob of each (the values the learner
  trains against), `finish_reason` the engine's ("stop_token", "stop_pattern",
  "max_new_tokens", "max_seq_len"), `policy_versions` the first and last weight
  version that sampled it, `token_text(id)` a token's text (special tokens included),
  `context_tokens` how many tokens of the episode came before it (the prompt, earlier
  turns and observations of its token segment: what it was sampled from)."""

  tokens: tuple[int, ...]
  behavior_logp: tuple[float, ...]
  finish_reason: str
  policy_versions: tuple[int, int]
  token_text: Callable[[int], str]
  context_tokens: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepResult:
  """The outcome of one action. Build it with `next`, `finish` or `fail`.

  `reason` says why the episode ended ("answer", "max_turns", ...); `info`
  carries per-episode diagnostics for logging. What the fields may hold is
  checked where the sampler receives the result (`sao_jax.envs.contract`): the
  reward a finite real number (int, float or numpy number, never a bool), the
  observation a str, `done` a bool, `failure` and `reason` None or a str, `info`
  a mapping; a result that breaks it fails its episode as `bad_<field>`, naming
  the environment and the value. Nothing is converted.
  """

  observation: str | None = None
  done: bool = False
  reward: float = 0.0
  failure: str | None = None
  reason: str | None = None
  info: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
  # The observation as chat messages (an agent program's tool results and user turns,
  # `sao_jax.envs.agent`), rendered in place of one `observation_role` message; None:
  # `observation` is that one message. `observation` then holds their text, for logs.
  messages: tuple[Message, ...] | None = None
  # With `messages`: they are a new prompt, not a continuation (a client rewrote the
  # conversation): the sampler ends the episode's token segment so far and starts a new
  # one from them, so no token the policy did not sample is ever trained as if it had.
  new_segment: bool = False

  def __post_init__(self):
    if self.done == (self.observation is not None):
      raise ValueError("StepResult needs an observation (episode continues) or done=True, "
                       f"not both or neither; got done={self.done}, observation={self.observation!r}.")
    if self.failure is not None and (not self.done or self.reward != 0.0):
      raise ValueError(f"a failed step ends the episode without reward; got done={self.done}, "
                       f"reward={self.reward}.")

  @classmethod
  def next(cls, observation: str, **info: Any) -> StepResult:
    """The episode continues; `observation` goes back to the model."""
    return cls(observation=observation, info=types.MappingProxyType(info))

  @classmethod
  def next_messages(cls, messages: Sequence[Message], *, new_segment: bool = False,
                    **info: Any) -> StepResult:
    """The episode continues with `messages` (each `{"role", "content", ...}`) after the
    policy's turn, or, `new_segment`, from `messages` as a fresh prompt."""
    text = "\n".join(str(message.get("content", "")) for message in messages)
    return cls(observation=text, messages=tuple(messages), new_segment=new_segment,
               info=types.MappingProxyType(info))

  @classmethod
  def finish(cls, reward: float, reason: str, **info: Any) -> StepResult:
    """The episode ends with `reward` (a finite real number, taken as given: a "1.0"
    is not a reward, and fails the episode where the sampler checks it)."""
    return cls(done=True, reward=reward, reason=reason, info=types.MappingProxyType(info))

  @classmethod
  def fail(cls, failure: str, **info: Any) -> StepResult:
    """The environment could not score the episode (not the model's fault)."""
    return cls(done=True, failure=failure, reason="env_failure", info=types.MappingProxyType(info))


class Environment(abc.ABC):
  """One episode at a time: `reset(task)`, then `step(action)` until done.

  Subclasses implement `_reset` and `_step`; the turn budget and observation cap
  are applied here. Not thread-safe: use one instance per concurrent episode.
  """

  observation_role: str = "user"
  # Native tools (`sao_jax.chat.tool_calls`): OpenAI-format function schemas the chat
  # template is given (`tools=`), and how the policy calls them, which the sampler
  # sets from the chat template before `reset` (`set_tool_format`): "hermes" (Qwen),
  # "llama3_json" (Llama 3.1), or "fenced" (ChatML: the environment's own blocks).
  tools: Sequence[Mapping[str, Any]] = ()
  tool_format: str = "fenced"
  # True for an environment whose `reset` waits on something outside the process (an
  # agent program's first call): the sampler runs it on a step thread, as it runs
  # `step`, so that it never stalls decoding, and gives each episode in flight a step
  # thread of its own, since such a reset (and such an environment's steps: the
  # program's work between calls) holds its thread while it waits.
  slow_reset: bool = False
  # The most tokens the policy's next turn may sample (an agent's `max_tokens`), read by
  # the sampler when it queues the turn; None: `sampler.max_new_tokens`. Never more.
  max_new_tokens: int | None = None

  def __init__(self, *, max_turns: int, max_observation_chars: int):
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
      raise ValueError(f"max_turns={max_turns!r} is invalid: expected a positive integer.")
    if (isinstance(max_observation_chars, bool) or not isinstance(max_observation_chars, int)
        or max_observation_chars < 1):
      raise ValueError(f"max_observation_chars={max_observation_chars!r} is invalid: expected "
                       "a positive integer.")
    self.max_turns = max_turns
    self.max_observation_chars = max_observation_chars
    self.task: Task | None = None
    self.turn = 0
    self.tool_calls = 0  # tools run this episode; environments with tools count them
    self.done = True

  def set_step(self, step: int) -> None:
    """Training progress (the sampler passes its policy version before each episode),
    for environments that change during training; by default it changes nothing."""
    del step

  def set_tool_format(self, tool_format: str) -> None:
    """How the policy's chat template calls tools (class attribute `tool_format`);
    the sampler calls it before `reset`. Environments without tools ignore it."""
    self.tool_format = tool_format

  def observe_turn(self, turn: SampledTurn) -> None:
    """The policy's turn as sampled (token ids and their behavior_logp), given on the
    step thread right before `step(action)`; environments that answer with tokens (the
    agent endpoint's `logprobs`) keep it. By default it is ignored."""
    del turn

  def write_turn(self, turn: Turn) -> str:
    """A scripted turn (a demonstration's `Turn`: text and a tool call) as the policy
    writes it in `tool_format` (`tool_calls.render_turn`), so what SFT imitates is
    what `step` parses; an environment whose "fenced" blocks are its own overrides it."""
    return tool_calls.render_turn(turn, self.tool_format)

  def close(self) -> None:
    """Releases what the current episode holds (files, processes). The sampler
    calls it whenever an episode ends, however it ends; calling it twice is safe.
    Nothing to release by default."""

  def reset(self, task: Task) -> list[Message]:
    """Starts an episode; returns the initial chat messages (system and/or user)."""
    self.task, self.turn, self.tool_calls, self.done = task, 0, 0, False
    return self._reset(task)

  def step(self, action: str) -> StepResult:
    """Consumes one assistant turn and returns what happened."""
    if self.task is None or self.done:
      raise RuntimeError("step() called without an active episode; call reset(task) first.")
    self.turn += 1
    result = self._step(action)
    if not isinstance(result, StepResult):
      return result  # the sampler's check refuses it, naming the environment (envs.contract)
    if not result.done:
      if self.turn >= self.max_turns:
        result = StepResult.finish(0.0, "max_turns", turns=self.turn)
      else:
        result = dataclasses.replace(result, observation=self._cap(result.observation))
    self.done = result.done
    return result

  def _cap(self, observation: str) -> str:
    limit = self.max_observation_chars
    if not isinstance(observation, str) or len(observation) <= limit:
      # Not text: left as it is, for the sampler's check to refuse (envs.contract).
      return observation
    return (observation[:limit]
            + f"\n[observation truncated: showing {limit} of {len(observation)} characters]")

  @abc.abstractmethod
  def _reset(self, task: Task) -> list[Message]:
    """The initial messages for `task`."""

  @abc.abstractmethod
  def _step(self, action: str) -> StepResult:
    """Scores or answers `action`; limits are applied by the caller."""


@dataclasses.dataclass(frozen=True)
class Transcript:
  """A played episode: every message, the assistant's included, and the end."""

  messages: list[Message]
  result: StepResult


def play(env: Environment, task: Task, actions: Sequence[str | Turn]) -> Transcript:
  """Feeds scripted assistant turns to `env` (e.g. a demonstration); a `Turn` is
  written in the environment's tool format first (`Environment.write_turn`).

  Raises ValueError if the actions run out before the episode ends or if the
  episode ends before all actions are used.
  """
  messages = env.reset(task)
  for i, action in enumerate(actions):
    if isinstance(action, Turn):
      action = env.write_turn(action)
    messages.append({"role": "assistant", "content": action})
    result = env.step(action)
    if result.done:
      if i != len(actions) - 1:
        raise ValueError(f"task {task.id!r}: the episode ended at action {i + 1} of "
                         f"{len(actions)} ({result.reason}).")
      return Transcript(messages, result)
    messages.append({"role": env.observation_role, "content": result.observation})
  raise ValueError(f"task {task.id!r}: {len(actions)} actions did not finish the episode.")


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """The options of an environment that has none."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvironmentSpec:
  """An environment as the trainer knows it (`env.name` resolves to one).

  - `name`: what errors and logs call it.
  - `make(options, config)`: a fresh `Environment` (one per episode); `options`
    is an instance of `options`, `config` the `EnvConfig` (its shared fields:
    `max_turns`, `max_observation_chars`, `tool`, `sandbox`, `seed`).
  - `options`: a frozen dataclass whose fields (with defaults) are the
    environment's options, set as `env.options` (`--set env.options.FIELD=VALUE`).
    Values are type-checked against the annotations at start-up; a `validate()`
    method, if the class has one, checks the rest (raise ValueError naming the field).
  - `task_sources`: name -> `(options, config) -> endless Iterator[Task]`; the
    first is the default. "jsonl", "parquet" and "hf_disk" (`env.jsonl_path`,
    `env.dataset`) are offered to every environment unless it defines its own.
  - `demonstration(task, options)`: scripted assistant turns that earn full
    reward (the SFT warm-start imitates them), each a string or a `Turn(text,
    ToolCall(name, arguments))` that the environment writes in the run's tool
    format (`Environment.write_turn`); None if the environment has none.
  - `check(options, config)`: start-up checks that need the whole config (a task
    directory that must exist); raise ValueError.
  """

  name: str
  make: Callable[[Any, "EnvConfig"], Environment]
  options: type = NoOptions
  task_sources: Mapping[str, Callable[[Any, "EnvConfig"], Iterator[Task]]] = dataclasses.field(
      default_factory=dict)
  demonstration: Callable[[Task, Any], list[str | Turn]] | None = None
  check: Callable[[Any, "EnvConfig"], None] | None = None
