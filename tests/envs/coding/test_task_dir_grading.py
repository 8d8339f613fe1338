"""Task directories are graded like generated tasks: each hidden `assert f(x) == y`
becomes a call whose returned value this process compares, typed, outside the
agent's interpreter (`coding.convert`).

Before, hidden test files decided pass/fail inside the interpreter that runs the
agent's code: an always-equal return value alone earned reward 1.0 (six
forgeries, baseline 0)."""

import json

import pytest

from sao_jax.config import EnvConfig
from sao_jax.envs import registry, sandbox
from sao_jax.envs.base import play
from sao_jax.envs.coding import convert
from sao_jax.envs.coding import env as coding
from sao_jax.envs.coding import tasks as coding_tasks
from sao_jax.envs.coding.tools import format_tool_call as call

LIMITS = sandbox.SandboxLimits(wall_time_s=10.0, cpu_time_s=2, memory_mb=256)
BUGGY = "def add(a, b):\n    return a - b\n"
HIDDEN = '''"""Hidden tests."""
import calc
from calc import add


def test_small():
    assert add(1, 2) == 3
    assert calc.add(2, 2) == 4


def test_zero():
    assert 0 == add(0, 0)  # the bug does not show here
'''
# Finds the in-process runner's globals by walking up the stack from the import.
_RUNNER_GLOBALS = """
import sys as _sys, os as _os
_frame = _sys._getframe()
while _frame is not None and '_MARK' not in _frame.f_globals:
    _frame = _frame.f_back
_g = _frame.f_globals if _frame is not None else {}
"""
_ALWAYS_EQUAL = """
class _Equal:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
"""
# Each replaces calc.py (the agent's only file): none fixes the bug.
FORGERIES = {
    "always_equal_return": _ALWAYS_EQUAL + "def add(a, b):\n    return _Equal()\n",
    "always_equal_int_subclass": """
class _Int(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def add(a, b):
    return _Int(a - b)
""",
    "poisoned_builtins": _ALWAYS_EQUAL + """
import builtins as _builtins
_real_type = _builtins.type
_builtins.type = lambda *a: int if len(a) == 1 else _real_type(*a)
def add(a, b):
    return _Equal()
""",
    "print_pass_lines": _RUNNER_GLOBALS + """
if _g:
    _os.write(1, ''.join(f"{_g['_MARK']} PASS {n}\\n" for n in _g.get('_NAMES', ())).encode())
    _os._exit(0)
""" + BUGGY,
    "replace_runner_functions": _RUNNER_GLOBALS + """
if '_call' in _g:
    _g['_call'] = lambda fn: None
""" + BUGGY,
    "answer_from_hidden_tests": """
import ast as _ast, os as _os
_table = {}
for _dir, _, _names in _os.walk('.'):
    for _name in _names:
        if _name.startswith('test') and _name.endswith('.py'):
            for _node in _ast.walk(_ast.parse(open(_os.path.join(_dir, _name)).read())):
                if isinstance(_node, _ast.Compare):
                    for _a, _b in ((_node.left, _node.comparators[0]),
                                   (_node.comparators[0], _node.left)):
                        if isinstance(_a, _ast.Call):
                            _table[repr(tuple(_ast.literal_eval(x) for x in _a.args))] = (
                                _ast.literal_eval(_b))
def add(a, b):
    return _table.get(repr((a, b)), a - b)
""",
}


def write_task(root, hidden=HIDDEN, repo=BUGGY, extra=None):
  task = root / "task"
  (task / "repo").mkdir(parents=True)
  (task / "repo" / "calc.py").write_text(repo)
  (task / "tests_visible").mkdir()
  (task / "tests_visible" / "test_visible.py").write_text(
      "from calc import add\n\ndef test_one():\n    assert add(0, 0) == 0\n")
  (task / "tests_hidden").mkdir()
  (task / "tests_hidden" / "test_calc.py").write_text(hidden)
  for rel, text in (extra or {}).items():
    (task / "tests_hidden" / rel).write_text(text)
  (task / "task.json").write_text(json.dumps({"problem": "add subtracts."}))
  return task


def make_env(**kwargs):
  return coding.CodingEnv(max_turns=10, max_observation_chars=4000, sandbox_limits=LIMITS,
                          **kwargs)


def submit_with(task, source, **kwargs):
  env = make_env(**kwargs)
  env.reset(task)
  env.step(call("edit", path="calc.py", old=BUGGY, new=source))
  return env.step(call("submit"))


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forgeries_against_a_task_directory_earn_zero(tmp_path, forgery):
  task = coding_tasks.load_task(write_task(tmp_path))
  result = submit_with(task, FORGERIES[forgery])
  assert result.done and result.failure is None, result
  assert result.reward == 0.0 and result.info["hidden_total"] == 2, result.info
  assert result.info["hidden_passed"] <= 1, result.info  # test_zero: the buggy code passes it


def test_the_fix_earns_one_and_partial_reward_counts_tests_not_asserts(tmp_path):
  task = coding_tasks.load_task(write_task(tmp_path))
  assert len(task.metadata["hidden_calls"]) == 3 and not task.metadata["forgeable_grading"]
  assert submit_with(task, "def add(a, b):\n    return a + b\n").reward == 1.0
  assert play(make_env(partial_reward=True), task, [call("submit")]).result.reward == 0.5


def test_values_are_compared_typed(tmp_path):
  task = coding_tasks.load_task(write_task(tmp_path))
  assert submit_with(task, "def add(a, b):\n    return float(a + b)\n").reward == 0.0


@pytest.mark.parametrize("hidden, reason", [
    ("from calc import add\n\ndef test_a():\n    x = add(1, 2)\n    assert x == 3\n",
     r"test_calc.py, line 4: test_a holds a Assign statement"),
    ("from calc import add\n\ndef test_a():\n    assert add(1, 2)\n",
     r"line 4: not `assert f\(...\) == value`"),
    ("from calc import add\n\ndef test_a():\n    assert add(1, 2) == 3 or True\n",
     r"line 4: not `assert f\(...\) == value`"),
    ("from calc import add\n\ndef test_a():\n    assert add(1, 2) == add(3, 0)\n",
     r"line 4: the expected value is not a plain literal"),
    ("from calc import add\n\ndef test_a():\n    assert add(*[1, 2]) == 3\n",
     r"line 4: one side must be a call with positional arguments only"),
    ("from calc import add\n\ndef test_a():\n    assert add({1}, 2) == 3\n",
     r"line 4: the argument is not a plain literal"),
    ("from calc import add\n\ndef add(a, b):\n    return 3\n\ndef test_a():\n"
     "    assert add(1, 2) == 3\n", r"line 3: redefines the imported name 'add'"),
    ("from helpers import add\n\ndef test_a():\n    assert add(1, 2) == 3\n",
     r"line 1: imports 'helpers' from the test directory"),
    ("import calc\n\ndef test_a():\n    assert (lambda: calc.add)()(1, 2) == 3\n",
     r"line 4: calls something other than an imported function"),
    ("from calc import add\nX = 1\n\ndef test_a():\n    assert add(X, 2) == 3\n",
     r"line 2: a top-level Assign statement"),
    ("from calc import add\n\ndef test_a():\n    pass\n", r"line 3: test_a has no assert"),
    ("import calc\n\ndef test_a():\n    assert calc.Adder.add(1, 2) == 3\n",
     r"line 4: calls calc.Adder.add, not a function of a module an import names"),
])
def test_tests_that_do_not_convert_are_refused_at_load_with_the_reason(tmp_path, hidden, reason):
  task_dir = write_task(tmp_path, hidden=hidden, extra={"helpers.py": "def add(a, b): pass\n"})
  with pytest.raises(ValueError, match=reason) as error:
    coding_tasks.load_task(task_dir)
  assert "env.options.allow_forgeable_grading" in str(error.value) and str(task_dir) in str(error.value)


def test_forgeable_grading_is_an_explicit_opt_in(tmp_path):
  hidden = "from calc import add\n\ndef test_a():\n    x = add(1, 2)\n    assert x == 3\n"
  task_dir = write_task(tmp_path, hidden=hidden)
  task = coding_tasks.load_task(task_dir, allow_forgeable_grading=True)
  assert task.metadata["forgeable_grading"] and task.metadata["hidden_calls"] is None
  # Graded in the agent's interpreter, as before: the fix passes, and so does a forgery.
  assert submit_with(task, "def add(a, b):\n    return a + b\n").reward == 1.0
  assert submit_with(task, FORGERIES["always_equal_return"]).reward == 1.0
  config = EnvConfig(name="coding", task_source="dir", options={"task_dir": str(tmp_path)})
  with pytest.raises(ValueError, match="allow_forgeable_grading"):
    next(registry.make_tasks(config))
  allowed = EnvConfig(name="coding", task_source="dir",
                      options={"task_dir": str(tmp_path), "allow_forgeable_grading": True})
  assert next(registry.make_tasks(allowed)).metadata["forgeable_grading"]


def test_a_task_json_cannot_smuggle_in_its_own_expected_values(tmp_path):
  task_dir = write_task(tmp_path)
  (task_dir / "task.json").write_text(json.dumps({"problem": "p", "hidden_calls": []}))
  with pytest.raises(ValueError, match=r"keys \['hidden_calls'\] are reserved"):
    coding_tasks.load_task(task_dir)


def test_script_style_files_are_one_test_of_their_top_level_asserts():
  rows = convert.hidden_calls({"tests_hidden/test_s.py": (
      "import pkg.mod as m\nfrom calc import add as plus\n"
      "assert plus(1, 2) == 3\nassert m.f('x', [1, (2, None)]) is None\n"
      "if __name__ == '__main__':\n    print('ran')\n")}, frozenset())
  assert [(r["name"], r["module"], r["function"]) for r in rows] == [
      ("tests_hidden/test_s.py", "calc", "add"), ("tests_hidden/test_s.py", "pkg.mod", "f")]
  assert rows[1]["args"] == ["tuple", [["str", "x"], ["list", [["int", 1], ["tuple", [
      ["int", 2], ["none", None]]]]]]]
  assert rows[1]["expected"] == ["none", None]
