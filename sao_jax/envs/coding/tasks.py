"""Coding tasks on disk: task directories, archives of them, and JSONL lists.

A task is a directory

    <task>/
      task.json       {"problem": "...", "id": "...", "tests_dir": "tests", ...}
      repo/           the repository snapshot; each episode edits a fresh copy
      tests_visible/  tests the agent can read and run: put at <tests_dir>/ in its copy
      tests_hidden/   tests that decide the reward: put at <tests_dir>/ of a fresh
                      grading copy (the agent's files minus its <tests_dir>/)

or an archive of one (`.tar.gz`, `.tgz` or `.tar`) holding `task.json`,
`repo/`, ... at its root or all under one top-level directory.

- `task.json`: a JSON object. `"problem"` (required, non-empty string) is the
  problem statement shown to the agent. `"id"` (optional, non-empty string)
  defaults to the directory or archive name without its extension.
  `"tests_dir"` (optional, default `"tests"`) is a single directory name that
  `repo/` must not already contain. Other keys are kept in `Task.metadata`
  (except the reserved `"snapshot"`, `"files"` and `"fix"`).
- `tests_visible/` and `tests_hidden/` each hold at least one `test*.py` file at
  their top level; other files there (helpers, data) are copied along. Every
  hidden test file must parse. What a test is: `sao_jax.envs.coding.runner`.
- Only regular files and directories: symlinks, hard links, FIFOs and devices
  are rejected, as are absolute or `..` member names in archives.

Sources: `load_task(path)` reads one task directory or archive;
`load_task_root(path)` every subdirectory and archive directly in `path`
(sorted by name; other files such as a README and dot-entries are ignored);
`load_jsonl(path)` one JSON object per line, `{"path": "<task directory or
archive>", "id": "<optional id override>"}`, relative paths resolved against
the JSONL file's directory. Any problem raises ValueError naming the path (and
line) and what is missing or wrong. Loading checks everything eagerly, so a bad
task fails at startup, but keeps only the path; `materialize` re-reads the task
for every episode.

A task is `Task(id, prompt=<problem>, answer="", metadata)`: the hidden tests
are the reference, so `answer` is empty. `metadata["snapshot"]` is the task's
absolute path and `metadata["tests_dir"]` its tests directory; generated tasks
(`coding_generator`) carry their files in memory as `metadata["files"]`
(`{"repo": {relative path: text}, "tests_visible": {...}, "tests_hidden": {...}}`).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import stat
import tarfile
import types
from typing import Callable

from sao_jax import bounded_json
from sao_jax.envs import tasks
from sao_jax.envs.base import Task
from sao_jax.envs.coding import convert
from sao_jax.envs.sandbox import nesting

PARTS = ("repo", "tests_visible", "tests_hidden")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_RESERVED_KEYS = ("snapshot", "files", "fix", "hidden_calls", "forgeable_grading")
MAX_TASK_JSON_BYTES = 1 << 20  # a problem statement and metadata, not data


@dataclasses.dataclass(frozen=True)
class _Listing:
  """What a task directory or archive holds, relative to its task root."""

  files: frozenset[str]
  dirs: frozenset[str]
  read: Callable[[str], bytes]


def _walk_dir(root: str) -> _Listing:
  files, dirs = set(), set()
  for parent, subdirs, names in os.walk(root):
    for name in subdirs + names:
      full = os.path.join(parent, name)
      rel = os.path.relpath(full, root)
      mode = os.lstat(full).st_mode
      if stat.S_ISDIR(mode):
        dirs.add(rel)
      elif stat.S_ISREG(mode):
        files.add(rel)
      else:
        raise ValueError(f"{full}: only regular files and directories are allowed in a task "
                         "(found a symlink or special file); replace it with a regular file.")

  def read(rel: str) -> bytes:
    with open(os.path.join(root, rel), "rb") as f:
      return f.read()
  return _Listing(frozenset(files), frozenset(dirs), read)


def _archive_prefix(path: str, names: list[str]) -> str:
  """"" if task.json is at the archive root, "<top>/" if under one top directory."""
  if "task.json" in names:
    return ""
  tops = {name.split("/", 1)[0] for name in names}
  if len(tops) == 1 and f"{next(iter(tops))}/task.json" in names:
    return next(iter(tops)) + "/"
  raise ValueError(f"{path}: missing task.json (expected at the archive root or under a "
                   "single top-level directory).")


def _archive_members(path: str, tar: tarfile.TarFile) -> tuple[str, list[tarfile.TarInfo]]:
  members = tar.getmembers()
  for member in members:
    parts = member.name.split("/")
    if member.name.startswith("/") or ".." in parts:
      raise ValueError(f"{path}: member {member.name!r} leaves the archive; use relative names "
                       "without '..'.")
    if not (member.isfile() or member.isdir()):
      raise ValueError(f"{path}: member {member.name!r} is not a regular file or directory "
                       "(links and special files are not allowed).")
  names = [m.name.removeprefix("./").rstrip("/") for m in members]
  return _archive_prefix(path, [n for n in names if n and n != "."]), members


def _read_archive(path: str) -> _Listing:
  try:
    with tarfile.open(path) as tar:
      prefix, members = _archive_members(path, tar)
      contents, dirs = {}, set()
      for member in members:
        name = member.name.removeprefix("./").rstrip("/")
        if not name.startswith(prefix) or name == prefix.rstrip("/"):
          continue
        rel = name[len(prefix):]
        if member.isdir():
          dirs.add(rel)
        else:
          contents[rel] = tar.extractfile(member).read()
  except (tarfile.TarError, OSError, EOFError) as e:
    raise ValueError(f"{path}: cannot read the archive ({e}).") from None
  # Archives may omit directory members: every file's parents exist too.
  for rel in contents:
    parts = rel.split("/")
    dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
  return _Listing(frozenset(contents), frozenset(dirs), contents.__getitem__)


def _check_tests(path: str, listing: _Listing, part: str, parse: bool) -> dict[str, str]:
  """The top-level test files of `part`/ (relative path -> source, when `parse`d)."""
  tests = sorted(rel for rel in listing.files
                 if os.path.dirname(rel) == part and os.path.basename(rel).startswith("test")
                 and rel.endswith(".py"))
  if not tests:
    raise ValueError(f"{path}: {part}/ has no test*.py file at its top level; add at least one.")
  sources = {}
  for rel in tests if parse else ():
    try:
      source = listing.read(rel).decode("utf-8")
      # Depth first, without recursion: the parser recurses once per level.
      nesting.check(source, f"{path}: {rel}", nesting.MAX_DEPTH)
      ast.parse(source, filename=rel)
    except (RecursionError, MemoryError) as e:  # nested past the parser all the same
      raise nesting.too_deep(source, f"{path}: {rel}", e) from None
    except (SyntaxError, UnicodeDecodeError) as e:
      raise ValueError(f"{path}: {rel} is not valid Python ({e}); hidden tests must parse.") \
          from None
    sources[rel] = source
  return sources


def load_task(path: str | os.PathLike, *, task_id: str | None = None,
              allow_forgeable_grading: bool = False) -> Task:
  """One task directory or archive (format in the module docstring). Its hidden tests
  become `hidden_calls` (`convert`); tests that do not convert refuse the task unless
  `allow_forgeable_grading`, which grades them in the agent's interpreter instead."""
  path = os.path.abspath(os.fspath(path))
  if os.path.isdir(path):
    listing, name = _walk_dir(path), os.path.basename(path)
  elif path.endswith(ARCHIVE_SUFFIXES) and os.path.isfile(path):
    listing = _read_archive(path)
    name = next(os.path.basename(path)[:-len(s)] for s in ARCHIVE_SUFFIXES if path.endswith(s))
  else:
    raise ValueError(f"{path}: not a task directory or a {'/'.join(ARCHIVE_SUFFIXES)} archive "
                     "of one.")
  if "task.json" not in listing.files:
    raise ValueError(f"{path}: missing task.json.")
  # Bounded before parsing (the parser recurses once per level): errors name the line.
  spec = bounded_json.loads(listing.read("task.json"), max_bytes=MAX_TASK_JSON_BYTES,
                            max_depth=tasks.MAX_NESTING, what=f"{path}/task.json")
  if not isinstance(spec, dict):
    raise ValueError(f"{path}/task.json: expected a JSON object, got {type(spec).__name__}.")
  problem = spec.pop("problem", None)
  if not isinstance(problem, str) or not problem.strip():
    raise ValueError(f"{path}/task.json: 'problem' must be a non-empty string, got {problem!r}.")
  task_id = task_id or spec.pop("id", name)
  spec.pop("id", None)  # Overridden by the caller.
  if not isinstance(task_id, str) or not task_id:
    raise ValueError(f"{path}/task.json: 'id' must be a non-empty string, got {task_id!r}.")
  tests_dir = spec.pop("tests_dir", "tests")
  if (not isinstance(tests_dir, str) or tests_dir in ("", ".", "..") or "/" in tests_dir
      or "\\" in tests_dir):
    raise ValueError(f"{path}/task.json: 'tests_dir' must be a single directory name such as "
                     f"'tests', got {tests_dir!r}.")
  reserved = sorted(set(spec) & set(_RESERVED_KEYS))
  if reserved:
    raise ValueError(f"{path}/task.json: keys {reserved} are reserved; rename them.")
  for part in PARTS:
    if part not in listing.dirs:
      raise ValueError(f"{path}: missing directory {part}/.")
  if f"repo/{tests_dir}" in listing.files | listing.dirs:
    raise ValueError(f"{path}: repo/{tests_dir} already exists, but the visible tests go there; "
                     "set 'tests_dir' in task.json to a name repo/ does not use.")
  _check_tests(path, listing, "tests_visible", parse=False)
  hidden = _check_tests(path, listing, "tests_hidden", parse=True)
  graded: dict = {"hidden_calls": None, "forgeable_grading": False}
  try:
    graded["hidden_calls"] = convert.hidden_calls(hidden, convert.local_modules(
        [*listing.files, *listing.dirs], "tests_hidden"))
  except convert.Unconvertible as error:
    if not allow_forgeable_grading:
      raise ValueError(
          f"{path}: {error}: this hidden test cannot be graded outside the agent's "
          "interpreter, where an object whose == always holds passes it. Write its checks as "
          "`assert f(<literals>) == <literal>` in `def test*():` functions, or set "
          "env.options.allow_forgeable_grading=True to grade it in-process (forgeable).") from None
    graded = {"hidden_calls": None, "forgeable_grading": True}
  return Task(id=task_id, prompt=problem, answer="", metadata=types.MappingProxyType(
      {**spec, "snapshot": path, "tests_dir": tests_dir, **graded}))


def load_task_root(path: str | os.PathLike, *,
                   allow_forgeable_grading: bool = False) -> list[Task]:
  """Every task directory and archive directly inside `path`, sorted by name."""
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise ValueError(f"{path}: not a directory of tasks.")
  entries = sorted(e for e in os.listdir(path) if not e.startswith(".") and (
      os.path.isdir(os.path.join(path, e)) or e.endswith(ARCHIVE_SUFFIXES)))
  if not entries:
    raise ValueError(f"{path}: no task directories or {'/'.join(ARCHIVE_SUFFIXES)} archives.")
  loaded, seen = [], {}
  for entry in entries:
    task = load_task(os.path.join(path, entry), allow_forgeable_grading=allow_forgeable_grading)
    if task.id in seen:
      raise ValueError(f"{os.path.join(path, entry)}: id {task.id!r} is also used by "
                       f"{seen[task.id]}; ids must be unique.")
    seen[task.id] = entry
    loaded.append(task)
  return loaded


def load_jsonl(path: str | os.PathLike, *, allow_forgeable_grading: bool = False) -> list[Task]:
  """Tasks listed in a JSONL file (format in the module docstring)."""
  path = os.fspath(path)
  base = os.path.dirname(os.path.abspath(path))
  loaded, seen = [], {}
  for line_no, where, line in tasks.jsonl_lines(path):
    row = tasks.parse_json_line(line, where)
    if not isinstance(row, dict) or not isinstance(row.get("path"), str) or not row["path"]:
      raise ValueError(f"{where}: expected an object with a non-empty string 'path', "
                       f"got {line.strip()[:200]!r}.")
    if set(row) - {"path", "id"}:
      raise ValueError(f"{where}: unknown keys {sorted(set(row) - {'path', 'id'})}; a row "
                       "holds 'path' and optionally 'id'.")
    if "id" in row and (not isinstance(row["id"], str) or not row["id"]):
      raise ValueError(f"{where}: 'id' must be a non-empty string, got {row['id']!r}.")
    try:
      task = load_task(os.path.join(base, row["path"]), task_id=row.get("id"),
                       allow_forgeable_grading=allow_forgeable_grading)
    except ValueError as e:
      raise ValueError(f"{where}: {e}") from None
    tasks.claim_id(task, seen, where, line_no)
    loaded.append(task)
  if not loaded:
    raise ValueError(f"{path}: no tasks; expected one JSON object per line.")
  return loaded


def copy_tree(src: str, dst: str, *, skip: tuple[str, ...] = ()) -> None:
  """Copies the directories and regular files under `src` into `dst` (created),
  leaving out links, special files and the top-level entries named in `skip`."""
  os.makedirs(dst, exist_ok=True)
  for parent, dirs, files in os.walk(src):
    rel = os.path.relpath(parent, src)
    top = rel == "."
    kept = []
    for name in dirs:
      if not (top and name in skip) and not os.path.islink(os.path.join(parent, name)):
        os.makedirs(os.path.join(dst, rel, name), exist_ok=True)
        kept.append(name)
    dirs[:] = kept
    for name in files:
      full = os.path.join(parent, name)
      if not (top and name in skip) and stat.S_ISREG(os.lstat(full).st_mode):
        shutil.copyfile(full, os.path.join(dst, rel, name))


def materialize(task: Task, dest: str) -> None:
  """Writes the task's `repo/`, `tests_visible/` and `tests_hidden/` into `dest`."""
  files, snapshot = task.metadata.get("files"), task.metadata.get("snapshot")
  if files is not None:
    for part in PARTS:
      for rel, text in files[part].items():
        full = os.path.join(dest, part, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
          f.write(text)
  elif snapshot is not None and os.path.isdir(snapshot):
    for part in PARTS:
      copy_tree(os.path.join(snapshot, part), os.path.join(dest, part))
  elif snapshot is not None:
    unpacked = os.path.join(dest, "archive")
    with tarfile.open(snapshot) as tar:
      prefix, members = _archive_members(snapshot, tar)
      tar.extractall(unpacked, members=members, filter="data")
    for part in PARTS:
      os.rename(os.path.join(unpacked, prefix, part), os.path.join(dest, part))
    shutil.rmtree(unpacked)
  else:
    raise ValueError(f"task {task.id!r} has neither 'files' nor 'snapshot' in its metadata; "
                     "load it with sao_jax.envs.coding.tasks or .generator.")
