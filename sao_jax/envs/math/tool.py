r"""Tool-integrated math reasoning (docs/algorithm.md §6): Python tool calls, verified answer.

Formats (also stated to the model in `SYSTEM_PROMPT`):

- Tool call: a fenced block opened by ```` ```python ```` (or ```` ```py ````)
  and closed by ```` ``` ````. Only the first block of a turn runs; the sampler
  can stop generation at the closing fence. Each call runs in a fresh sandbox
  (`sao_jax.envs.sandbox`): no state carries over between calls.
- Final answer: `\boxed{...}`; the last one in the turn counts.

With a chat template that has a native tool-call format (`Environment.tool_format`:
Qwen's `<tool_call>`, Llama 3.1's JSON; `sao_jax.chat.tool_calls`), the tool is
offered as the function `PYTHON_TOOL` instead (`NATIVE_SYSTEM_PROMPT`), a call
is `python(code=...)` in that format, and a malformed call, another tool's name
or a bad argument gets an observation saying what was wrong (the turn counts).

Per assistant turn: a final answer ends the episode with reward 1 if
`answers.verify_answer` accepts it, else 0 (any tool call in the same turn is
ignored). Otherwise a tool call runs and its output is the observation (role
"tool"). A turn with neither gets a reminder of the format and uses up a turn.
A sandbox harness failure is an environment failure, not reward 0.
"""

from __future__ import annotations

import re

from sao_jax.chat import tool_calls
from sao_jax.envs import sandbox
from sao_jax.envs.base import Environment, Message, StepResult, Task
from sao_jax.envs.math import answers, checker

SYSTEM_PROMPT = (
    "Solve the math problem. You may run Python to help: write a code block that starts "
    "with ```python on its own line and ends with ```; its printed output will be sent "
    "back to you. Only the first code block of a message runs, and each run starts from "
    "a fresh interpreter. When you are done, give the final answer as \\boxed{answer}.")
NO_ACTION = ("No Python code block and no final answer found. Run code in a ```python block, "
             "or give the final answer as \\boxed{answer}.")
PYTHON_TOOL = tool_calls.function(
    "python", "Run Python code in a fresh interpreter (time-limited, no network) and return "
    "what it prints.", {"code": {"type": "string", "description": "The Python program to run."}})
NATIVE_SYSTEM_PROMPT = (
    "Solve the math problem. You may call the python tool to run code; its printed output "
    "will be sent back to you. Only the first tool call of a message runs, and each run starts "
    "from a fresh interpreter. When you are done, give the final answer as \\boxed{answer}.")
NATIVE_NO_ACTION = ("No tool call and no final answer found. Call the python tool, or give "
                    "the final answer as \\boxed{answer}.")
_CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
  """The first fenced Python block of `text`, or None."""
  match = _CODE_BLOCK.search(text)
  return match.group(1) if match else None


class MathToolEnv(Environment):
  """Reward 1 for a verified `\\boxed{}` answer, 0 otherwise; Python tool calls between."""

  observation_role = "tool"
  tools = (PYTHON_TOOL,)

  def __init__(self, *, max_turns: int = 8, max_observation_chars: int = 4096,
               sandbox_limits: sandbox.SandboxLimits = sandbox.SandboxLimits(),
               isolation: str = sandbox.DEFAULT_SANDBOX):
    super().__init__(max_turns=max_turns, max_observation_chars=max_observation_chars)
    sandbox_limits.validate()
    sandbox.require_isolation(isolation)
    # Scratch directories of tool runs whose process was killed (`sandbox.scratch`).
    self.reclaimed = sandbox.reclaim_scratch()
    checker.start()
    self.sandbox_limits = sandbox_limits
    self.isolation = isolation

  def _reset(self, task: Task) -> list[Message]:
    system = SYSTEM_PROMPT if self.tool_format == "fenced" else NATIVE_SYSTEM_PROMPT
    return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

  def _code(self, action: str) -> str | StepResult:
    """The code the turn runs, or the observation telling the model why there is none."""
    if self.tool_format == "fenced":
      code = extract_code(action)
      return StepResult.next(NO_ACTION) if code is None else code
    try:
      call = tool_calls.read(action, self.tool_format, self.tools)
    except tool_calls.ToolCallError as error:
      return StepResult.next(str(error))
    return StepResult.next(NATIVE_NO_ACTION) if call is None else call.arguments["code"]

  def write_turn(self, turn: tool_calls.Turn) -> str:
    """A demonstration's turn; a "fenced" call of python is a ```` ```python ```` block."""
    if self.tool_format != "fenced" or turn.call is None:
      return super().write_turn(turn)
    return f"{turn.text}\n\n```python\n{turn.call.arguments['code']}\n```"

  def _step(self, action: str) -> StepResult:
    predicted = answers.extract_boxed(action)
    if predicted is not None:
      correct = answers.verify_answer(predicted, self.task.answer)
      return StepResult.finish(1.0 if correct else 0.0, "answer", predicted=predicted,
                               correct=correct, tool_calls=self.tool_calls, turns=self.turn)
    code = self._code(action)
    if isinstance(code, StepResult):
      return code
    try:
      result = sandbox.run_python(code, self.sandbox_limits, isolation=self.isolation)
    except sandbox.SandboxError as e:
      return StepResult.fail(f"python sandbox failed: {e}", tool_calls=self.tool_calls)
    self.tool_calls += 1
    return StepResult.next(sandbox.format_tool_output(result, self.sandbox_limits),
                           tool_exit_code=result.exit_code, tool_killed=result.killed_reason)
