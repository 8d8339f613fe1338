"""The test runner behind run_tests and grading, and the sandbox's `workdir` mode it uses."""

import os
import time

import pytest

from sao_jax.envs import sandbox
from sao_jax.envs.coding import runner as coding_runner

LIMITS = sandbox.SandboxLimits(wall_time_s=5.0, cpu_time_s=1, memory_mb=256)


def run(root, source, name="tests/test_x.py"):
  (root / name).parent.mkdir(parents=True, exist_ok=True)
  (root / name).write_text(source)
  return coding_runner.run_test_file(str(root), name, source, LIMITS)


def test_workdir_mode_runs_in_the_callers_directory(tmp_path):
  (tmp_path / "lib.py").write_text("VALUE = 41\n")
  result = sandbox.run_python(
      "import os, sys, lib\nopen('out.txt', 'w').write(str(lib.VALUE + 1))\n"
      "print(os.getcwd() == sys.path[0], sorted(os.listdir('.')))\n", LIMITS, workdir=tmp_path)
  assert result.ok, result.stderr
  assert result.stdout == "True ['lib.py', 'out.txt']\n"  # main.py lives elsewhere.
  assert not (tmp_path / "out.txt").exists()  # It ran on a throwaway copy.
  outside = sandbox.run_python(f"open({str(tmp_path.parent / 'x.txt')!r}, 'w')", LIMITS,
                               workdir=tmp_path)
  assert "not allowed" in outside.stderr and not (tmp_path.parent / "x.txt").exists()
  with pytest.raises(ValueError, match="workdir='/nonexistent' is not an existing directory"):
    sandbox.run_python("pass", LIMITS, workdir="/nonexistent")


def test_functions_are_tests_and_failures_show_output_and_traceback(tmp_path):
  result = run(tmp_path, "def test_a():\n    pass\n\n"
                         "def test_b():\n    print('debug info')\n"
                         "    assert 1 == 2, 'one is not two'\n\n"
                         "def helper():\n    raise RuntimeError('not a test')\n")
  assert result.names == ("test_a", "test_b") and result.passed == {"test_a"}
  assert result.report.startswith("tests/test_x.py: 1 of 2 tests passed\nPASS test_a\nFAIL test_b")
  assert "debug info" in result.report and "AssertionError: one is not two" in result.report
  assert "not a test" not in result.report


def test_tests_named_with_characters_beyond_the_bmp_get_their_verdict(tmp_path):
  """Python identifiers may hold such characters (CJK Extension B); sent to the runner as
  JSON they became escaped surrogate pairs, a name no verdict matched: a passing test failed."""
  result = run(tmp_path, "def test_\U00020000():\n    pass\n")
  assert result.names == ("test_\U00020000",) and result.passed == {"test_\U00020000"}


def test_the_test_file_is_parsed_in_the_sandbox_not_in_this_process(tmp_path):
  # An agent writes its own test files, and CPython 3.11 parses an f-string in time
  # quadratic in its length: this 240 KB file took 4.4 s of this process's CPU (the
  # sampler's) before the run even started; a 4 MiB one would take ~20 minutes.
  source = "def test_a():\n    pass\n\nx = f\"" + "{a}" * 80_000 + "\"\n"
  before = time.process_time()
  result = run(tmp_path, source)
  assert time.process_time() - before < 1.0
  # The sandbox's CPU limit stopped the parse: the file is one test, and it failed.
  assert result.names == ("tests/test_x.py",) and not result.passed
  assert ("FAIL tests/test_x.py (no result: the test file was not parsed within the limits)"
          in result.report), result.report
  assert "[killed: " in result.report


def test_the_list_of_tests_is_fixed_before_the_files_code_runs(tmp_path):
  # The names come from the sandbox now, written before the file is imported: code
  # that rewrites the runner's list or the file itself changes nothing.
  result = run(tmp_path, "import sys\nframe = sys._getframe()\n"
                         "while '_NAMES' not in frame.f_globals:\n    frame = frame.f_back\n"
                         "frame.f_globals['_NAMES'][:] = ['test_b', 'test_c']\n"
                         "open(__file__, 'w').write('def test_c():\\n    pass\\n')\n\n"
                         "def test_a():\n    pass\n\ndef test_b():\n    pass\n")
  assert result.names == ("test_a", "test_b") and result.passed == {"test_b"}, result.report
  assert "FAIL test_a (no result: the test process ended" in result.report
  # Parsing a "\N{...}" escape imports unicodedata: the repository's own ran inside the
  # parse, before the list was written (and the file failed to load).
  (tmp_path / "unicodedata.py").write_text("raise ImportError('the repository ran')\n")
  result = run(tmp_path, 'BULLET = "\\N{BULLET}"\n\ndef test_a():\n    assert BULLET == "\u2022"\n')
  assert result.passed == {"test_a"}, result.report


def test_a_file_without_test_functions_is_one_test(tmp_path):
  assert run(tmp_path, "assert 1 + 1 == 2\n").passed == {"tests/test_x.py"}
  result = run(tmp_path, "assert 1 + 1 == 3, 'math'\n")
  assert result.names == ("tests/test_x.py",) and not result.passed
  assert "AssertionError: math" in result.report


def test_broken_files_fail_every_test(tmp_path):
  result = run(tmp_path, "import missing_module\n\n"
                         "def test_a():\n    pass\n\ndef test_b():\n    pass\n")
  assert result.names == ("test_a", "test_b") and not result.passed
  assert "ModuleNotFoundError" in result.report and "failed to load" in result.report
  assert run(tmp_path, "def test_a(:\n").passed == frozenset()  # Unparsable: one failing test.


def test_repository_and_test_directory_are_importable(tmp_path):
  (tmp_path / "calc.py").write_text("def double(x):\n    return 2 * x\n")
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "helpers.py").write_text("EXPECTED = 8\n")
  result = run(tmp_path, "from calc import double\nfrom helpers import EXPECTED\n\n"
                         "def test_double():\n    assert double(4) == EXPECTED\n")
  assert result.passed == {"test_double"}, result.report


@pytest.mark.parametrize("escape, shown", [
    ("import sys\nsys.exit(0)", "SystemExit: 0"),
    ("import os\nos._exit(0)", "FAIL test_a (no result"),
    ("print('PASS test_a', flush=True)\nimport os\nos._exit(0)", "FAIL test_a (no result"),
])
def test_exiting_or_printing_verdicts_does_not_pass_tests(tmp_path, escape, shown):
  result = run(tmp_path, f"def test_a():\n    pass\n\n{escape}\n")
  assert result.passed == frozenset() and shown in result.report, result.report


def test_a_hanging_test_fails_the_rest_and_is_reported(tmp_path):
  result = run(tmp_path, "def test_a():\n    pass\n\ndef test_b():\n    while True:\n        pass\n"
                         "\ndef test_c():\n    pass\n")
  assert result.passed == {"test_a"}
  assert "FAIL test_c (no result" in result.report and "CPU time limit" in result.report


def test_discover_finds_top_level_test_files_only(tmp_path):
  for rel in ("tests/test_a.py", "tests/test_b.py", "tests/helper.py", "tests/sub/test_c.py"):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("")
  os.symlink(tmp_path / "tests" / "test_a.py", tmp_path / "tests" / "test_link.py")
  assert coding_runner.discover(str(tmp_path), "tests") == ["tests/test_a.py", "tests/test_b.py"]
  assert coding_runner.discover(str(tmp_path), "missing") == []


def test_chatty_failures_never_cost_a_passing_test_its_verdict(tmp_path):
  # Regression: failure details used to fill the output limit and drop later verdicts.
  tests = "".join(f"def test_fail_{i}():\n    print('x' * 500)\n    assert False\n\n"
                  f"def test_pass_{i}():\n    pass\n\n" for i in range(15))
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "test_x.py").write_text(tests)
  small = sandbox.SandboxLimits(wall_time_s=5.0, cpu_time_s=1, max_output_bytes=1000)
  result = coding_runner.run_test_file(str(tmp_path), "tests/test_x.py", tests, small)
  assert result.passed == {f"test_pass_{i}" for i in range(15)}
  assert "[details cut: output limit]" in result.report
  assert "FAIL test_fail_14" in result.report and "no result" not in result.report


def test_repository_modules_do_not_shadow_the_runners_imports(tmp_path):
  # Regression guard: a repository may have top-level modules named like the stdlib.
  for name in ("contextlib", "traceback", "io"):
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('shadowed')\n")
  assert run(tmp_path, "def test_a():\n    pass\n").passed == {"test_a"}


def test_a_test_file_nested_past_the_parser_fails_naming_its_line(tmp_path):
  # Agents write test files too: inside the sandbox such a file is one failing test,
  # reported with its line, not a RecursionError traceback from loading it.
  result = run(tmp_path, "def test_a():\n    pass\n\nx = " + "-" * 5000 + "1\n")
  assert result.names == ("tests/test_x.py",) and not result.passed
  assert "tests/test_x.py, line 4: Python nested too deeply" in result.report, result.report


def test_the_python_tool_names_the_line_of_code_nested_past_the_compiler():
  result = sandbox.run_python("print(1)\n\nx = " + "1+" * 5000 + "1\n", LIMITS)
  assert result.exit_code == 1 and result.stdout == ""
  assert "main.py, line 3: Python nested too deeply" in result.stderr, result.stderr
