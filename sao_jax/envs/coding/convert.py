"""Hidden test files turned into calls the grader compares outside the agent's interpreter.

A task directory's hidden tests used to decide pass/fail inside the interpreter
that also runs the agent's code, so a returned object whose `__eq__` always
holds passed every `assert f(x) == y` (reward 1.0 on a task directory, six
forgeries, baseline 0). `hidden_calls(files, ...)` rewrites each test into the
call form of generated tasks (`grader.grade_calls`): the sandbox only calls
`f(x)` and reports the returned value, typed (`values`); this process compares
it with `y`, which never enters the sandbox.

What converts (anything else raises `Unconvertible` naming the file, line and
reason; `tasks.load_task` refuses the task unless forgeable grading is allowed):

- top level: `import m`, `import m as a`, `from m import f [as g]` of the
  repository's modules (absolute, not the test directory's own helpers),
  docstrings, `def` of tests and other functions, `if __name__ == "__main__":`;
- a test is a top-level `def test*()` (no parameters) whose body holds only
  `assert CALL == VALUE` (either side), `assert CALL is None|True|False`, a
  docstring or `pass`, at least one assert; a file without test functions is
  one test made of its top-level asserts;
- CALL is `f(...)` or `m.f(...)` / `a.b.f(...)` of an imported name, with
  positional literal arguments; VALUE is a literal. Both must be plain data
  (`values.encode`: None, bool, int, float, str, list, tuple, dict with str
  keys).

The comparison is typed: `f(2) == 4` no longer passes when `f` returns `4.0`
or `True` for `1` (`values`). A test passes when every call in it does.
"""

from __future__ import annotations

import ast
import os
from typing import Any

from sao_jax.envs.coding import values


class Unconvertible(ValueError):
  """A hidden test the grader cannot check outside the agent's interpreter."""


def _fail(rel: str, node: ast.AST | None, reason: str) -> Unconvertible:
  line = f", line {node.lineno}" if node is not None and hasattr(node, "lineno") else ""
  return Unconvertible(f"{rel}{line}: {reason}")


def _literal(rel: str, node: ast.AST, what: str) -> Any:
  """The value of the literal `node`, which must be plain data (`values.encode`)."""
  try:
    value = ast.literal_eval(node)
    values.encode(value)
    return value
  except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as error:
    raise _fail(rel, node, f"the {what} is not a plain literal value ({error})") from None


def _is_docstring(node: ast.stmt) -> bool:
  return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
          and isinstance(node.value.value, str))


def _is_main_guard(node: ast.stmt) -> bool:
  test = node.test if isinstance(node, ast.If) else None
  return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
          and test.left.id == "__name__" and len(test.comparators) == 1
          and isinstance(test.comparators[0], ast.Constant)
          and test.comparators[0].value == "__main__")


class _File:
  """One test file's imported names and its calls."""

  def __init__(self, rel: str, tree: ast.Module, local_modules: frozenset[str]):
    self.rel, self.local_modules = rel, local_modules
    self.functions: dict[str, tuple[str, str]] = {}  # name -> (module, function)
    self.modules: dict[str, str] = {}  # bound name -> module path
    self.imported: set[str] = set()  # every module path an `import` statement names
    tests, asserts = [], []
    for node in tree.body:
      if isinstance(node, ast.Import):
        for alias in node.names:
          self._module(node, alias.name)
          self.imported.add(alias.name)
          bound = alias.asname or alias.name.split(".")[0]
          self.functions.pop(bound, None)  # the later binding of a name wins, as in Python
          self.modules[bound] = alias.name if alias.asname else bound
      elif isinstance(node, ast.ImportFrom):
        if node.level or node.module is None:
          raise _fail(rel, node, "a relative import")
        self._module(node, node.module)
        for alias in node.names:
          if alias.name == "*":
            raise _fail(rel, node, "a star import")
          self.modules.pop(alias.asname or alias.name, None)
          self.functions[alias.asname or alias.name] = (node.module, alias.name)
      elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if node.name in self.functions or node.name in self.modules:
          raise _fail(rel, node, f"redefines the imported name {node.name!r}")
        if node.name.startswith("test"):
          tests.append(node)
      elif isinstance(node, ast.Assert):
        asserts.append(node)
      elif not (_is_docstring(node) or _is_main_guard(node) or isinstance(node, ast.Pass)):
        raise _fail(rel, node, f"a top-level {type(node).__name__} statement (only imports, "
                               "functions and asserts convert)")
    if tests and asserts:
      raise _fail(rel, asserts[0], "a top-level assert in a file with test functions")
    self.tests = tests
    self.asserts = asserts

  def _module(self, node: ast.stmt, module: str) -> None:
    if module.split(".")[0] in self.local_modules:
      raise _fail(self.rel, node, f"imports {module!r} from the test directory (only the "
                                  "repository's modules reach the grading copy)")

  def _target(self, func: ast.expr, node: ast.AST) -> tuple[str, str]:
    if isinstance(func, ast.Name) and func.id in self.functions:
      return self.functions[func.id]
    parts = []
    while isinstance(func, ast.Attribute):
      parts.append(func.attr)
      func = func.value
    if isinstance(func, ast.Name) and func.id in self.modules and parts:
      path = [self.modules[func.id], *reversed(parts)]
      module = ".".join(path[:-1])
      # `m.Class.method(...)` is no function of a module `m.Class`: only a chain ending
      # in an imported module's own function is known to be one.
      if module in self.imported:
        return module, path[-1]
      raise _fail(self.rel, node, f"calls {'.'.join(path)}, not a function of a module an "
                                  "import names (import the function: `from <module> import f`)")
    raise _fail(self.rel, node, "calls something other than an imported function")

  def call(self, node: ast.Assert, name: str) -> dict[str, Any]:
    """The call row of `assert CALL == VALUE` (module docstring)."""
    test = node.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
      raise _fail(self.rel, node, "not `assert f(...) == value` (or `is None/True/False`)")
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq):
      call, value = (left, right) if isinstance(left, ast.Call) else (right, left)
    elif isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (
        None, True, False):
      call, value = left, right
    else:
      raise _fail(self.rel, node, f"compares with {type(op).__name__} (only == and `is` "
                                  "None/True/False convert)")
    if not isinstance(call, ast.Call) or call.keywords or any(
        isinstance(a, ast.Starred) for a in call.args):
      raise _fail(self.rel, node, "one side must be a call with positional arguments only")
    module, function = self._target(call.func, node)
    return {"name": name, "module": module, "function": function,
            "args": values.encode(tuple(_literal(self.rel, a, "argument") for a in call.args)),
            "expected": values.encode(_literal(self.rel, value, "expected value"))}

  def rows(self) -> list[dict[str, Any]]:
    if not self.tests:
      if not self.asserts:
        raise _fail(self.rel, None, "no test functions and no asserts to grade")
      return [self.call(node, self.rel) for node in self.asserts]
    rows = []
    for test in self.tests:
      if isinstance(test, ast.AsyncFunctionDef) or test.args.args or test.args.posonlyargs or (
          test.args.vararg or test.args.kwonlyargs or test.args.kwarg or test.decorator_list):
        raise _fail(self.rel, test, f"{test.name} takes arguments, is async or decorated")
      name = f"{self.rel}::{test.name}"
      found = []
      for node in test.body:
        if isinstance(node, ast.Assert):
          found.append(self.call(node, name))
        elif not (_is_docstring(node) or isinstance(node, ast.Pass)):
          raise _fail(self.rel, node, f"{test.name} holds a {type(node).__name__} statement "
                                      "(only asserts convert)")
      if not found:
        raise _fail(self.rel, test, f"{test.name} has no assert to grade")
      rows += found
    return rows


def hidden_calls(files: dict[str, str], local_modules: frozenset[str]) -> tuple[dict, ...]:
  """The call rows (`grader.grade_calls`) of the hidden test files `files` (relative
  path -> parsed-before source), each test named `<file>::<test>` (or `<file>`);
  `local_modules` are the names the test directory itself provides (helpers), which
  the grading copy lacks. Raises `Unconvertible` naming file, line and reason."""
  rows = []
  for rel in sorted(files):
    rows += _File(rel, ast.parse(files[rel], filename=rel), local_modules).rows()
  return tuple(rows)


def local_modules(paths: list[str], part: str) -> frozenset[str]:
  """Top-level module and package names the files `paths` (relative to the task root)
  define inside `part`/."""
  names = set()
  for rel in paths:
    inner = os.path.relpath(rel, part).split(os.sep)
    if inner[0] != "..":
      names.add(inner[0][:-3] if inner[0].endswith(".py") else inner[0])
  return frozenset(names)
