"""The coding agent's tools as JSON-schema functions, and the file tools, kept in one directory.

`TOOLS` are the environment's tools in the OpenAI `tools` format
(`sao_jax.chat.tool_calls`): the chat template is given them (`tools=`), a call
is written in the checkpoint's own format (Qwen `<tool_call>` JSON, Llama 3.1
JSON) or, under ChatML, as a fenced block

    ```tool
    {"name": "view", "arguments": {"path": "a.py", "start": 1, "end": 20}}
    ```

and `tool_calls.read` parses and checks it against `TOOLS` (tool names,
argument names, JSON types, required arguments; bad JSON, JSON nested deeper
than the parser's recursion, an integer too long to convert or a string holding
an unpaired surrogate) with a message for the model on any mismatch. Only the
first call of a turn is used. `Workspace` implements the tools that only touch
files (`list`, `view`, `search`, `edit`, `create`), each method taking the
tool's arguments by name; `run_tests`, `python` and `submit` need the sandbox
and live in `sao_jax.envs.coding`.

What `Workspace` enforces, and why:

- Every path is relative to the workspace root and must resolve (symlinks
  followed, `..` collapsed) inside it; absolute paths, `..` escapes and
  symlinks pointing out are refused. The tools run in the environment's own
  process, so this check is the only thing between the model and the host.
- Only regular files are read or written (a FIFO left behind by sandboxed code
  would otherwise block the environment), and files over `MAX_FILE_BYTES` are
  not read.
- `search` matches a literal string, not a regex: a pathological regex would
  stall this process, which has no time limit.
- `edit` replaces text that occurs exactly once; zero or several occurrences
  are errors that say which, so the model never edits the wrong spot.
- Listings, search results and shown lines are capped (`MAX_LIST_ENTRIES`,
  `MAX_MATCHES`, `MAX_SHOWN_LINES`) with a note saying what was left out, and
  the work behind them stops at the cap: search stops at the first
  `MAX_MATCHES` matching lines (it kept and formatted every one: 16 MiB of
  one-letter lines took 56 s and 700 MB of this process), `view` and `edit`
  number only the lines they show (a 4 MiB file of empty lines took 190 MB).
  The walks behind them, and the tree `edit`/`create` may grow, are bounded by
  `walk` (entries, depth, path length, bytes, time), so the copies made for
  the sandbox and grading are too.
- A path longer than `walk.MAX_PATH_BYTES` is refused before it is resolved:
  no file has one, and resolving one takes time quadratic in its length (a
  100 000-component path took 2 s).

Every failure is a `ToolError` whose message is the observation; none escapes
as a crash (OS errors are converted too).
"""

from __future__ import annotations

import os
import stat
from typing import Any, Iterator

from sao_jax.chat import tool_calls
from sao_jax.envs.coding import walk

MAX_FILE_BYTES = 1 << 22
# Of one call's JSON: a `create` of the largest file `view` reads, every character
# escaped (`\uXXXX`, six characters), and its envelope.
MAX_CALL_CHARS = 6 * MAX_FILE_BYTES + 1024
MAX_LIST_ENTRIES = 500
MAX_MATCHES = 100
MAX_SHOWN_LINES = 1000  # lines one view or edit result shows
_MATCH_LINE_CHARS = 200
_EDIT_CONTEXT_LINES = 2
_LISTED_OCCURRENCES = 20  # line numbers an ambiguous edit's error names


def _string(description: str) -> dict[str, str]:
  return {"type": "string", "description": description}


_PATH = "A path relative to the repository root."
TOOLS = (
    tool_calls.function("list", "List the files and directories under a directory "
                        "(directories end with /).",
                        {"path": _string('A directory relative to the repository root; '
                                         'default ".".')}, required=()),
    tool_calls.function("view", "Show numbered lines of a file.", {
        "path": _string(_PATH),
        "start": {"type": "integer", "description": "The first line shown (1-based); default 1."},
        "end": {"type": "integer", "description": "The last line shown; default the last line."},
    }, required=("path",)),
    tool_calls.function("search", "Lines containing the exact text (literal, case-sensitive).", {
        "text": _string("The text to find."),
        "path": _string('A file or directory to search; default ".".')}, required=("text",)),
    tool_calls.function("edit", "Replace text that occurs exactly once in a file.", {
        "path": _string(_PATH), "old": _string("The exact text to replace, whitespace included."),
        "new": _string("The text to put in its place.")}),
    tool_calls.function("create", "Create a new file (not overwrite one).", {
        "path": _string(_PATH), "content": _string("The file's text.")}),
    tool_calls.function("run_tests", "Run the visible tests and report each test.", {
        "path": _string("One test file to run; default every visible test file.")},
        required=()),
    tool_calls.function("python", "Run Python in the repository (fresh interpreter, "
                        "time-limited, no network); files it writes are discarded.",
                        {"code": _string("The Python program to run.")}),
    tool_calls.function("submit", "Finish; hidden tests then decide whether the fix is "
                        "accepted.", {}),
)


class ToolError(Exception):
  """A tool call that cannot be carried out; the message goes back to the model."""


def format_tool_call(name: str, **arguments: Any) -> str:
  """The fenced block that calls `name` with `arguments` (the ChatML format; for
  tests and scripted agents)."""
  return tool_calls.render(tool_calls.ToolCall(name, arguments), "fenced")


def _line_count(text: str) -> int:
  """Lines of `text` split on "\\n" only (so numbers match what `edit` counts); a final
  newline ends the last line rather than starting an empty one."""
  return text.count("\n") + (bool(text) and not text.endswith("\n"))


def _numbered(text: str, first: int, last: int) -> str:
  """Lines `first`..`last` (1-based, at most `_line_count(text)`) of `text`, numbered:
  at most `MAX_SHOWN_LINES` of them, then a note saying how to see the rest. Only
  the shown lines are split out and formatted (splitting a 4 MiB file of empty
  lines into a list took ~70 MB; formatting all of them, 190 MB)."""
  shown = min(last, first + MAX_SHOWN_LINES - 1)
  # Where line `first` starts: the least offset with first - 1 newlines before it, by
  # binary search over C-level counts (a Python step per earlier line took 0.6 s).
  start, end = 0, len(text)
  while start < end:
    middle = (start + end) // 2
    if text.count("\n", 0, middle) < first - 1:
      start = middle + 1
    else:
      end = middle
  lines = text[start:].split("\n", shown - first + 1)
  text = "\n".join(f"{first + i:>6}  {line}" for i, line in enumerate(lines[:shown - first + 1]))
  if shown < last:
    text += (f"\n[lines {shown + 1}-{last} not shown: at most {MAX_SHOWN_LINES} lines at once; "
             "view them with start and end]")
  return text


class Workspace:
  """The file tools over the directory `root` (see the module docstring)."""

  def __init__(self, root: str | os.PathLike):
    self.root = os.path.realpath(root)

  def resolve(self, path: str) -> str:
    """The absolute path of `path`, which must stay inside the root."""
    if not path.strip() or "\x00" in path:
      raise ToolError(f"invalid path {path!r}.")
    if len(path) > walk.MAX_PATH_BYTES:  # characters <= UTF-8 bytes; realpath is quadratic
      raise ToolError(f"the path has {len(path)} characters; no path in the repository is "
                      f"longer than {walk.MAX_PATH_BYTES} bytes.")
    if os.path.isabs(path):
      raise ToolError(f"{path!r} is an absolute path; use a path relative to the repository "
                      "root.")
    full = os.path.realpath(os.path.join(self.root, path))
    if full != self.root and not full.startswith(self.root + os.sep):
      raise ToolError(f"{path!r} is outside the repository; paths must stay inside it.")
    return full

  def _relative(self, full: str) -> str:
    return os.path.relpath(full, self.root)

  def _read(self, path: str) -> tuple[str, bytes]:
    full = self.resolve(path)
    try:
      info = os.stat(full)
      if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{path!r} is a directory; use list to see its files.")
      if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{path!r} is not a regular file.")
      if info.st_size > MAX_FILE_BYTES:
        raise ToolError(f"{path!r} has {info.st_size} bytes; files over {MAX_FILE_BYTES} bytes "
                        "are not read.")
      with open(full, "rb") as f:
        return full, f.read()
    except FileNotFoundError:
      raise ToolError(f"{path!r} does not exist.") from None
    except OSError as e:
      raise ToolError(f"cannot read {path!r}: {e.strerror}.") from None

  def read_text(self, path: str) -> str:
    """The UTF-8 text of the regular file `path`."""
    _, data = self._read(path)
    try:
      return data.decode("utf-8")
    except UnicodeDecodeError:
      raise ToolError(f"{path!r} is not UTF-8 text.") from None

  def _tree(self, top: str) -> list[walk.Entry]:
    """`walk.walk(top)`, its limits reported as a `ToolError`."""
    try:
      return walk.walk(top)
    except walk.WalkLimit as e:
      raise ToolError(f"the repository is over the limits ({e}); delete files first.") from None

  def _check_room(self, full: str, size: int) -> None:
    """Refuses a write that would take the tree over `walk`'s limits."""
    rel = self._relative(full)
    if len(os.fsencode(rel)) > walk.MAX_PATH_BYTES or rel.count(os.sep) > walk.MAX_DEPTH:
      raise ToolError(f"{rel!r} is too long or too deep: at most {walk.MAX_PATH_BYTES} "
                      f"bytes (UTF-8) and {walk.MAX_DEPTH} directories.")
    entries = {e.rel: e.size for e in self._tree(self.root)}
    parts = rel.split(os.sep)
    added = sum(os.path.join(*parts[:i]) not in entries for i in range(1, len(parts) + 1))
    if len(entries) + added > walk.MAX_ENTRIES:
      raise ToolError(f"the repository would have more than {walk.MAX_ENTRIES} files and "
                      "directories.")
    if sum(entries.values()) - entries.get(rel, 0) + size > walk.MAX_TOTAL_BYTES:
      raise ToolError(f"the repository would hold more than {walk.MAX_TOTAL_BYTES} bytes.")

  def _write(self, full: str, text: str) -> None:
    self._check_room(full, len(text.encode("utf-8")))
    try:
      os.makedirs(os.path.dirname(full), exist_ok=True)
      with open(full, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    except OSError as e:
      raise ToolError(f"cannot write {self._relative(full)!r}: {e.strerror}.") from None

  def list(self, path: str = ".") -> str:
    """Every file and directory under `path` (directories end with "/")."""
    top = self.resolve(path)
    if not os.path.isdir(top):
      raise ToolError(f"{path!r} is not a directory.")
    entries = sorted(self._relative(os.path.join(top, e.rel)) + ("/" if e.is_dir else "")
                     for e in self._tree(top))
    if not entries:
      return f"{path!r} is empty."
    return _capped(entries, MAX_LIST_ENTRIES, "entries")

  def view(self, path: str, start: int | None = None, end: int | None = None) -> str:
    """Lines `start`..`end` (1-based, inclusive; `end` past the file is clamped), at most
    `MAX_SHOWN_LINES` of them."""
    text = self.read_text(path)
    count = _line_count(text)
    if not count:
      return f"{path} is empty."
    first = 1 if start is None else start
    last = count if end is None else min(end, count)
    if not 1 <= first <= count or last < first:
      raise ToolError(f"lines {first}-{end if end is not None else count} are out of range: "
                      f"{path} has {count} lines (start must be 1..{count}, end >= start).")
    return f"{path} (lines {first}-{last} of {count}):\n" + _numbered(text, first, last)

  def search(self, text: str, path: str = ".") -> str:
    """`file:line: content` for the first `MAX_MATCHES` lines containing `text` (literal,
    case-sensitive), then a note if there are more."""
    if not text:
      raise ToolError("search text must not be empty.")
    top = self.resolve(path)
    if os.path.isdir(top):
      files = [os.path.join(top, e.rel) for e in self._tree(top) if not e.is_dir]
    elif os.path.isfile(top):
      files = [top]
    else:
      raise ToolError(f"{path!r} is not a file or directory.")
    matches = []
    for full in files:
      try:
        info = os.lstat(full)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
          continue
        with open(full, "rb") as f:
          data = f.read()
      except OSError:
        continue
      if b"\x00" in data:
        continue
      rel = self._relative(full)
      for number, line in _matching_lines(data.decode("utf-8", "replace"), text):
        if len(matches) == MAX_MATCHES:
          matches.append(f"[more matches not shown: only the first {MAX_MATCHES} are listed; "
                         "narrow the search with path or a longer text]")
          return "\n".join(matches)
        matches.append(f"{rel}:{number}: {line}")
    if not matches:
      return f"no matches for {text!r} under {path!r}."
    return "\n".join(matches)

  def edit(self, path: str, old: str, new: str) -> str:
    """Replaces the one occurrence of `old` in `path` with `new`."""
    if not old:
      raise ToolError("old must not be empty; use create for a new file.")
    full, text = self.resolve(path), self.read_text(path)
    count = text.count(old)
    if count == 0:
      raise ToolError(f"the old text was not found in {path}; copy it exactly (whitespace and "
                      "indentation included) from view.")
    if count > 1:
      # Lines counted from the previous occurrence on, for the first few only: counting
      # from the top for each of 10^5 occurrences stalled this process for minutes.
      starts, at, line, counted = [], text.find(old), 1, 0
      while at >= 0 and len(starts) < _LISTED_OCCURRENCES:
        line, counted = line + text.count("\n", counted, at), at
        starts.append(line)
        at = text.find(old, at + 1)
      more = ", ..." if count > len(starts) else ""
      raise ToolError(f"the old text occurs {count} times in {path} (starting on lines "
                      f"{', '.join(map(str, starts))}{more}); include more surrounding lines so "
                      "that it occurs once.")
    at = text.index(old)
    updated = text[:at] + new + text[at + len(old):]
    self._write(full, updated)
    first = text.count("\n", 0, at) + 1
    last = first + new.count("\n")
    lo = max(first - _EDIT_CONTEXT_LINES, 1)
    hi = min(last + _EDIT_CONTEXT_LINES, _line_count(updated))
    return f"edited {path}; lines {lo}-{hi} now read:\n" + _numbered(updated, lo, hi)

  def create(self, path: str, content: str) -> str:
    """Writes a new file (parent directories are created); existing paths are refused."""
    full = self.resolve(path)
    if os.path.lexists(full):
      raise ToolError(f"{path} already exists; use edit to change it.")
    if len(content.encode("utf-8")) > MAX_FILE_BYTES:
      raise ToolError(f"content has more than {MAX_FILE_BYTES} bytes.")
    self._write(full, content)
    return f"created {path} ({_line_count(content)} lines)."


def _matching_lines(content: str, text: str) -> Iterator[tuple[int, str]]:
  """(number, first `_MATCH_LINE_CHARS` characters) of each line of `content` (split
  on "\\n", as `_line_count` counts them) that contains `text`, lazily: `str.find` skips the
  lines between matches, so a caller that stops early pays for no more."""
  if "\n" in text:  # no line holds a newline
    return
  number, counted, at = 1, 0, content.find(text)
  while at >= 0:
    start = content.rfind("\n", 0, at) + 1
    end = content.find("\n", at)
    end = len(content) if end < 0 else end
    number, counted = number + content.count("\n", counted, start), start
    yield number, content[start:min(end, start + _MATCH_LINE_CHARS)]
    at = content.find(text, end + 1)


def _capped(lines: list[str], limit: int, noun: str) -> str:
  """The first `limit` lines, and how many more were left out."""
  shown = lines[:limit]
  if len(lines) > limit:
    shown.append(f"[{len(lines) - limit} more {noun} not shown]")
  return "\n".join(shown)
