"""Hidden-test grading the agent's code cannot forge.

What reaches a grading sandbox: only the agent's `.py` sources (`collect_sources`:
no bytecode, no `__pycache__`, no other files, no links; the walk is bounded
first, see `walk`), written to a fresh directory, and the run starts with
`python -B` and `PYTHONDONTWRITEBYTECODE` (so stale or planted bytecode is never
loaded). The hidden tests themselves never enter the agent's sandbox or working
copy during the episode.

Call-form tasks (generated tasks: `metadata["hidden_calls"]`, rows
`{"name", "module", "function", "args", "expected"}` with `args` and `expected`
in the tagged form of `values`): `grade_calls` sends only module, function and
arguments into the sandbox, which imports the agent's module, calls the
function and prints the *returned values* as tagged JSON. The parent decides:
a call passes iff the returned value's encoding equals `expected` exactly, and
`expected` never leaves the parent. So nothing the code does inside its own
interpreter (printing verdicts, patching the runner or builtins, `sys.settrace`,
objects whose `==` always holds, `True` for `1`) can pass a call it does not
answer correctly; a crash, timeout, malformed or truncated output fails every
call it covers.

Task directories and archives: their hidden `assert f(x) == y` tests are
rewritten into the same call rows at load (`convert`), so they are graded this
way too. Only a task loaded with `env.options.allow_forgeable_grading` (its tests do not
convert) runs each hidden test file through `runner` in its own sandbox on a
fresh copy of the agent's `.py` sources plus the hidden tests: the kernel
isolation holds, but the verdicts come from the interpreter that also runs the
agent's code, so an always-equal return value passes them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from typing import Any, Sequence

from sao_jax.config.env import SandboxLimits
from sao_jax.envs import sandbox
from sao_jax.envs.coding import values, walk

# Room for the returned values of every call (the output cap otherwise).
_RESULT_BYTES = 1 << 20

_RUNNER = r'''
import os, sys
_out = os.dup(1)
_root = sys.path.pop(0)  # The runner's own imports skip the agent's files.
import importlib, io, json
sys.path.insert(0, _root)
_CALLS = json.loads(_CALLS_JSON)
_results = []
for _module, _function, _args in _CALLS:
  sys.stdout = sys.stderr = io.StringIO()
  try:
    _value = getattr(importlib.import_module(_module), _function)(*decode(_args))
    _results.append(["ok", encode(_value)])
  except BaseException as _error:
    _results.append(["raised", repr(type(_error))[:200]])
  finally:
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
_data = (_MARK + json.dumps(_results) + "\n").encode()
while _data:
  _data = _data[os.write(_out, _data):]
'''


def collect_sources(root: str, *, skip: str = "") -> dict[str, bytes]:
  """The `.py` files under `root` (outside the top-level directory `skip` and any
  `__pycache__`), by relative path. Raises `walk.WalkLimit` if the tree is over
  the limits, before anything is read."""
  sources = {}
  for entry in walk.walk(root):
    parts = entry.rel.split(os.sep)
    if entry.is_dir or not entry.rel.endswith(".py") or parts[0] == skip or (
        "__pycache__" in parts):
      continue
    with open(os.path.join(root, entry.rel), "rb") as f:
      sources[entry.rel] = f.read()
  return sources


def write_tree(files: dict[str, bytes], dest: str) -> None:
  """Writes `files` (relative path -> bytes) under `dest` (created)."""
  os.makedirs(dest, exist_ok=True)
  for rel, data in files.items():
    full = os.path.join(dest, rel)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
      f.write(data)


def grade_calls(sources_dir: str, calls: Sequence[dict[str, Any]], limits: SandboxLimits, *,
                isolation: str = sandbox.DEFAULT_SANDBOX) -> list[bool]:
  """Whether each call in `calls` returned exactly its `expected` value, running the
  sources in `sources_dir` in the sandbox (see the module docstring).

  Raises `sandbox.SandboxError` only for a harness failure."""
  mark = secrets.token_hex(16)
  sent = [[c["module"], c["function"], c["args"]] for c in calls]
  with open(values.__file__, encoding="utf-8") as f:
    codec = f.read()
  # A JSON string literal, decoded by the runner: JSON pasted in as Python source has
  # `true`, `null`, `Infinity` (no Python names) and splits characters beyond the BMP
  # into lone surrogates.
  script = f"{codec}\n_MARK = {mark!r}\n_CALLS_JSON = {json.dumps(sent)!r}\n{_RUNNER}"
  limits = dataclasses.replace(limits, max_output_bytes=max(limits.max_output_bytes,
                                                            _RESULT_BYTES))
  result = sandbox.run_python(script, limits, workdir=sources_dir, isolation=isolation)
  returned = _last_report(result.stdout, mark, len(calls))
  return [returned is not None and _matches(got, call["expected"])
          for got, call in zip(returned or [None] * len(calls), calls)]


def _last_report(stdout: str, mark: str, count: int) -> list[Any] | None:
  """The runner's list of `count` results, or None if there is none."""
  for line in reversed(stdout.split("\n")):
    if line.startswith(mark):
      try:
        report = json.loads(line[len(mark):])
      except (ValueError, RecursionError):
        return None
      return report if type(report) is list and len(report) == count else None
  return None


def _matches(got: Any, expected: Any) -> bool:
  """Whether the runner's `["ok", tagged]` holds exactly the tagged `expected` value."""
  if type(got) is not list or len(got) != 2 or got[0] != "ok":
    return False
  try:
    values.decode(got[1])
  except (TypeError, ValueError, RecursionError):
    return False
  return got[1] == expected
