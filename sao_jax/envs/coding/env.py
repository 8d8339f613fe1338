r"""Coding agent environment (SWE-style, docs/algorithm.md §6): fix a repository with tools.

An episode works on a fresh copy of the task's repository with the visible
tests at `<tests_dir>/` (task formats: `tasks`, generated tasks:
`generator`). Each assistant turn may hold one tool call, made the way the
checkpoint's chat template teaches (`sao_jax.chat.tool_calls`; the template is
given `tools.TOOLS` as `tools=`): Qwen's `<tool_call>` JSON, Llama 3.1's JSON
turn, or under ChatML a fenced block the system prompt describes,

    ```tool
    {"name": "edit", "arguments": {"path": "mathutil.py", "old": "b + 1", "new": "b"}}
    ```

(only the first call of a turn runs). Tools, with their arguments (`?` =
optional; the schemas are `tools.TOOLS`):

- `list {path?="."}`: files and directories under `path`.
- `view {path, start?, end?}`: numbered lines `start`..`end` of a file.
- `search {text, path?="."}`: lines containing `text` (literal, case-sensitive).
- `edit {path, old, new}`: replace the one occurrence of `old` in a file.
- `create {path, content}`: create a new file (not overwrite one).
- `run_tests {path?}`: run one test file, or the visible test files (the
  first `MAX_TEST_FILES` by name) (`runner`), and report each test.
- `python {code}`: run Python in the sandbox (`sao_jax.envs.sandbox`) on a
  throwaway copy of the repository (working directory and first `sys.path`
  entry); what it writes is discarded, only `edit` and `create` change files.
- `submit {}`: end the episode and grade it.

Observations have role "tool". A turn without a tool block gets a reminder of
the format; a malformed call, unknown tool, bad argument, missing or ambiguous
edit text, out-of-range view, escaping path, ... gets an `error: ...`
observation. Either way the episode goes on and the turn counts.

Reward, at `submit` or when the turn budget runs out (the last turn's tool runs
first), by `grader`: only the agent's `.py` files outside `<tests_dir>/` (the
walk bounded by `walk`) reach a fresh grading copy. Generated tasks, and task
directories whose hidden tests `convert` rewrites into calls, are graded by
calls whose expected values never leave this process; only task directories
loaded with `allow_forgeable_grading` run each hidden test file on its own copy
plus the hidden tests, in the agent's interpreter. Reward 1 if every
hidden test passes, else 0; with `partial_reward=True` the fraction that pass.
A working copy over the limits (too many or too deep files, too long paths, too
many bytes) is reward 0 with `info["grading_error"]`: the agent's own doing. A
harness failure (the sandbox or test runner cannot start, e.g. killed by the
time limit before it came up; the grading copy cannot be written; the task has
no hidden tests) is `StepResult.fail`, not reward 0. So is a sandbox harness
failure during `run_tests` or `python`.

Containment: file tools are confined to the copy (`tools.Workspace`) and bounded
(`walk`); `run_tests`, `python` and grading run in the kernel sandbox
(`sao_jax.envs.sandbox`: only their own copy is mounted, so episodes never see
each other's files and the hidden tests are never there); the episode's
directory (which only this process can enter) is deleted when the episode ends,
on the next `reset`, on `close()` or when the environment is garbage-collected.
"""

from __future__ import annotations

import os
import resource
import weakref

from sao_jax.chat import tool_calls
from sao_jax.config.checks import fail
from sao_jax.envs import sandbox
from sao_jax.envs.base import Environment, Message, StepResult, Task
from sao_jax.envs.coding import grader, runner, tasks, walk
from sao_jax.envs.coding.tools import MAX_CALL_CHARS, TOOLS, ToolError, Workspace

_INTRO = ("You are fixing a bug in a Python repository with the tools below. Paths are "
          "relative to the repository root; inside JSON strings write newlines as \\n. Call "
          "submit when you are done: hidden tests then decide whether the fix is accepted.")
SYSTEM_PROMPT = (  # ChatML ("fenced"): the prompt teaches the format and lists the tools
    f"{_INTRO}\n\n{tool_calls.describe_fenced(TOOLS)}\n\nExample:\n"
    + tool_calls.render(tool_calls.ToolCall("view", {"path": "a.py", "start": 1, "end": 20}),
                        "fenced"))
# A native format: the template shows the tools' schemas and how to call them.
NATIVE_SYSTEM_PROMPT = (f"{_INTRO} Only the first tool call of a message runs, and its result "
                        "is sent back to you.")
# Test files one `run_tests` call runs (bounds its time: each may take wall_time_s).
MAX_TEST_FILES = 10
# What the sandbox's work tmpfs must hold: the largest grading copy, the agent's files
# plus the hidden tests, each within `walk`'s limits, every file taking at least a page.
# A copy that does not fit stops the test runner before it starts, an environment
# failure (the episode dropped, not scored) the agent could cause by filling its copy.
MIN_SANDBOX_FILES = 2 * walk.MAX_ENTRIES + 2  # + the root and the tests directory
MIN_SANDBOX_DISK_MB = -(-2 * (walk.MAX_TOTAL_BYTES + walk.MAX_ENTRIES * resource.getpagesize())
                        >> 20)
NO_ACTION = ("No tool call found. Call a tool with a block that starts with ```tool on its own "
             'line, holds {"name": ..., "arguments": {...}} and ends with ```; use submit when '
             "done.")
NATIVE_NO_ACTION = "No tool call found. Call one of the tools; use submit when done."


class CodingEnv(Environment):
  """Fix a repository through tool calls; hidden tests give the reward (see module docstring)."""

  observation_role = "tool"
  tools = TOOLS

  def __init__(self, *, max_turns: int = 50, max_observation_chars: int = 8192,
               sandbox_limits: sandbox.SandboxLimits = sandbox.SandboxLimits(),
               partial_reward: bool = False, isolation: str = sandbox.DEFAULT_SANDBOX):
    super().__init__(max_turns=max_turns, max_observation_chars=max_observation_chars)
    sandbox_limits.validate()
    if sandbox_limits.disk_mb < MIN_SANDBOX_DISK_MB:
      fail("env.tool", "disk_mb", sandbox_limits.disk_mb,
           f"the coding environment needs at least {MIN_SANDBOX_DISK_MB} for a full copy")
    if sandbox_limits.max_files < MIN_SANDBOX_FILES:
      fail("env.tool", "max_files", sandbox_limits.max_files,
           f"the coding environment needs at least {MIN_SANDBOX_FILES} for a full copy")
    sandbox.require_isolation(isolation)
    # Episode and tool-run directories of killed processes (`sandbox.scratch`).
    self.reclaimed = sandbox.reclaim_scratch()
    self.sandbox_limits = sandbox_limits
    self.isolation = isolation
    self.partial_reward = partial_reward
    self.episode_dir: str | None = None
    self.tests_dir = ""
    self.workspace: Workspace | None = None
    self.tool_errors = 0
    self._cleanup = None

  def _reset(self, task: Task) -> list[Message]:
    self.close()
    self.episode_dir = sandbox.make_scratch("sao_coding_")
    self._cleanup = weakref.finalize(self, sandbox.remove_tree, self.episode_dir)
    self.tests_dir = task.metadata["tests_dir"]
    task_files = os.path.join(self.episode_dir, "task")
    tasks.materialize(task, task_files)
    root = os.path.join(self.episode_dir, "work")
    os.rename(os.path.join(task_files, "repo"), root)
    os.rename(os.path.join(task_files, "tests_visible"), os.path.join(root, self.tests_dir))
    self.workspace = Workspace(root)
    self.tool_errors = 0
    system = SYSTEM_PROMPT if self.tool_format == "fenced" else NATIVE_SYSTEM_PROMPT
    return [{"role": "system", "content": system},
            {"role": "user", "content": (
                f"{task.prompt}\n\nThe repository is checked out in your working directory. "
                f"The visible tests are in {self.tests_dir}/; run them with run_tests, and "
                "call submit when you are done.")}]

  def close(self) -> None:
    """Deletes the current episode's files (also done when an episode ends)."""
    if self._cleanup is not None:
      self._cleanup()
    self._cleanup = self.episode_dir = self.workspace = None

  def _step(self, action: str) -> StepResult:
    call = None
    try:
      call = tool_calls.read(action, self.tool_format, self.tools, max_chars=MAX_CALL_CHARS)
      if call is not None and call.name == "submit":
        self.tool_calls += 1
        return self._grade("submit")
      no_action = NO_ACTION if self.tool_format == "fenced" else NATIVE_NO_ACTION
      observation = no_action if call is None else self._run_tool(call)
    except tool_calls.ToolCallError as e:  # its message starts with "error: "
      self.tool_errors += 1
      observation = str(e)
    except ToolError as e:
      self.tool_errors += 1
      observation = f"error: {e}"
    except sandbox.SandboxError as e:
      self.close()
      return StepResult.fail(f"tool sandbox failed: {e}", tool_calls=self.tool_calls)
    if self.turn >= self.max_turns:
      return self._grade("max_turns")
    return StepResult.next(observation, tool=None if call is None else call.name)

  def _run_tool(self, call: tool_calls.ToolCall) -> str:
    self.tool_calls += 1
    if call.name in ("run_tests", "python"):
      try:  # Bounded before the sandbox copies it.
        walk.walk(self.workspace.root)
      except walk.WalkLimit as e:
        raise ToolError(f"the repository is over the limits ({e}); delete files first.") from None
    if call.name == "run_tests":
      return self._run_visible_tests(call.arguments.get("path"))
    if call.name == "python":
      result = sandbox.run_python(call.arguments["code"], self.sandbox_limits,
                                  workdir=self.workspace.root, isolation=self.isolation)
      return self._relative(sandbox.format_tool_output(result, self.sandbox_limits))
    tool = {"list": self.workspace.list, "view": self.workspace.view,
            "search": self.workspace.search, "edit": self.workspace.edit,
            "create": self.workspace.create}[call.name]
    return tool(**call.arguments)

  def _run_visible_tests(self, path: str | None) -> str:
    root = self.workspace.root
    paths = runner.discover(root, self.tests_dir) if path is None else [path]
    if not paths:
      raise ToolError(f"no test*.py files in {self.tests_dir}/; pass a test file as path.")
    # Each file is its own sandbox run of up to wall_time_s: without a cap, an agent
    # that creates 2000 test files stalls this process for hours in one call.
    skipped = paths[MAX_TEST_FILES:]
    paths = paths[:MAX_TEST_FILES]
    results = []
    for rel in paths:
      source = self.workspace.read_text(rel)
      results.append(runner.run_test_file(
          root, os.path.relpath(self.workspace.resolve(rel), root), source, self.sandbox_limits,
          isolation=self.isolation))
    passed = sum(len(r.passed) for r in results)
    total = sum(len(r.names) for r in results)
    summary = f"{passed} of {total} tests passed."
    if skipped:
      summary += (f" {len(skipped)} more test files were not run (run_tests runs at most "
                  f"{MAX_TEST_FILES} at once, the first by name): pass a path to run one.")
    return self._relative("\n\n".join([r.report for r in results] + [summary]))

  def _relative(self, text: str) -> str:
    """`text` with the copy's absolute path dropped from paths (as in tracebacks)."""
    return text.replace(self.workspace.root + os.sep, "")

  def _grade(self, reason: str) -> StepResult:
    """Scores the episode with the hidden tests and ends it either way."""
    info = {"tool_calls": self.tool_calls, "tool_errors": self.tool_errors, "turns": self.turn}
    calls = self.task.metadata.get("hidden_calls")
    try:
      sources = grader.collect_sources(self.workspace.root, skip=self.tests_dir)
      if calls:
        verdicts = grader.grade_calls(self._grading_copy(sources), calls, self.sandbox_limits,
                                      isolation=self.isolation)
        # A test passes when every call in it does (a task directory's test may make several).
        tests: dict[str, bool] = {}
        for row, verdict in zip(calls, verdicts):
          tests[row["name"]] = tests.get(row["name"], True) and verdict
        passed, total = sum(tests.values()), len(tests)
      else:
        passed, total = self._run_hidden_test_files(sources)
    except walk.WalkLimit as e:  # The agent's own files: a failed episode, not the env's.
      return StepResult.finish(0.0, reason, hidden_passed=0, hidden_total=len(calls or ()),
                               grading_error=f"the repository is over the limits: {e}", **info)
    except (sandbox.SandboxError, OSError) as e:
      return StepResult.fail(f"grading failed: {e}", **info)
    finally:
      self.close()
    if total == 0:
      return StepResult.fail(f"task {self.task.id!r} has no hidden tests", **info)
    reward = passed / total if self.partial_reward else float(passed == total)
    return StepResult.finish(reward, reason, hidden_passed=passed, hidden_total=total, **info)

  def _grading_copy(self, sources: dict[str, bytes]) -> str:
    """A fresh directory holding only `sources` (the agent's `.py` files)."""
    grading = os.path.join(self.episode_dir, "grade")
    sandbox.remove_tree(grading)
    grader.write_tree(sources, grading)
    return grading

  def _run_hidden_test_files(self, sources: dict[str, bytes]) -> tuple[int, int]:
    """(passed, total) over the hidden test files, each on its own fresh grading copy
    of the agent's `.py` files plus the hidden tests (code that rewrites the next
    file's tests while one runs gains nothing)."""
    hidden_dir = os.path.join(self.episode_dir, "task", "tests_hidden")
    if not os.path.isdir(hidden_dir):
      return 0, 0
    try:
      entries = walk.walk(hidden_dir)
    except walk.WalkLimit as e:  # The task's files, not the agent's.
      raise sandbox.SandboxError(f"the task's hidden tests are over the limits: {e}") from None
    hidden = {}
    for entry in entries:
      if not entry.is_dir:
        with open(os.path.join(hidden_dir, entry.rel), "rb") as f:
          hidden[os.path.join(self.tests_dir, entry.rel)] = f.read()
    passed = total = 0
    for rel in runner.discover(os.path.join(self.episode_dir, "task"), "tests_hidden"):
      path = os.path.join(self.tests_dir, os.path.basename(rel))
      grading = self._grading_copy({**sources, **hidden})
      result = runner.run_test_file(grading, path, hidden[path].decode("utf-8"),
                                    self.sandbox_limits, isolation=self.isolation)
      passed, total = passed + len(result.passed), total + len(result.names)
    return passed, total
