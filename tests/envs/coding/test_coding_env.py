"""Coding environment: rewards through the tool interface, containment, failures, long episodes."""

import dataclasses
import json
import os
import re

from sao_jax.envs import sandbox
from sao_jax.envs.base import play
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.coding import tasks as coding_tasks
from sao_jax.envs.coding.tools import format_tool_call as call

LIMITS = sandbox.SandboxLimits(wall_time_s=5.0, cpu_time_s=1, memory_mb=256, max_output_bytes=2000)
SUBMIT = call("submit")
# (difficulty, kind) pairs covering every difficulty and every bug kind.
SAMPLE = [(d, "mixed") for d in range(1, 6)] + [
    (2, "off_by_one"), (3, "wrong_operator"), (4, "missing_edge_case"), (5, "wrong_value")]


def make_env(**kwargs):
  return coding.CodingEnv(**{"max_turns": 20, "max_observation_chars": 4000,
                             "sandbox_limits": LIMITS, **kwargs})


def sample_tasks(per_pair=1):
  return [coding_generator.generate_task(i, seed=3, difficulty=d, kind=k)
          for d, k in SAMPLE for i in range(per_pair)]


def test_reset_gives_the_prompt_and_a_private_copy():
  env = make_env()
  task = coding_generator.generate_task(0, difficulty=2)
  system, user = env.reset(task)
  assert system == {"role": "system", "content": coding.SYSTEM_PROMPT}
  assert user["content"].startswith(task.prompt) and "tests/" in user["content"]
  files = sorted(task.metadata["files"]["repo"]) + [
      f"tests/{name}" for name in sorted(task.metadata["files"]["tests_visible"])]
  assert env.step(call("list")).observation == "\n".join(sorted(files + ["tests/"]))
  assert env.observation_role == "tool"


def test_scripted_agent_gets_reward_one_on_every_generated_task():
  env = make_env()
  for task in sample_tasks(per_pair=2):
    transcript = play(env, task, coding_generator.solution_actions(task))
    result = transcript.result
    assert (result.reward, result.reason, result.failure) == (1.0, "submit", None), task.id
    assert result.info["hidden_passed"] == result.info["hidden_total"] > 0
    tests_report = transcript.messages[-2]["content"]
    assert tests_report.endswith(" tests passed.") and "FAIL" not in tests_report, tests_report


def test_do_nothing_agent_gets_zero():
  env = make_env()
  for task in sample_tasks():
    result = play(env, task, [SUBMIT]).result
    assert (result.reward, result.failure) == (0.0, None), task.id
    assert result.info["hidden_passed"] < result.info["hidden_total"]


def test_partial_reward_is_the_fraction_of_hidden_tests_passed():
  task = coding_generator.generate_task(0, difficulty=4)
  result = play(make_env(partial_reward=True), task, [SUBMIT]).result
  assert 0.0 < result.reward == result.info["hidden_passed"] / result.info["hidden_total"] < 1.0
  fixed = play(make_env(partial_reward=True), task, coding_generator.solution_actions(task))
  assert fixed.result.reward == 1.0


def test_editing_the_tests_instead_of_the_code_gets_no_reward():
  env = make_env()
  task = coding_generator.generate_task(1, difficulty=2)
  env.reset(task)
  for name in task.metadata["files"]["tests_visible"]:
    old = env.workspace.read_text(f"tests/{name}")
    env.step(call("edit", path=f"tests/{name}", old=old, new="def test_ok():\n    pass\n"))
  assert env.step(call("run_tests")).observation.endswith("1 of 1 tests passed.")
  result = env.step(SUBMIT)
  assert (result.reward, result.failure) == (0.0, None)
  assert result.info["hidden_total"] > 1


def test_exiting_early_or_hanging_cannot_pass_hidden_tests():
  task = coding_generator.generate_task(0, difficulty=1)
  module = next(iter(task.metadata["files"]["repo"]))
  for sabotage in ("import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n",
                   "while True:\n    pass\n"):
    env = make_env()
    env.reset(task)
    source = env.workspace.read_text(module)
    env.step(call("edit", path=module, old=source[:20], new=sabotage + source[:20]))
    result = env.step(SUBMIT)
    assert (result.reward, result.failure, result.info["hidden_passed"]) == (0.0, None, 0), sabotage


REWRITE_TESTS = """import os, re
for _name in os.listdir("tests"):
    _path = os.path.join("tests", _name)
    _text = re.sub(r"(def test_\\w+\\(\\):\\n)    .*", r"\\1    pass", open(_path).read())
    open(_path, "w").write(_text)
"""


def test_code_that_rewrites_hidden_tests_while_graded_gains_nothing():
  task = coding_generator.generate_task(0, difficulty=3)
  baseline = play(make_env(), task, [SUBMIT]).result.info["hidden_passed"]
  env = make_env()
  env.reset(task)
  for module in task.metadata["files"]["repo"]:
    source = env.workspace.read_text(module)
    env.step(call("edit", path=module, old=source[:30], new=REWRITE_TESTS + source[:30]))
  result = env.step(SUBMIT)
  assert result.reward == 0.0 and result.info["hidden_passed"] <= baseline


def test_reward_is_also_given_when_the_turn_budget_runs_out():
  task = coding_generator.generate_task(2, difficulty=1)
  fix = coding_generator.solution_actions(task)[:2]  # view + edit, no submit
  actions = fix + [call("list")] * 3
  result = play(make_env(max_turns=len(actions)), task, actions).result
  assert (result.reward, result.reason, result.info["turns"]) == (1.0, "max_turns", 5)
  result = play(make_env(max_turns=2), task, ["thinking...", call("list")]).result
  assert (result.reward, result.reason) == (0.0, "max_turns")


def test_tool_errors_are_observations():
  env = make_env()
  task = coding_generator.generate_task(0, difficulty=1)
  env.reset(task)
  module = next(iter(task.metadata["files"]["repo"]))
  errors = {
      call("rm", path="x"): "error: unknown tool 'rm'",
      "```tool\n{not json}\n```": "error: the tool call is not valid JSON",
      call("edit", path=module, old="no such text", new=""): "error: the old text was not found",
      call("edit", path=module, old="    ", new=""): "error: the old text occurs",
      call("view", path=module, start=10_000): "error: lines 10000-",
      call("view", path="missing.py"): "error: 'missing.py' does not exist.",
      call("run_tests", path="missing.py"): "error: 'missing.py' does not exist.",
  }
  for action, message in errors.items():
    result = env.step(action)
    assert not result.done and result.observation.startswith(message), (action, result)
  assert env.step("I will just think.").observation == coding.NO_ACTION
  assert env.step(SUBMIT).info["tool_errors"] == len(errors)


def test_unpaired_surrogates_in_tool_arguments_are_tool_errors():
  # JSON "\ud800" is a lone surrogate: it escaped create/edit/view/list/python as a
  # UnicodeEncodeError, so the policy could end any episode as an environment failure
  # (dropped from training) instead of taking its reward of 0.
  env = make_env()
  task = coding_generator.generate_task(0, difficulty=1)
  env.reset(task)
  module = next(iter(task.metadata["files"]["repo"]))
  actions = [call("create", path="b.py", content="\ud800"), call("view", path="\udfff.py"),
             call("edit", path=module, old="def", new="\ud800"), call("list", path="\ud800"),
             call("python", code="print('\ud800')")]
  for action in actions:
    result = env.step(action)
    assert not result.done and result.observation.startswith("error: ") and (
        "unpaired surrogate" in result.observation), (action, result)
  assert env.step(SUBMIT).info["tool_errors"] == len(actions)


def test_writes_outside_the_copy_are_blocked(tmp_path):
  env = make_env()
  env.reset(coding_generator.generate_task(0, difficulty=1))
  outside = tmp_path / "escaped.txt"
  for action in (call("create", path=str(outside), content="x"),
                 call("create", path="../../escaped.txt", content="x")):
    assert env.step(action).observation.startswith("error: ")
  for code in (f"open({str(outside)!r}, 'w').write('x')",
               "open('../escaped.txt', 'w').write('x')",
               f"import os\nos.symlink({str(tmp_path)!r}, 'out')",
               "import os\nos.symlink('/etc/passwd', 'passwd')"):
    observation = env.step(call("python", code=code)).observation
    assert "PermissionError" in observation and "not allowed" in observation, observation
  assert not outside.exists()
  assert not os.path.exists(os.path.join(os.path.dirname(env.workspace.root), "escaped.txt"))
  # Inside its copy the agent's code may write; the copy is thrown away afterwards.
  made = env.step(call("python", code="open('made.txt', 'w').write('made')\n"
                                       "print(open('made.txt').read())"))
  assert made.observation == "made"
  assert env.step(call("view", path="made.txt")).observation == "error: 'made.txt' does not exist."


def test_long_running_huge_output_and_network_are_contained():
  env = make_env()
  env.reset(coding_generator.generate_task(0, difficulty=1))
  spin = env.step(call("python", code="while True:\n    pass\n")).observation
  assert "[killed: exceeded the 1 s CPU time limit]" in spin
  sleep = make_env(sandbox_limits=dataclasses.replace(LIMITS, wall_time_s=1.0))
  sleep.reset(coding_generator.generate_task(0, difficulty=1))
  assert "[killed: exceeded the 1 s time limit]" in sleep.step(
      call("python", code="import time\ntime.sleep(60)")).observation
  flood = env.step(call("python", code="print('x' * 10**6)")).observation
  assert flood.endswith(f"[stdout truncated to {LIMITS.max_output_bytes} bytes]")
  assert len(flood) < LIMITS.max_output_bytes + 100
  for code in ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)",
               "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=1)"):
    observation = env.step(call("python", code=code)).observation
    assert "not allowed" in observation, observation


def test_one_run_tests_call_runs_a_bounded_number_of_test_files(monkeypatch):
  """Each test file is a sandbox run of up to wall_time_s: 2000 files that sleep would
  stall the sampler for hours in one call. (Quick files here; the count is what matters.)"""
  started = []
  real = coding.runner.run_test_file

  def counted(root, path, source, limits, **kwargs):
    started.append(path)
    return real(root, path, source, limits, **kwargs)
  monkeypatch.setattr(coding.runner, "run_test_file", counted)
  env = make_env()
  env.reset(coding_generator.generate_task(0, difficulty=1))
  extra = coding.MAX_TEST_FILES + 5
  for i in range(extra):
    env.step(call("create", path=f"tests/test_many_{i:02d}.py",
                  content="def test_quick():\n    pass\n"))
  observation = env.step(call("run_tests")).observation
  assert len(started) == coding.MAX_TEST_FILES
  shown = sorted(coding.runner.discover(env.workspace.root, "tests"))[:coding.MAX_TEST_FILES]
  assert started == shown
  assert f"{extra + 1 - coding.MAX_TEST_FILES} more test files were not run" in observation
  started.clear()
  env.step(call("run_tests", path=f"tests/test_many_{extra - 1:02d}.py"))
  assert started == [f"tests/test_many_{extra - 1:02d}.py"]


def test_sandbox_harness_failure_is_an_environment_failure(monkeypatch):
  task = coding_generator.generate_task(0, difficulty=1)

  def broken(code, limits, **kwargs):
    raise sandbox.SandboxError("interpreter missing")
  monkeypatch.setattr(sandbox, "run_python", broken)
  for action in (SUBMIT, call("run_tests"), call("python", code="print(1)")):
    env = make_env()
    env.reset(task)
    result = env.step(action)
    assert result.done and result.reward == 0.0 and "interpreter missing" in result.failure


def test_a_runner_that_never_starts_is_an_environment_failure(monkeypatch):
  real = sandbox.run_python

  def starved(code, limits, **kwargs):  # As if killed before the runner came up.
    return dataclasses.replace(real("pass", limits, **kwargs), stdout="", exit_code=-9,
                               timed_out=True, killed_reason="wall_time")
  monkeypatch.setattr(sandbox, "run_python", starved)
  env = make_env()
  env.reset(coding_generator.generate_task(0, difficulty=1))
  env.step(call("create", path="tests/test_extra.py", content="def test_a():\n    pass\n"))
  result = env.step(call("run_tests"))
  assert result.done and "test runner did not start" in result.failure


def test_episode_files_are_removed():
  env = make_env()
  task = coding_generator.generate_task(0, difficulty=1)
  env.reset(task)
  first = env.episode_dir
  env.reset(task)
  assert not os.path.exists(first) and os.path.isdir(env.episode_dir)
  second = env.episode_dir
  env.step(SUBMIT)
  assert not os.path.exists(second)
  env.reset(task)
  third = env.episode_dir
  env.close()
  assert not os.path.exists(third)


def test_directory_task_end_to_end(tmp_path):
  task_dir = tmp_path / "add"
  for rel, text in {"repo/calc.py": "def add(a, b):\n    return a - b\n",
                    "tests_visible/test_calc.py": "from calc import add\nassert add(2, 0) == 2\n",
                    "tests_hidden/test_calc.py": ("from calc import add\n\n\ndef test_one():\n"
                                                  "    assert add(1, 2) == 3\n\n\n"
                                                  "def test_zero():\n    assert add(0, 0) == 0\n")
                    }.items():
    (task_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    (task_dir / rel).write_text(text)
  (task_dir / "task.json").write_text(json.dumps({"problem": "add(1, 2) is not 3."}))
  task = coding_tasks.load_task(task_dir)
  env = make_env(partial_reward=True)
  assert play(env, task, [SUBMIT]).result.reward == 0.5  # test_zero passes even unfixed.
  transcript = play(env, task, [call("run_tests"),
                                call("edit", path="calc.py", old="a - b", new="a + b"), SUBMIT])
  assert transcript.messages[3]["content"].startswith("tests/test_calc.py: 1 of 1 tests passed")
  assert transcript.result.reward == 1.0
  assert (task_dir / "repo" / "calc.py").read_text().endswith("a - b\n")  # Snapshot untouched.


def test_long_episode_stays_within_the_turn_budget():
  max_turns = 300
  env = make_env(max_turns=max_turns, max_observation_chars=3000)
  task = coding_generator.generate_task(4, difficulty=3)
  big = "".join(f"line {i}: " + "x" * 60 + "\n" for i in range(400))
  fix = coding_generator.solution_actions(task)[1]  # the edit
  view = call("view", path="notes.txt")
  actions = [call("create", path="notes.txt", content=big)] + [view] * (max_turns - 3) + [
      fix, view]
  transcript = play(env, task, actions)
  assert (transcript.result.reward, transcript.result.reason) == (1.0, "max_turns")
  assert transcript.result.info["turns"] == max_turns
  observations = [m["content"] for m in transcript.messages if m["role"] == "tool"]
  assert len(observations) == max_turns - 1
  views = observations[1:-1]
  assert all(len(o) > 20 * len(view) for o in views)
  assert env.episode_dir is None  # Cleaned up at the end.
  assert all(re.search(r"\[observation truncated: showing 3000 of \d{5} characters\]$", o)
             for o in views)


def test_a_task_without_hidden_tests_is_an_environment_failure():
  task = coding_generator.generate_task(0, difficulty=1)
  broken = dataclasses.replace(task, metadata={**task.metadata, "hidden_calls": ()})
  result = play(make_env(), broken, [SUBMIT]).result
  assert result.failure == f"task {task.id!r} has no hidden tests"
