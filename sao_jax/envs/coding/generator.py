"""Generated bug-fix tasks for the coding environment, and the agent that solves them.

`generate_task(index, seed=, difficulty=, kind=)` builds a small repository
from the functions in `coding_bugs.BANK`, plants bugs in some of them, and
writes visible and hidden tests. The same arguments give the same task on any
machine and Python version (string-seeded `random.Random`), independently of
other indices. `difficulty` (1..5) sets the size and how much help the
statement gives:

    difficulty  functions  modules  bugs  visible tests expose  the statement gives
    1           1          1        1     every bug             file, call, expected, actual
    2           3          1        1     every bug             file, call, expected, actual
    3           5          2        1     every bug             call, expected, actual
    4           7          2        2     the first bug         call, expected, actual
    5           9          3        3     the first bug         call, expected

`kind` is one of `coding_bugs.KINDS` (every planted bug has that kind) or
"mixed". The repository holds `<module>.py` files; `tests/test_<module>.py`
are the visible tests. Each visible test checks one call against the correct
function's result with exactly the same builtin types. The hidden tests are
`metadata["hidden_calls"]`, one call per case (the template's edge cases plus
random ones) with its expected value, graded outside the agent's interpreter
(`grader.grade_calls`); `files["tests_hidden"]` is empty. Visible tests cover a
few cases. Where those cases expose a planted bug only on the call the statement
reports, the hidden calls get one more random case that exposes it (if one of
`_EXTRA_DRAWS` draws does; they come from a stream of their own, so the other
cases stay as they were): else an agent that special-cases the reported call,
returning the expected value the statement gives, passes without fixing
anything. Tasks carry their files in memory (`sao_jax.envs.coding.tasks`
describes the metadata) and their fix as `metadata["fix"]`: whole-function
`{"path", "old", "new"}` edits.

`solution_actions(task)` are the scripted agent's turns for such a task: view
each file to fix, edit it, run the visible tests, submit.
"""

from __future__ import annotations

import functools
import itertools
import random
import types
from typing import Any, Callable, Iterator

from sao_jax.config.env import ENV_CODING_BUG_KINDS
from sao_jax.envs import tasks
from sao_jax.envs.base import Task, ToolCall, Turn
from sao_jax.envs.coding import bugs as coding_bugs
from sao_jax.envs.coding import values

KINDS = ENV_CODING_BUG_KINDS
MAX_DIFFICULTY = 5
TESTS_DIR = "tests"
# difficulty -> (functions, modules, bugs)
_SIZES = {1: (1, 1, 1), 2: (3, 1, 1), 3: (5, 2, 1), 4: (7, 2, 2), 5: (9, 3, 3)}
# Not stdlib names: a repository module must not shadow the standard library.
_MODULES = ("mathutil", "textutil", "listutil", "helpers", "toolkit", "basics", "utilities",
            "funcs")
_RANDOM_CASES = 4
_VISIBLE_CASES = 3
_EXTRA_DRAWS = 1000  # random draws searched for a second case exposing a bug

_TEST_HELPERS = '''def _same(got, want):
    """Equal, with exactly the same builtin types all the way down."""
    if type(got) is not type(want):
        return False
    if type(want) is list:
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    return got == want


def _check(got, want, call):
    assert _same(got, want), f"{call} returned {got!r}, expected {want!r}"
'''


def _check_generator_args(difficulty: int, kind: str) -> None:
  tasks.check_generator_args(difficulty, kind, max_difficulty=MAX_DIFFICULTY, kinds=KINDS)


@functools.lru_cache(maxsize=None)
def compile_function(source: str, name: str) -> Callable[..., Any]:
  """The function `name` defined by `source` (the bank's own code, never a model's)."""
  namespace: dict[str, Any] = {}
  exec(source, namespace)
  return namespace[name]


def outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
  """"returns <repr>" or "raises <exception>": equal strings mean equal behaviour
  (reprs of builtin values differ whenever value or type differs)."""
  try:
    return f"returns {fn(*args)!r}"
  except Exception as e:  # A planted bug may raise; that is its observable behaviour.
    return f"raises {type(e).__name__}"


def _call_text(name: str, args: tuple[Any, ...]) -> str:
  return f"{name}({', '.join(map(repr, args))})"


def _cases(template: coding_bugs.Template, rng: random.Random) -> list[tuple[Any, ...]]:
  cases = list(template.edge_cases) + [template.random_case(rng) for _ in range(_RANDOM_CASES)]
  return list({repr(case): case for case in cases}.values())


def _another_exposing_case(template: coding_bugs.Template, correct: Callable[..., Any],
                           wrong: Callable[..., Any], seen: list[tuple[Any, ...]],
                           rng: random.Random) -> list[tuple[Any, ...]]:
  """A random case not in `seen` on which `wrong` behaves differently from `correct`,
  as a list of one, or [] if none of `_EXTRA_DRAWS` draws is one (a bug that only
  one input shows, e.g. a missing `n > 0` guard, has no fix but special-casing it)."""
  known = {repr(case) for case in seen}
  for _ in range(_EXTRA_DRAWS):
    case = template.random_case(rng)
    if repr(case) not in known and outcome(wrong, case) != outcome(correct, case):
      return [case]
  return []


def _test_file(module: str, calls: list[tuple[str, tuple[Any, ...], Any]]) -> str:
  names = ", ".join(dict.fromkeys(name for name, _, _ in calls))
  parts = [f'"""Tests for {module}."""\n\nfrom {module} import {names}\n\n\n{_TEST_HELPERS}']
  for i, (name, args, want) in enumerate(calls):
    call = _call_text(name, args)
    parts.append(f"\n\ndef test_{name}_{i}():\n    _check({call}, {want!r}, {call!r})\n")
  return "".join(parts)


def _statement(reports: list[tuple[str, str, str, str]], difficulty: int) -> str:
  head = "Fix the bug" if len(reports) == 1 else f"Fix the {len(reports)} bugs"
  lines = [f"{head} in this repository. Bug reports:"]
  for module, call, want, got in reports:
    where = f" in {module}.py" if difficulty <= 2 else ""
    actual = f", but it {got}" if difficulty <= 4 else ""
    lines.append(f"- {call}{where} should return {want.removeprefix('returns ')}{actual}.")
  lines.append("Fix the code, not the tests: hidden tests with other inputs decide whether the "
               "fix is accepted.")
  return "\n".join(lines)


def generate_task(index: int, *, seed: int = 0, difficulty: int = 2, kind: str = "mixed") -> Task:
  """The `index`-th generated task for (`seed`, `difficulty`, `kind`)."""
  _check_generator_args(difficulty, kind)
  rng = random.Random(f"sao-coding/{seed}/{difficulty}/{kind}/{index}")
  n_functions, n_modules, n_bugs = _SIZES[difficulty]

  def fits(bug: coding_bugs.Bug) -> bool:
    return kind == "mixed" or bug.kind == kind

  buggy = rng.sample([t for t in coding_bugs.BANK if any(map(fits, t.bugs))], n_bugs)
  templates = buggy + rng.sample([t for t in coding_bugs.BANK if t not in buggy],
                                 n_functions - n_bugs)
  rng.shuffle(templates)
  modules = rng.sample(_MODULES, n_modules)
  planted = {t.name: rng.choice([b for b in t.bugs if fits(b)]) for t in buggy}
  shown = {t.name for t in (buggy[:1] if difficulty >= 4 else buggy)}
  files: dict[str, dict[str, str]] = {"repo": {}, "tests_visible": {}, "tests_hidden": {}}
  fix, reports, hidden_calls = [], [], []
  for m, module in enumerate(modules):
    sources, visible, hidden = [], [], []
    for template in templates[m::n_modules]:
      correct = compile_function(template.source, template.name)
      cases = _cases(template, rng)
      calls = [(template.name, case, correct(*case)) for case in cases]
      hidden += calls
      bug = planted.get(template.name)
      if bug is None:
        sources.append(template.source)
        visible += calls[:_VISIBLE_CASES]
        continue
      source = template.source.replace(bug.old, bug.new, 1)
      sources.append(source)
      fix.append({"path": f"{module}.py", "old": source, "new": template.source})
      wrong = compile_function(source, template.name)
      exposing = [i for i, case in enumerate(cases)
                  if outcome(wrong, case) != outcome(correct, case)]
      passing = [i for i in range(len(cases)) if i not in exposing]
      chosen = (exposing[:1] if template.name in shown else []) + passing
      visible += [calls[i] for i in chosen[:_VISIBLE_CASES]]
      case = cases[exposing[0]]
      reports.append((module, _call_text(template.name, case), outcome(correct, case),
                      outcome(wrong, case)))
      if len(exposing) < 2:  # Only the reported call shows the bug: hide another one.
        extra_rng = random.Random(f"sao-coding/{seed}/{difficulty}/{kind}/{index}/"
                                  f"{template.name}/exposing")
        hidden += [(template.name, extra, correct(*extra)) for extra in
                   _another_exposing_case(template, correct, wrong, cases, extra_rng)]
    files["repo"][f"{module}.py"] = '"""Helper functions."""\n\n\n' + "\n\n".join(sources)
    hidden_calls += [{"name": f"{module}.{name}_{i}", "module": module, "function": name,
                      "args": values.encode(args), "expected": values.encode(want)}
                     for i, (name, args, want) in enumerate(hidden)]
    if visible:
      files["tests_visible"][f"test_{module}.py"] = _test_file(module, visible)
  return Task(id=f"coding-{kind}-d{difficulty}-s{seed}-{index}",
              prompt=_statement(reports, difficulty), answer="",
              metadata=types.MappingProxyType({
                  "files": files, "tests_dir": TESTS_DIR, "fix": tuple(fix),
                  "hidden_calls": tuple(hidden_calls),
                  "difficulty": difficulty,
                  "bug_kinds": tuple(planted[t.name].kind for t in buggy)}))


def iterate_generated(*, seed: int = 0, difficulty: int = 2, kind: str = "mixed") -> Iterator[Task]:
  """Generated tasks 0, 1, 2, ... without end."""
  _check_generator_args(difficulty, kind)
  for index in itertools.count():
    yield generate_task(index, seed=seed, difficulty=difficulty, kind=kind)


def solution_actions(task: Task) -> list[Turn]:
  """The scripted agent's turns: view and fix every planted bug, run the tests, submit
  (tool calls the environment writes in the run's format, `Environment.write_turn`)."""
  fix = task.metadata.get("fix")
  if not fix:
    raise ValueError(f"task {task.id!r} has no 'fix' in its metadata; only generated tasks "
                     "(sao_jax.envs.coding.generator.generate_task) carry their fix.")
  actions = []
  for edit in fix:
    actions.append(Turn(f"Let me read {edit['path']}.", ToolCall("view", {"path": edit["path"]})))
    actions.append(Turn("Found the bug; fixing the function.", ToolCall(
        "edit", {"path": edit["path"], "old": edit["old"], "new": edit["new"]})))
  actions.append(Turn("Now the visible tests.", ToolCall("run_tests", {})))
  actions.append(Turn("They pass.", ToolCall("submit", {})))
  return actions
