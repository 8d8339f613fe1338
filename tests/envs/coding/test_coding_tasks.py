"""Coding tasks: directory/archive/JSONL loading with named errors, the generator, the bank."""

import io
import json
import os
import random
import tarfile

import pytest

from sao_jax.envs.coding import bugs as coding_bugs
from sao_jax.envs.coding import generator as coding_generator
from sao_jax.envs.coding import tasks as coding_tasks

HIDDEN = "from calc import add\n\n\ndef test_small():\n    assert add(1, 2) == 3\n"


def write_task(root, name="t1", **spec):
  """A minimal valid task directory; returns its path."""
  task = root / name
  (task / "repo").mkdir(parents=True)
  (task / "repo" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
  (task / "tests_visible").mkdir()
  (task / "tests_visible" / "test_calc.py").write_text(
      "from calc import add\nassert add(0, 0) == 0\n")
  (task / "tests_hidden").mkdir()
  (task / "tests_hidden" / "test_calc.py").write_text(HIDDEN)
  (task / "tests_hidden" / "data.txt").write_text("helper file\n")
  (task / "task.json").write_text(json.dumps({"problem": "add subtracts", **spec}))
  return task


def tar_task(task, path, top=None):
  with tarfile.open(path, "w:gz") as tar:
    for entry in sorted(os.listdir(task)):
      tar.add(task / entry, arcname=entry if top is None else f"{top}/{entry}")
  return path


def read_tree(root):
  return {os.path.relpath(os.path.join(parent, name), root): open(os.path.join(parent, name)).read()
          for parent, _, names in os.walk(root) for name in names}


def test_directory_task_loads_and_materializes(tmp_path):
  path = write_task(tmp_path, source="unit", tests_dir="checks")
  task = coding_tasks.load_task(path)
  assert (task.id, task.prompt, task.answer) == ("t1", "add subtracts", "")
  assert dict(task.metadata) == {
      "source": "unit", "snapshot": str(path), "tests_dir": "checks", "forgeable_grading": False,
      "hidden_calls": ({"name": "tests_hidden/test_calc.py::test_small", "module": "calc",
                        "function": "add", "args": ["tuple", [["int", 1], ["int", 2]]],
                        "expected": ["int", 3]},)}
  coding_tasks.materialize(task, str(tmp_path / "out"))
  assert read_tree(tmp_path / "out") == {
      "repo/calc.py": "def add(a, b):\n    return a - b\n",
      "tests_visible/test_calc.py": "from calc import add\nassert add(0, 0) == 0\n",
      "tests_hidden/test_calc.py": HIDDEN, "tests_hidden/data.txt": "helper file\n"}


@pytest.mark.parametrize("top", [None, "t1"])
def test_archives_hold_the_same_task(tmp_path, top):
  directory = write_task(tmp_path)
  archive = tar_task(directory, tmp_path / "packed.tar.gz", top=top)
  task = coding_tasks.load_task(archive)
  assert task.id == "packed" and task.metadata["snapshot"] == str(archive)
  coding_tasks.materialize(task, str(tmp_path / "a"))
  coding_tasks.materialize(coding_tasks.load_task(directory), str(tmp_path / "d"))
  assert read_tree(tmp_path / "a") == read_tree(tmp_path / "d")


def test_task_root_loads_dirs_and_archives_and_ignores_other_files(tmp_path):
  root = tmp_path / "tasks"
  write_task(root, "b")
  tar_task(write_task(tmp_path, "a"), root / "a.tgz")
  (root / "README.md").write_text("not a task")
  (root / ".cache").mkdir()
  assert [t.id for t in coding_tasks.load_task_root(root)] == ["a", "b"]
  write_task(root, "c", id="b")
  with pytest.raises(ValueError, match=r"c: id 'b' is also used by b"):
    coding_tasks.load_task_root(root)
  with pytest.raises(ValueError, match="no task directories"):
    coding_tasks.load_task_root(tmp_path / "tasks" / ".cache")
  with pytest.raises(ValueError, match="not a directory of tasks"):
    coding_tasks.load_task_root(tmp_path / "missing")


def test_jsonl_resolves_paths_against_its_directory(tmp_path):
  write_task(tmp_path / "tasks", "one")
  tar_task(write_task(tmp_path, "two"), tmp_path / "tasks" / "two.tar")
  path = tmp_path / "tasks.jsonl"
  path.write_text(json.dumps({"path": "tasks/one"}) + "\n"
                  + json.dumps({"path": str(tmp_path / "tasks" / "two.tar"), "id": "x"}) + "\n")
  one, two = coding_tasks.load_jsonl(path)
  assert (one.id, two.id) == ("one", "x") and "id" not in two.metadata


@pytest.mark.parametrize("line, message", [
    ("", "blank line"),
    ("{oops", "invalid JSON"),
    (json.dumps({"id": "x"}), "expected an object with a non-empty string 'path'"),
    (json.dumps({"path": "tasks/one", "weight": 2}), r"unknown keys \['weight'\]"),
    (json.dumps({"path": "tasks/one", "id": 3}), "'id' must be a non-empty string"),
    (json.dumps({"path": "tasks/none"}), "tasks/none: not a task directory"),
    (json.dumps({"path": "tasks/one"}), "id 'one' already used on line 1"),
    ('{"path": "tasks/one", "id": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more than"),
    ('{"path": "tasks/\xe9"}', "not valid UTF-8"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, line, message):
  write_task(tmp_path / "tasks", "one")
  path = tmp_path / "tasks.jsonl"
  path.write_bytes((json.dumps({"path": "tasks/one"}) + "\n" + line + "\n").encode("latin-1"))
  with pytest.raises(ValueError, match=message) as error:
    coding_tasks.load_jsonl(path)
  assert str(error.value).startswith(f"{path}:2: ")
  path.write_text("")
  with pytest.raises(ValueError, match="no tasks"):
    coding_tasks.load_jsonl(path)


def remove(path):
  if path.is_dir():
    for child in path.iterdir():
      remove(child)
    path.rmdir()
  else:
    path.unlink()


@pytest.mark.parametrize("damage, message", [
    (lambda t: remove(t / "task.json"), "missing task.json"),
    (lambda t: (t / "task.json").write_text("{"), r"task.json: not JSON"),
    (lambda t: (t / "task.json").write_text("[]"), "expected a JSON object, got list"),
    (lambda t: (t / "task.json").write_text("{}"), "'problem' must be a non-empty string"),
    (lambda t: (t / "task.json").write_text('{"problem": "p", "id": ""}'), "'id' must be"),
    (lambda t: (t / "task.json").write_text('{"problem": "p", "tests_dir": "a/b"}'),
     "'tests_dir' must be a single directory name"),
    (lambda t: (t / "task.json").write_text('{"problem": "p", "fix": []}'),
     r"keys \['fix'\] are reserved"),
    (lambda t: remove(t / "repo"), "missing directory repo/"),
    (lambda t: remove(t / "tests_hidden"), "missing directory tests_hidden/"),
    (lambda t: remove(t / "tests_visible" / "test_calc.py"),
     "tests_visible/ has no test\\*.py file at its top level"),
    (lambda t: (t / "tests_hidden" / "test_calc.py").write_text("def broken(:\n"),
     "tests_hidden/test_calc.py is not valid Python"),
    (lambda t: (t / "repo" / "tests").mkdir(), "repo/tests already exists"),
    (lambda t: os.symlink("/etc/passwd", t / "repo" / "passwd"),
     "only regular files and directories are allowed"),
])
def test_bad_task_directories_name_the_path_and_the_problem(tmp_path, damage, message):
  task = write_task(tmp_path)
  damage(task)
  with pytest.raises(ValueError, match=message) as error:
    coding_tasks.load_task(task)
  assert str(task) in str(error.value)


def add_member(archive, info, data=None):
  """Appends one member to an existing gzip archive (rewrites it)."""
  with tarfile.open(archive, "r:gz") as tar:
    members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
  with tarfile.open(archive, "w:gz") as tar:
    for member, content in members + [(info, data)]:
      tar.addfile(member, None if content is None else io.BytesIO(content))


def test_unsafe_archives_are_rejected(tmp_path):
  archive = tar_task(write_task(tmp_path), tmp_path / "bad.tar.gz")
  link = tarfile.TarInfo("repo/passwd")
  link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
  add_member(archive, link)
  with pytest.raises(ValueError, match="'repo/passwd' is not a regular file or directory"):
    coding_tasks.load_task(archive)
  archive = tar_task(write_task(tmp_path, "t2"), tmp_path / "escape.tar.gz")
  add_member(archive, tarfile.TarInfo("../escape.txt"), b"")
  with pytest.raises(ValueError, match="'../escape.txt' leaves the archive"):
    coding_tasks.load_task(archive)


def test_archive_without_task_json_and_unknown_paths(tmp_path):
  (tmp_path / "x.txt").write_text("x")
  with tarfile.open(tmp_path / "empty.tar", "w") as tar:
    tar.add(tmp_path / "x.txt", arcname="x.txt")
  with pytest.raises(ValueError, match="empty.tar: missing task.json"):
    coding_tasks.load_task(tmp_path / "empty.tar")
  with pytest.raises(ValueError, match="x.txt: not a task directory or a .tar.gz/.tgz/.tar"):
    coding_tasks.load_task(tmp_path / "x.txt")


def test_generator_is_deterministic_and_seeded():
  first = [coding_generator.generate_task(i, seed=5, difficulty=3) for i in range(10)]
  assert first == [coding_generator.generate_task(i, seed=5, difficulty=3) for i in range(10)]
  stream = coding_generator.iterate_generated(seed=5, difficulty=3)
  assert [next(stream) for _ in range(10)] == first
  other = [coding_generator.generate_task(i, seed=6, difficulty=3) for i in range(10)]
  assert [t.prompt for t in other] != [t.prompt for t in first]
  # Pinned: a change here changes every generated training set.
  assert coding_generator.generate_task(0, seed=0, difficulty=1).prompt == GOLDEN_PROMPT


GOLDEN_PROMPT = (
    "Fix the bug in this repository. Bug reports:\n"
    "- median([1, 2, 3, 4]) in utilities.py should return 2.5, but it returns 3.5.\n"
    "Fix the code, not the tests: hidden tests with other inputs decide whether the fix is "
    "accepted.")


@pytest.mark.parametrize("difficulty, functions, modules, bugs", [
    (1, 1, 1, 1), (2, 3, 1, 1), (3, 5, 2, 1), (4, 7, 2, 2), (5, 9, 3, 3)])
def test_difficulty_sets_the_size(difficulty, functions, modules, bugs):
  for index in range(5):
    task = coding_generator.generate_task(index, difficulty=difficulty)
    files = task.metadata["files"]
    sources = "".join(files["repo"].values())
    assert len(files["repo"]) == len({c["module"] for c in task.metadata["hidden_calls"]}) == modules
    assert files["tests_hidden"] == {}  # Hidden tests are calls graded outside the sandbox.
    assert sources.count("\ndef ") == functions
    assert len(task.metadata["fix"]) == len(task.metadata["bug_kinds"]) == bugs
    assert task.prompt.count("\n- ") == bugs
    assert (".py should return" in task.prompt) == (difficulty <= 2)
    assert (", but it " in task.prompt) == (difficulty <= 4)


@pytest.mark.parametrize("kind", coding_bugs.KINDS)
def test_kind_selects_the_planted_bugs(kind):
  for index in range(4):
    task = coding_generator.generate_task(index, difficulty=5, kind=kind)
    assert set(task.metadata["bug_kinds"]) == {kind}


@pytest.mark.parametrize("bad", [{"difficulty": 0}, {"difficulty": True}, {"kind": "typo"}])
def test_generator_arguments_are_validated(bad):
  with pytest.raises(ValueError, match=next(iter(bad))):
    coding_generator.generate_task(0, **bad)


@pytest.mark.parametrize("template", coding_bugs.BANK, ids=lambda t: t.name)
def test_every_bank_bug_is_unique_and_exposed_by_an_edge_case(template):
  correct = coding_generator.compile_function(template.source, template.name)
  assert {bug.kind for bug in template.bugs} <= set(coding_bugs.KINDS)
  for bug in template.bugs:
    assert template.source.count(bug.old) == 1, bug
    wrong = coding_generator.compile_function(template.source.replace(bug.old, bug.new),
                                              template.name)
    exposed = [case for case in template.edge_cases
               if coding_generator.outcome(wrong, case) != coding_generator.outcome(correct, case)]
    assert exposed, (template.name, bug)
  rng = random.Random(0)
  for _ in range(50):  # Random cases are valid inputs of the correct function.
    assert coding_generator.outcome(correct, template.random_case(rng)).startswith("returns ")


def test_solution_actions_need_a_fix(tmp_path):
  with pytest.raises(ValueError, match="has no 'fix'"):
    coding_generator.solution_actions(coding_tasks.load_task(write_task(tmp_path)))


# Nested past the parser: these raised RecursionError (task.json, `-` and `.` chains)
# or MemoryError (`lambda` chains) from this process, naming no file.
DEEP_TESTS = [
    "x = 1\n\n" + "x = " + "-" * 5000 + "1\n",
    "x = 1\n\n" + "x = " + "1+" * 5000 + "1\n",
    "x = 1\n\n" + "x = a" + ".a" * 5000 + "\n",
    "x = 1\n\n" + "x = " + "lambda: " * 3000 + "1\n",
    "x = 1\n\n" + 'x = f"{' + "-" * 5000 + '1}"\n',
]


def test_a_deeply_nested_task_json_is_a_value_error_naming_file_and_line(tmp_path):
  task = write_task(tmp_path)
  (task / "task.json").write_text('{"problem": "p",\n "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
  with pytest.raises(ValueError, match=r"task.json: JSON nested 100001 deep, more than the 64 "
                                       r"allowed \(from line 2\)") as error:
    coding_tasks.load_task(task)
  assert str(task) in str(error.value)


@pytest.mark.parametrize("source", DEEP_TESTS)
def test_a_deeply_nested_hidden_test_is_a_value_error_naming_file_and_line(tmp_path, source):
  task = write_task(tmp_path)
  (task / "tests_hidden" / "test_calc.py").write_text(source)
  with pytest.raises(ValueError, match=r"tests_hidden/test_calc.py, line 3: Python nested too "
                                       r"deeply") as error:
    coding_tasks.load_task(task)
  assert str(task) in str(error.value)
  tar = tar_task(task, tmp_path / "t1.tar.gz")  # the same from an archive
  with pytest.raises(ValueError, match=r"tests_hidden/test_calc.py, line 3: Python nested"):
    coding_tasks.load_task(tar)


def test_real_nesting_below_the_bound_still_loads(tmp_path):
  """The depth bound is not a parser: long flat data and ordinary nesting pass."""
  task = write_task(tmp_path)
  (task / "tests_hidden" / "test_calc.py").write_text(
      HIDDEN + "DATA = [" + ", ".join(f"({i} + 1, -{i})" for i in range(20000)) + "]\n"
      + "Y = " + "(" * 150 + "1" + ")" * 150 + "\n" + "S = f'{DATA[0]!r:>{10}} {{literal}}'\n")
  # Top-level data does not convert into graded calls (`convert`): loaded as forgeable.
  assert coding_tasks.load_task(task, allow_forgeable_grading=True).prompt == "add subtracts"
