"""`AgentEnv`: an agent program that calls an OpenAI-compatible endpoint, as an environment.

Once per task the environment opens a session on the process's endpoint
(`server.Endpoint`) and starts the program (`env.options.program`):

- `"package.module:function"`: called on a thread of its own as
  `function(task, base_url, api_key)`; what it returns, a number, is the episode's
  reward (None: none);
- anything else is a command line, run as a child process with `OPENAI_BASE_URL`,
  `OPENAI_API_KEY`, `SAO_TASK_ID` and `SAO_TASK_PROMPT` in its environment; its
  exit status 0 ends the episode, any other fails it.

Turns. `reset` (a slow reset: on a sampler step thread) waits for the program's
first call; its messages and tools are the episode's prompt. Each `step` answers
the pending call with the policy's turn (its text, its tool calls parsed in the
checkpoint's own format, its tokens' log-probs: `observe_turn`), then waits for
the next call. A call whose messages continue the conversation (its history
equal to what came before, the answered assistant message included) appends
only the new messages (tool results, user turns): rendered by the run's chat
format, action mask 0. A call that does not (the program dropped or rewrote
messages, changed its tools, or added an assistant message of its own) starts a
new token segment from its messages (`StepResult.new_segment`): the tokens so
far are never trained, and the episode's metrics count `new_segments`.

The end. The episode ends when the program posts `/v1/episode/end` or returns.
The reward: `env.reward_fn` when set (it grades the final messages and the task,
and replaces any other), else the posted reward, else the function's return
value; with none of them the episode fails ("no reward": dropped and counted,
never trained as 0). A program still running after `time_limit_s` is failed as
`AgentTimeout`; one that raises or exits non-zero as `AgentProgramError`; one
that ends before its first call as `AgentProgramError` too. `close` ends the
session (a late call gets 409) and kills a command's process group; a function
cannot be killed, so its next call fails and ends it.

Commands run as the sampler's user, outside the tool sandbox: the program is
the run's own code, trusted like a plugin (docs/explanation/trust-boundaries.md).
"""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from typing import Any, Callable

from sao_jax.envs import plugins
from sao_jax.envs.agent import protocol, server
from sao_jax.envs.base import Environment, Message, SampledTurn, StepResult, Task


class AgentTimeout(Exception):
  """The agent program ran past `env.options.time_limit_s`."""


class AgentProgramError(Exception):
  """The agent program failed: raised, exited non-zero, or ended before calling."""


def _start_function(function: Callable, task: Task, session: server.Session, base_url: str):
  def run():
    try:
      value = function(task, base_url, session.api_key)
    except BaseException as error:  # the program's failure: its episode's
      session.post("exit", error)
      return
    session.post("exit", value)

  threading.Thread(target=run, daemon=True, name=f"agent-{session.episode}").start()
  return None


def _start_command(command: str, task: Task, session: server.Session, base_url: str):
  env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": session.api_key,
         "SAO_TASK_ID": task.id, "SAO_TASK_PROMPT": task.prompt}
  process = subprocess.Popen(shlex.split(command), env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)

  def wait():
    _, err = process.communicate()
    session.post("exit", None if process.returncode == 0 else AgentProgramError(
        f"the agent command exited with status {process.returncode}: "
        f"{err.decode('utf-8', 'replace')[-300:]!r}"))

  threading.Thread(target=wait, daemon=True, name=f"agent-{session.episode}").start()
  return process


class AgentEnv(Environment):
  """One run of an agent program per episode (module docstring)."""

  slow_reset = True

  def __init__(self, *, program: str, time_limit_s: float, limits: server.Limits,
               graded: bool, max_turns: int, max_observation_chars: int):
    super().__init__(max_turns=max_turns, max_observation_chars=max_observation_chars)
    self.program, self.time_limit_s, self.limits, self.graded = program, time_limit_s, limits, graded
    self._session: server.Session | None = None
    self._process: subprocess.Popen | None = None
    self._turn_sampled: SampledTurn | None = None

  # ---- the episode ----

  def _reset(self, task: Task) -> list[Message]:
    self._session = self._open(task)
    self._deadline = time.monotonic() + self.time_limit_s
    self._segments, self._reward = 1, None
    event = self._next_event()
    if event[0] != "call":
      raise AgentProgramError(f"the agent program ended before its first call ({event[0]}: "
                              f"{str(event[1])[:200]})")
    self._take(event[1])
    return list(self._request.messages)

  def observe_turn(self, turn: SampledTurn) -> None:
    self._turn_sampled = turn

  def _step(self, action: str) -> StepResult:
    request, session = self._request, self._session
    body, _, canonical = protocol.completion(
        request, self._turn_sampled, action, fmt=self.tool_format,
        call_ids=f"{session.episode}_{self.turn}")
    expected = self._history + (canonical,)
    session.answer(200, body)
    event = self._next_event()
    if event[0] != "call":
      return self._end(event)
    tools_before = self._request.tools
    self._take(event[1])
    new = self._request.canonical[len(expected):]
    continues = (self._request.canonical[:len(expected)] == expected and new
                 and self._request.tools == tools_before
                 and all(message[0] != "assistant" for message in new))
    if not continues:
      self._segments += 1
      return StepResult.next_messages(self._request.messages, new_segment=True)
    messages = self._request.messages[len(expected):]
    self.tool_calls += sum(message["role"] == "tool" for message in messages)
    return StepResult.next_messages(messages)

  def close(self) -> None:
    if self._session is not None:
      self._endpoint().close_session(self._session)
      self._session = None
    if self._process is not None and self._process.poll() is None:
      try:
        os.killpg(self._process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    self._process = None

  # ---- helpers ----

  def _endpoint(self) -> server.Endpoint:
    return server.Endpoint.shared(self.limits)

  def _open(self, task: Task) -> server.Session:
    """The episode's session, its program started on it."""
    endpoint = self._endpoint()
    session = endpoint.open_session()
    if plugins.is_import_path(self.program):
      function = plugins.load_object(self.program, what=f"env.options.program={self.program!r}")
      _start_function(function, task, session, endpoint.base_url)
    else:
      self._process = _start_command(self.program, task, session, endpoint.base_url)
    return session

  def _take(self, request: protocol.ChatRequest) -> None:
    self._request, self._history = request, request.canonical
    self.tools = list(request.tools or ())
    self.max_new_tokens = request.max_tokens

  def _next_event(self) -> tuple:
    try:
      return self._session.next_event(self._deadline - time.monotonic())
    except queue.Empty:
      raise AgentTimeout(f"the agent program ran past env.options.time_limit_s="
                         f"{self.time_limit_s:g} s without ending its episode") from None

  def _end(self, event: tuple) -> StepResult:
    kind, value = event
    if kind == "exit" and isinstance(value, BaseException):
      raise AgentProgramError(f"the agent program raised {type(value).__name__}: "
                              f"{str(value)[:300]}") from value
    metrics = {"new_segments": self._segments - 1}
    if self.graded:  # env.reward_fn grades the final messages (sao_jax.envs.rewards)
      return StepResult.finish(0.0, "agent_end", **metrics)
    if value is None:
      return StepResult.fail("the agent program ended its episode without a reward: POST "
                             "{'reward': x} to /v1/episode/end, return a number from the "
                             "function, or set env.reward_fn", **metrics)
    return StepResult.finish(value, "agent_reward", **metrics)


class ServedEnv(AgentEnv):
  """An episode of whichever client opens one next on an endpoint served alone
  (`server.Endpoint(open_on_call=True)`, `sao-eval --serve`): no program is started;
  `reset` waits, without a time limit, for a client's first call under a new episode
  name, and the episode ends when that client posts `/v1/episode/end` (its reward, or
  none) or after `time_limit_s` (`AgentTimeout`). `names[task.id]` is set to the
  episode's name when its client arrives."""

  def __init__(self, endpoint: server.Endpoint, names: dict[str, str], *, time_limit_s: float,
               max_turns: int, max_observation_chars: int):
    super().__init__(program="", time_limit_s=time_limit_s, limits=endpoint.limits,
                     graded=False, max_turns=max_turns,
                     max_observation_chars=max_observation_chars)
    self._served, self._names = endpoint, names

  def _endpoint(self) -> server.Endpoint:
    return self._served

  def _open(self, task: Task) -> server.Session:
    session = self._served.arrivals.get()
    if session is None:  # the server stops
      raise AgentProgramError("the endpoint stopped before a client opened this episode")
    self._names[task.id] = session.episode
    return session
