"""Forged rewards: an agent that leaves the bug in and attacks the grader instead
earns 0 (and never an environment failure that would drop the episode).

Each forgery is code prepended to the buggy module (as an agent would with
`edit`), or files placed in its working copy, then `submit`.
"""

import dataclasses
import os
import py_compile
import sys
import tempfile

import pytest

from sao_jax.envs import sandbox
from sao_jax.envs.base import play
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.coding import grader
from sao_jax.envs.coding import tasks as coding_tasks
from sao_jax.envs.coding.tools import format_tool_call as call

LIMITS = sandbox.SandboxLimits(wall_time_s=10.0, cpu_time_s=2, memory_mb=256)
TASK = coding_generator.generate_task(0, difficulty=1)
MODULE = next(iter(TASK.metadata["files"]["repo"]))

# Finds the grader's module globals by walking up the stack from the import.
_RUNNER_GLOBALS = """
import sys as _sys, os as _os
_frame = _sys._getframe()
while _frame is not None and '_MARK' not in _frame.f_globals:
    _frame = _frame.f_back
_g = _frame.f_globals if _frame is not None else {}
"""

FORGERIES = {
    "print_pass_lines": _RUNNER_GLOBALS + """
if _g:
    _os.write(1, ''.join(f"{_g['_MARK']} PASS {n}\\n" for n in _g.get('_NAMES', ())).encode())
    _os._exit(0)
""",
    "replace_runner_functions": _RUNNER_GLOBALS + """
if '_call' in _g:
    _g['_call'] = lambda fn: None
""",
    "poisoned_builtins_always_equal": """
import builtins as _builtins
class _Equal:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
_real_type = _builtins.type
_builtins.type = lambda *a: int if len(a) == 1 else _real_type(*a)
def _always_equal(*args, **kwargs):
    return _Equal()
""",
    "answer_from_hidden_tests": """
import ast as _ast, os as _os
_table = {}
for _dir, _, _names in _os.walk('.'):
    for _name in _names:
        if _name.startswith('test') and _name.endswith('.py'):
            for _node in _ast.walk(_ast.parse(open(_os.path.join(_dir, _name)).read())):
                if (isinstance(_node, _ast.Call) and getattr(_node.func, 'id', '') == '_check'
                        and isinstance(_node.args[0], _ast.Call)):
                    _key = (_node.args[0].func.id,
                            repr(tuple(_ast.literal_eval(a) for a in _node.args[0].args)))
                    _table[_key] = _ast.literal_eval(_node.args[1])
""",
    "settrace_rewrites_the_checker": """
import sys as _sys
def _tracer(frame, event, arg):
    if event == 'line' and 'want' in frame.f_locals and 'got' in frame.f_locals:
        frame.f_locals['got'] = frame.f_locals['want']
    return _tracer
_sys.settrace(_tracer)
""",
}
# Appended after the module's functions: route every public function through the forgery.
_WRAP = {
    # The buggy code may raise before any check runs: swallow that too.
    "settrace_rewrites_the_checker": """
def _quiet(fn):
    def call(*args):
        try:
            return fn(*args)
        except Exception:
            return None
    return call
for _n, _v in list(globals().items()):
    if callable(_v) and not _n.startswith('_') and getattr(_v, '__module__', '') == __name__:
        globals()[_n] = _quiet(_v)
""",
    "poisoned_builtins_always_equal": """
for _n, _v in list(globals().items()):
    if callable(_v) and not _n.startswith('_') and _v.__module__ == __name__:
        globals()[_n] = _always_equal
""",
    "answer_from_hidden_tests": """
def _wrap(name, fn):
    def lookup(*args):
        key = (name, repr(args))
        return _table[key] if key in _table else fn(*args)
    return lookup
for _n, _v in list(globals().items()):
    if callable(_v) and not _n.startswith('_') and getattr(_v, '__module__', '') == __name__:
        globals()[_n] = _wrap(_n, _v)
""",
}


def make_env():
  return coding.CodingEnv(max_turns=10, max_observation_chars=4000, sandbox_limits=LIMITS)


def assert_zero(result):
  assert result.done and result.failure is None, result
  assert result.reward == 0.0 and result.info["hidden_passed"] < result.info["hidden_total"]


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_in_process_forgeries_earn_zero(forgery):
  env = make_env()
  env.reset(TASK)
  source = env.workspace.read_text(MODULE)
  forged = FORGERIES[forgery] + source + _WRAP.get(forgery, "")
  env.step(call("edit", path=MODULE, old=source, new=forged))
  assert_zero(env.step(call("submit")))


def test_the_untouched_buggy_module_earns_zero_and_the_fix_earns_one():
  assert_zero(play(make_env(), TASK, [call("submit")]).result)  # The baseline above.
  assert play(make_env(), TASK, coding_generator.solution_actions(TASK)).result.reward == 1.0


def _special_case_the_report(task):
  """The `edit` that leaves the bug in but returns the statement's expected value
  for the reported call (the first hidden call the buggy function gets wrong)."""
  edit = task.metadata["fix"][0]
  name = edit["new"].split("def ", 1)[1].split("(", 1)[0]
  correct = coding_generator.compile_function(edit["new"], name)
  wrong = coding_generator.compile_function(edit["old"], name)
  calls = [grader.values.decode(c["args"])
           for c in task.metadata["hidden_calls"] if c["function"] == name]
  outcome = coding_generator.outcome
  reported = next(args for args in calls if outcome(wrong, args) != outcome(correct, args))
  wrapper = (f"\n\ndef {name}(*args):\n    if args == {reported!r}:\n"
             f"        return {correct(*reported)!r}\n    return _buggy(*args)\n")
  return call("edit", path=edit["path"], old=edit["old"],
              new=edit["old"].replace(f"def {name}(", "def _buggy(", 1) + wrapper)


# Tasks whose edge and random cases show the bug on the reported call only
# (fizzbuzz(15), is_palindrome("Race car"), is_leap(2000)), though other inputs show it too.
@pytest.mark.parametrize("index", [3, 7, 9])
def test_special_casing_the_reported_call_earns_zero(index):
  task = coding_generator.generate_task(index, difficulty=1, kind="missing_edge_case")
  env = make_env()
  env.reset(task)
  assert env.step(_special_case_the_report(task)).observation.startswith("edited ")
  visible = env.step(call("run_tests")).observation
  assert visible.endswith("tests passed.") and "FAIL" not in visible, visible  # A real hack.
  assert_zero(env.step(call("submit")))


@pytest.mark.parametrize("value", [True, None, "\N{GRINNING FACE}", float("inf"),
                                   [False, {"k": None}]])
def test_call_arguments_of_every_gradable_type_reach_the_code_intact(tmp_path, value):
  """Arguments crossed into the runner as JSON pasted into Python source: `true`, `null`
  and `Infinity` are no Python names (the runner died, failing every call) and a
  character beyond the BMP arrived as two lone surrogates."""
  (tmp_path / "same.py").write_text("def same(x):\n    return [x, ascii(x)]\n")
  calls = [{"module": "same", "function": "same", "args": grader.values.encode((value,)),
            "expected": grader.values.encode([value, ascii(value)])}]
  assert grader.grade_calls(str(tmp_path), calls, LIMITS) == [True]


def test_stale_bytecode_is_never_loaded(tmp_path):
  """An unchecked-hash .pyc of the fixed module next to the buggy source."""
  env = make_env()
  env.reset(TASK)
  fixed = tmp_path / MODULE
  text = env.workspace.read_text(MODULE)
  for edit in TASK.metadata["fix"]:
    text = text.replace(edit["old"], edit["new"])
  fixed.write_text(text)
  tag = sys.implementation.cache_tag
  py_compile.compile(str(fixed), cfile=os.path.join(
      env.workspace.root, "__pycache__", f"{MODULE[:-3]}.{tag}.pyc"),
      invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
  assert_zero(env.step(call("submit")))


def test_hidden_tests_are_never_readable_during_the_episode(tmp_path):
  marker = "HIDDEN_MARKER_7f3a"
  task_dir = tmp_path / "task"
  for rel, text in {"repo/calc.py": "def add(a, b):\n    return a - b\n",
                    "tests_visible/test_calc.py": "from calc import add\nassert add(2, 0) == 2\n",
                    "tests_hidden/test_calc.py": (f"# {marker}\nfrom calc import add\n\n\n"
                                                  "def test_one():\n    assert add(1, 2) == 3\n")
                    }.items():
    (task_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    (task_dir / rel).write_text(text)
  (task_dir / "task.json").write_text('{"problem": "add is wrong."}')
  env = make_env()
  env.reset(coding_tasks.load_task(task_dir))
  hunt = ("import builtins, os\nbuiltins.any = lambda items: True\n"  # the hook, switched off
          "for top in ('../task/tests_hidden', '..'):\n"
          "    for d, _, names in os.walk(top):\n"
          "        for n in names:\n"
          "            try:\n"
          f"                if {marker[:7]!r} + {marker[7:]!r} in open(os.path.join(d, n)).read():\n"
          "                    print('FOUND', os.path.join(d, n), flush=True)\n"
          "            except (OSError, ValueError) as e:\n"
          "                print('error', e, flush=True)\n")
  seen = [env.step(call("python", code=hunt)).observation,
          env.step(call("search", text=marker)).observation]
  assert not any("FOUND" in s or f"# {marker}" in s for s in seen), seen


def test_over_long_paths_are_reward_zero_not_an_environment_failure():
  env = make_env()
  env.reset(TASK)
  deep = env.workspace.root
  while len(deep) < 4095 - 2 * 201:  # The longest path the OS takes: any copy's is longer.
    deep = os.path.join(deep, "d" * 200)
    os.mkdir(deep)
  with open(os.path.join(deep, "x" * (4095 - len(deep) - 4) + ".py"), "w") as f:
    f.write("x = 1\n")
  result = env.step(call("submit"))
  assert result.failure is None and result.reward == 0.0
  assert "over the limits" in result.info["grading_error"]


@pytest.fixture
def long_tmpdir(monkeypatch):
  """A temporary directory with a 44-byte path, as on a cluster's per-job scratch
  (traversable, since the sandbox reads its runs' files as another user)."""
  top = tempfile.mkdtemp(prefix="sao_a_long_temporary_directory_", dir="/tmp")
  os.chmod(top, 0o711)
  monkeypatch.setattr(tempfile, "tempdir", top)
  yield top
  sandbox.remove_tree(top)


def _path_of_bytes(size):
  """A relative `.py` path of `size` UTF-8 bytes in at most 1024 characters, 17
  components (the old limits counted characters): mostly 4-byte characters."""
  ascii_count = 3 + (size - 16 - 3) % 4  # ".py" and padding, so the rest is whole emoji
  emoji = (size - 16 - ascii_count) // 4
  per_dir, last = divmod(emoji, 16)
  assert per_dir <= 63 and last <= 60 and emoji + ascii_count + 16 <= 1024
  dirs = ["\N{GRINNING FACE}" * per_dir] * 16
  name = "\N{GRINNING FACE}" * last + "a" * (ascii_count - 3) + ".py"
  return os.path.join(*dirs, name)


def test_a_path_the_grading_copy_cannot_hold_is_never_an_environment_failure(long_tmpdir):
  """The longest file path the OS takes in the working copy is one byte too long in
  the grading copy ("grade" is longer than "work"); the agent learns the copy's
  path from `os.getcwd()` in the sandbox. Grading must still score the episode."""
  env = make_env()
  env.reset(TASK)
  rel = _path_of_bytes(4095 - len(os.fsencode(env.workspace.root)) - 1)
  env.step(call("create", path=rel, content="x = 1\n"))
  result = env.step(call("submit"))
  assert result.failure is None and result.reward == 0.0, result


@pytest.mark.parametrize("field, value", [("disk_mb", 8), ("max_files", 1000)])
def test_limits_too_small_for_a_full_working_copy_are_refused(field, value):
  """A working copy the walk allows but the sandbox's work tmpfs cannot hold stopped the
  test runner before it started: an environment failure (the episode dropped, not
  scored) that the agent caused by filling its copy."""
  limits = dataclasses.replace(LIMITS, **{field: value})
  with pytest.raises(ValueError, match=f"env.tool.{field}={value}"):
    coding.CodingEnv(sandbox_limits=limits)


def test_a_working_copy_at_the_walk_limits_fits_the_smallest_limits_allowed():
  env = coding.CodingEnv(max_turns=10, sandbox_limits=dataclasses.replace(
      LIMITS, disk_mb=coding.MIN_SANDBOX_DISK_MB, max_files=coding.MIN_SANDBOX_FILES))
  env.reset(TASK)
  root = env.workspace.root
  entries = coding.walk.walk(root)
  for i in range(coding.walk.MAX_ENTRIES - len(entries) - 1):
    with open(os.path.join(root, f"f{i}.py"), "w") as f:
      f.write("x = 1\n")
  with open(os.path.join(root, "big.py"), "w") as f:  # the rest of the byte budget
    f.write("#" * (coding.walk.MAX_TOTAL_BYTES - sum(e.size for e in coding.walk.walk(root))))
  observation = env.step(call("run_tests")).observation
  assert "tests passed" in observation, observation
  assert_zero(env.step(call("submit")))


def test_deeply_nested_directories_do_not_crash_the_tools():
  env = make_env()
  env.reset(TASK)
  deep = env.workspace.root
  for _ in range(1200):
    deep = os.path.join(deep, "a")
    os.mkdir(deep)
  for action in (call("list"), call("search", text="def "), call("python", code="print(1)"),
                 call("create", path="new.py", content="x = 1\n")):
    observation = env.step(action).observation
    assert observation.startswith("error: ") and "limits" in observation, observation
  result = env.step(call("submit"))
  assert result.failure is None and result.reward == 0.0


def test_the_workspace_cannot_grow_past_its_caps():
  env = make_env()
  env.reset(TASK)
  for i in range(coding.walk.MAX_ENTRIES):
    with open(os.path.join(env.workspace.root, f"f{i}.txt"), "w") as f:
      f.write("x")
  observation = env.step(call("create", path="one_more.py", content="x = 1\n")).observation
  assert observation.startswith("error: ") and "more than" in observation, observation
  big = "x" * (4 << 20)
  env2 = make_env()
  env2.reset(TASK)
  for i in range(4):
    env2.step(call("create", path=f"big{i}.txt", content=big))
  observation = env2.step(call("create", path="big4.txt", content=big)).observation
  assert observation.startswith("error: ") and "bytes" in observation, observation
