"""Every package the library imports is a declared dependency of what needs it.

A module-level import runs whenever the module is imported, so its package must
be a runtime dependency (`[project] dependencies`); an import inside a function
runs only on the path that calls it (a `gs://` run, W&B logging, a TPU plan), so
its package may instead come from an extra. The `jinja2` import of
`sao_jax/chat/format.py`, satisfied only by the dev extra's transformers, is the
case this catches: a bare `pip install` could not start (`.ci/bare_install`
checks the same thing by installing the wheel into an empty environment).
"""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _normalized(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _requirement_name(requirement: str) -> str:
  return _normalized(re.match(r"[A-Za-z0-9_.-]+", requirement).group(0))


def _extra_names(extra: str, seen: frozenset = frozenset()) -> set[str]:
  """The distributions an extra names, `sao-jax[other]` expanded (jax[tpu] is jax)."""
  names = set()
  for requirement in PYPROJECT["project"]["optional-dependencies"][extra]:
    name = _requirement_name(requirement)
    if name == "sao-jax":
      for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
        if inner not in seen:
          names |= _extra_names(inner.strip(), seen | {extra})
    else:
      names.add(name)
  return names


RUNTIME = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
# The extras a user installs to reach an optional path; dev is the tests' own.
OPTIONAL = set().union(*(_extra_names(e) for e in PYPROJECT["project"]["optional-dependencies"]
                         if e != "dev"))
# Packages that ship without distribution metadata of their own module name.
PROVIDED_BY = {"libtpu": "jax"}  # jax[tpu] installs libtpu


def _imports(path: pathlib.Path) -> list[tuple[str, bool]]:
  """(top-level module, imported at module level) for every import in a file."""
  found = []

  def visit(node: ast.AST, in_function: bool) -> None:
    for child in ast.iter_child_nodes(node):
      inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
      if isinstance(child, ast.Import):
        found.extend((alias.name.split(".")[0], not in_function) for alias in child.names)
      elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
        found.append((child.module.split(".")[0], not in_function))
      visit(child, inner)

  visit(ast.parse(path.read_text()), False)
  return found


def _third_party() -> dict[str, dict[str, bool]]:
  """module -> {file: imported at module level anywhere in it}."""
  modules: dict[str, dict[str, bool]] = {}
  for path in sorted((ROOT / "sao_jax").rglob("*.py")):
    for module, top in _imports(path):
      if module in sys.stdlib_module_names or module == "sao_jax":
        continue
      where = modules.setdefault(module, {})
      where[path.relative_to(ROOT).as_posix()] = where.get(path.relative_to(ROOT).as_posix(), False) or top
  return modules


def _distributions(module: str) -> set[str]:
  if module in PROVIDED_BY:
    return {PROVIDED_BY[module]}
  names = importlib.metadata.packages_distributions().get(module)
  assert names, f"{module!r} is imported by sao_jax but no installed distribution provides it"
  return {_normalized(n) for n in names}


def test_module_level_imports_are_runtime_dependencies():
  missing = {}
  for module, files in _third_party().items():
    at_top = sorted(f for f, top in files.items() if top)
    if at_top and not _distributions(module) & RUNTIME:
      missing[module] = at_top
  assert not missing, ("imported at module level but not in pyproject's [project] dependencies "
                       f"(a bare install fails): {missing}")


def test_function_level_imports_are_declared_somewhere():
  missing = {}
  for module, files in _third_party().items():
    if not _distributions(module) & (RUNTIME | OPTIONAL):
      missing[module] = sorted(files)
  assert not missing, f"imported but declared neither at runtime nor in a user extra: {missing}"


def test_the_checker_sees_a_module_level_import_and_a_lazy_one(tmp_path):
  source = tmp_path / "m.py"
  source.write_text("import jinja2.sandbox\nfrom os import path\n"
                    "def f():\n  import wandb\n  from fsspec import core\n")
  assert _imports(source) == [("jinja2", True), ("os", True), ("wandb", False), ("fsspec", False)]


def test_the_accelerator_extras_install_one_jax_version():
  """`.[gpu]` (jax[cuda12]) and `.[tpu]` (jax[tpu]) pin the same jax, which satisfies the
  runtime floor, and the TPU scripts' example JAX_VERSION is that version: a GPU box, a
  TPU VM and an AOT plan run the same compiler."""
  extras = PYPROJECT["project"]["optional-dependencies"]
  pins = {}
  for extra in ("gpu", "tpu"):
    found = [re.fullmatch(r"jax\[(\w+)\]==([\d.]+)", r) for r in extras[extra]]
    found = [m for m in found if m]
    assert len(found) == 1, f"the {extra} extra pins jax[...]==VERSION once: {extras[extra]}"
    pins[extra] = found[0].group(2)
  assert pins["gpu"] == pins["tpu"], pins
  floor = next(re.fullmatch(r"jax>=([\d.]+)", r).group(1)
               for r in PYPROJECT["project"]["dependencies"] if r.startswith("jax>="))
  version = tuple(int(n) for n in pins["tpu"].split("."))
  assert version >= tuple(int(n) for n in floor.split(".")), (pins, floor)
  example = re.search(r'JAX_VERSION\) echo "([\d.]+)"',
                      (ROOT / "tpu_scripts" / "common.sh").read_text()).group(1)
  assert example == pins["tpu"], f"tpu_scripts/common.sh suggests JAX_VERSION={example}"
