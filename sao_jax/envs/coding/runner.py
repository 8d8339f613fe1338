"""Run Python test files in the sandbox and read back one verdict per test.

What a test is: in a test file (`test*.py`), every top-level `def test...()`
is a test, found by parsing the file (`collect_tests`); it passes if calling it
with no arguments returns without raising. A file without such functions is
one test, named by its path, that passes if the file runs to the end (a plain
script with asserts). No pytest is needed inside the sandbox.

The file is parsed inside the sandbox, under its limits, never in this process:
an agent writes its own test files, and CPython 3.11 parses f-strings in time
quadratic in their length (a 240 KB test file took 4.4 s of this process, the
sampler's, a 4 MiB one would take ~20 minutes). A file whose parse does not
finish within the limits counts as one test that fails.

How a file runs: in its own interpreter via `sandbox.run_python(...,
workdir=root)`, so every sandbox limit applies, with the repository root and
the file's own directory on `sys.path`. Output printed by a test is captured
and shown only when it fails; failure details are cut to the sandbox's output
limit, and the verdict lines get room beyond it, so that chatty failures never
cost a passing test its verdict (only code writing to the raw stdout
descriptor can crowd verdicts out, and then its tests fail).

How verdicts are read: the runner writes `<mark> START` before it imports
anything from the repository, `<mark> TESTS <name> <name> ...` once it has parsed
the file (still before any code of the repository or the file runs), then
`<mark> PASS <name>` or `<mark> FAIL <name>` after each test returns or raises,
where `<mark>` is a fresh random token per run. A test without a verdict
failed (the process crashed, exited early or hit a limit), so `sys.exit(0)` or
`os._exit(0)` in the code under test cannot pass anything. No START line means
the runner itself never came up: that raises `SandboxError` (an environment
failure, not a failed test).

Not enforced: the code under test shares the runner's interpreter, so code
written to inspect the runner's frames could read the mark and forge verdicts,
and more simply, a returned object whose `__eq__` always holds passes every
`assert f(x) == y` in the tests. As with pytest-based graders, a test is only
as strong as in-process isolation; that is why generated tasks are graded by
`grader.grade_calls` instead, and this runner grades only task directories
with arbitrary test files.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import secrets

from sao_jax.envs import sandbox
from sao_jax.envs.sandbox import nesting
from sao_jax.envs.sandbox.nesting import too_deep

# Failure details (captured output, traceback) kept per test, from the end.
_DETAIL_CHARS = 2000

# The runner's first part; `collect_tests` and `_RUNNER` follow it.
_RUNNER_START = r'''
import os, sys
_out = os.dup(1)

def _emit(text):
  data = text.encode("utf-8", "replace")
  while data:
    data = data[os.write(_out, data):]

_emit(_MARK + " START\n")
# The runner's own imports skip the repository, which may shadow stdlib names;
# unicodedata too, which parsing a "\N{...}" escape imports (a repository's own
# unicodedata.py would otherwise run inside the parse, before the TESTS line).
_root = sys.path.pop(0)
import ast, contextlib, importlib.util, io, tokenize, traceback, unicodedata
sys.path[:0] = [_root, os.path.dirname(os.path.abspath(_PATH))]
'''

_RUNNER = r'''
_too_deep = None  # the file nests past the parser: named with its line, never loaded
try:  # Before anything of the repository runs: no code of it can change the list.
  with open(_PATH, encoding="utf-8") as _file:
    _source = _file.read()
  _NAMES = collect_tests(_source, _PATH)
except (OSError, UnicodeDecodeError):  # unreadable or not UTF-8: one whole-file test
  _NAMES = []
except ValueError as _error:
  _NAMES, _too_deep = [], str(_error)
_emit(_MARK + " TESTS" + "".join(" " + _name for _name in _NAMES) + "\n")

def _tail(text):
  return text if len(text) <= _DETAIL_CHARS else "[...]" + text[-_DETAIL_CHARS:]

def _call(fn):
  """None if fn() returns, else what it printed and its traceback."""
  printed = io.StringIO()
  try:
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
      fn()
    return None
  except BaseException as e:
    error = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
  output = printed.getvalue()
  return (f"captured output:\n{_tail(output)}\n" if output else "") + _tail(error)

_left = _DETAIL_BYTES

def _report(name, failure):
  global _left
  details = b"" if failure is None else (failure.rstrip("\n") + "\n").encode("utf-8", "replace")
  if len(details) > _left:
    cut = b"\n[details cut: output limit]\n"
    details = details[:_left - len(cut)] + cut if _left > len(cut) else b""
  _left -= len(details)
  verdict = "PASS" if failure is None else "FAIL"
  _emit(f"{_MARK} {verdict} {name}\n" + details.decode("utf-8", "ignore"))

_modules = []

def _load():
  name = os.path.splitext(os.path.basename(_PATH))[0]
  spec = importlib.util.spec_from_file_location(name, _PATH)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  _modules.append(module)

_load_failure = _too_deep or _call(_load)
if not _NAMES:
  _report(_PATH, _load_failure)
for _index, _name in enumerate(_NAMES):
  if _load_failure is not None:
    _report(_name, "the test file failed to load" + (":\n" + _load_failure if _index == 0 else ""))
    continue
  _test = getattr(_modules[0], _name, None)
  _report(_name, _call(_test) if callable(_test) else f"{_name} is not a function")
'''


@dataclasses.dataclass(frozen=True)
class FileResult:
  """One test file's run: its tests, those that passed, and a report for the model."""

  path: str
  names: tuple[str, ...]
  passed: frozenset[str]
  report: str


def collect_tests(source: str, path: str) -> list[str]:
  """The top-level `def test*` functions of `source`, in order; [] if there are none
  or the file does not parse (it then counts as one whole-file test). Source nested
  past the parser raises ValueError naming `path` and the line (`nesting.too_deep`).
  The runner calls it inside the sandbox (its source is pasted in, with `nesting`'s:
  it may use only `ast` and `too_deep`)."""
  try:
    tree = ast.parse(source)
  except (RecursionError, MemoryError) as error:
    raise too_deep(source, path, error) from None
  except (SyntaxError, ValueError):
    return []
  names = [node.name for node in tree.body
           if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]
  return list(dict.fromkeys(names))


def discover(root: str, tests_dir: str) -> list[str]:
  """Paths (relative to `root`) of the regular `test*.py` files directly in `tests_dir`."""
  top = os.path.join(root, tests_dir)
  if not os.path.isdir(top):
    return []
  with os.scandir(top) as entries:
    return sorted(os.path.join(tests_dir, e.name) for e in entries
                  if e.name.startswith("test") and e.name.endswith(".py")
                  and e.is_file(follow_symlinks=False))


def _runner_bytes(source: str, path: str, mark: str) -> int:
  """At most what the runner writes besides failure details for a test file `source`:
  the START and TESTS lines and a verdict line per test. A test is a name the source
  spells after `def` (so there are at most `source.count("def")`) and takes at most 3
  UTF-8 bytes per byte it takes there (Python NFKC-normalizes identifiers: U+0F79
  becomes 3 characters of 3 bytes each); it appears in the TESTS line and in its
  verdict line."""
  line = len(mark) + len(" TESTS \n")
  return (line * (source.count("def") + 3) + 2 * 3 * len(source.encode("utf-8"))
          + len(path.encode("utf-8")))


def run_test_file(root: str, path: str, source: str, limits: sandbox.SandboxLimits, *,
                  isolation: str = sandbox.DEFAULT_SANDBOX) -> FileResult:
  """Runs the test file `path` (relative to `root`, whose text is `source`).

  Raises `sandbox.SandboxError` if the runner did not start.
  """
  mark = secrets.token_hex(16)
  # repr, not JSON: JSON writes a character beyond the BMP as a surrogate pair, which a
  # Python literal reads as two lone surrogates.
  prelude = (f"_MARK = {mark!r}\n_PATH = {path!r}\n"
             f"_DETAIL_CHARS = {_DETAIL_CHARS}\n_DETAIL_BYTES = {limits.max_output_bytes}\n")
  # Room for the runner's own lines on top of the output limit, so that failure
  # details (which the runner keeps within the limit) never push verdicts out.
  limits = dataclasses.replace(
      limits, max_output_bytes=limits.max_output_bytes + _runner_bytes(source, path, mark))
  script = (prelude + _RUNNER_START + nesting.pasteable() + inspect.getsource(collect_tests)
            + _RUNNER)
  result = sandbox.run_python(script, limits, workdir=root, isolation=isolation)
  lines = result.stdout.split("\n")
  if f"{mark} START" not in lines:
    raise sandbox.SandboxError(
        f"the test runner did not start for {path} (exit {result.exit_code}, killed: "
        f"{result.killed_reason}): {result.stderr[-2000:]}")
  # The first such line: the runner's, written before any code of the repository ran.
  listed = next((line for line in lines if line.startswith(f"{mark} TESTS")), None)
  names = [] if listed is None else listed[len(f"{mark} TESTS"):].split(" ")[1:]
  expected = tuple(names) or (path,)
  missing = ("the test file was not parsed within the limits" if listed is None else
             "the test process ended before this test finished")
  verdicts: dict[str, str] = {}
  report = []
  for line in lines:
    if not line.startswith(mark + " "):
      report.append(line)
      continue
    verdict, _, name = line[len(mark) + 1:].partition(" ")
    if verdict in ("PASS", "FAIL") and name in expected and name not in verdicts:
      verdicts[name] = verdict
      report.append(f"{verdict} {name}")
  report += [f"FAIL {name} (no result: {missing})" for name in expected if name not in verdicts]
  passed = frozenset(name for name, verdict in verdicts.items() if verdict == "PASS")
  body = sandbox.format_tool_output(
      dataclasses.replace(result, stdout="\n".join(report).strip("\n")), limits)
  header = f"{path}: {len(passed)} of {len(expected)} tests passed"
  return FileResult(path=path, names=expected, passed=passed, report=f"{header}\n{body}")
