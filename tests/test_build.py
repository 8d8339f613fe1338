"""BUILD stays consistent with the tree: every module and every test file is covered."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bazel"))
import update_build  # noqa: E402  (bazel/ is not a package)
BUILD = (ROOT / "BUILD").read_text()


def _library_srcs():
  block = re.search(r'py_library\(\s*name = "sao_jax",.*?srcs = \[(.*?)\]', BUILD, re.S)
  assert block, "BUILD has no py_library named sao_jax with a srcs list"
  return set(re.findall(r'"([^"]+\.py)"', block.group(1)))


def _pytest_targets():
  return re.findall(r'pytest_test\(\s*name = "([^"]+)",\s*src = "([^"]+)"', BUILD)


def test_every_module_is_in_the_library():
  on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "sao_jax").rglob("*.py")}
  listed = _library_srcs()
  assert not on_disk - listed, f"add to BUILD py_library srcs: {sorted(on_disk - listed)}"
  assert not listed - on_disk, f"BUILD lists missing files: {sorted(listed - on_disk)}"


def test_every_test_file_has_one_target():
  on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
  srcs = [src for _, src in _pytest_targets()]
  missing = on_disk - set(srcs)
  assert not missing, f"add a pytest_test to BUILD for: {sorted(missing)}"
  stale = set(srcs) - on_disk
  assert not stale, f"BUILD has pytest_test for missing files: {sorted(stale)}"
  duplicated = {s for s in srcs if srcs.count(s) > 1}
  assert not duplicated, f"more than one pytest_test for: {sorted(duplicated)}"


def test_target_names_are_unique():
  names = [name for name, _ in _pytest_targets()]
  assert len(names) == len(set(names)), f"duplicate pytest_test names in BUILD: {names}"


def test_library_depends_on_every_runtime_requirement():
  """The py_library's deps are pyproject's runtime dependencies, no more, no less."""
  block = re.search(r'py_library\(\s*name = "sao_jax",.*?deps = \[(.*?)\]', BUILD, re.S)
  assert block, "BUILD has no py_library named sao_jax with a deps list"
  listed = re.findall(r'requirement\("([^"]+)"\)', block.group(1))
  assert listed == update_build.runtime_requirements(), "run `python bazel/update_build.py`"


def _normalized(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def test_test_deps_are_the_dev_extra():
  got = (ROOT / "bazel" / "test_deps.bzl").read_text()
  assert got == update_build.render_test_deps(), "run `python bazel/update_build.py`"
  assert "mkdocs" in update_build.test_requirements()  # sao-jax[docs] expanded


def test_the_lock_pins_every_requirement():
  """The pip hub resolves every runtime and test requirement from the lock (a
  package missing there fails every Bazel target that needs it)."""
  lines = (ROOT / "requirements_lock.txt").read_text().splitlines()
  pinned = {_normalized(line.split("==")[0]) for line in lines if "==" in line}
  wanted = {_normalized(n) for n in update_build.runtime_requirements() + update_build.test_requirements()}
  assert not wanted - pinned, (f"requirements_lock.txt lacks {sorted(wanted - pinned)}: regenerate it "
                               "(bazel/update_build.py's docstring says how)")
