"""Coding tools: their schemas and calls (`sao_jax.chat.tool_calls`, the "fenced" format
ChatML runs use) and the confined file tools (no sandbox needed)."""

import os
import pathlib
import re
import time
import tracemalloc

import pytest

from sao_jax.chat import tool_calls
from sao_jax.chat.tool_calls import ToolCall, ToolCallError
from sao_jax.envs.coding import tools as coding_tools
from sao_jax.envs.coding.tools import ToolError, Workspace, format_tool_call

SOURCE = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n"


@pytest.fixture
def workspace(tmp_path):
  root = tmp_path / "work"
  (root / "pkg").mkdir(parents=True)
  (root / "pkg" / "mod.py").write_text(SOURCE)
  (root / "notes.txt").write_text("alpha\nbeta x + 1\n")
  return Workspace(root)


def test_format_and_parse_round_trip():
  text = "Let me look.\n\n" + format_tool_call("view", path="a.py", start=2)
  assert parse_first(text) == ToolCall("view", {"path": "a.py", "start": 2})
  assert parse_first(format_tool_call("submit")) == ToolCall("submit", {})
  assert parse_first('```tool\n{"name": "list"}\n```') == ToolCall("list", {})
  assert parse_first("no tool call here ```python\nprint(1)\n```") is None


def parse_first(text):
  return tool_calls.read(text, "fenced", coding_tools.TOOLS, max_chars=coding_tools.MAX_CALL_CHARS)


def test_every_tool_method_takes_its_schema_arguments(workspace):
  """A call that fits a file tool's schema is a valid call of the Workspace method."""
  for tool in coding_tools.TOOLS:
    spec = tool["function"]
    method = getattr(workspace, spec["name"], None)
    if spec["name"] in ("run_tests", "python", "submit"):  # the environment's, not the files'
      assert method is None
      continue
    code = method.__code__
    assert list(code.co_varnames[1:code.co_argcount]) == list(spec["parameters"]["properties"])
    optional = code.co_varnames[code.co_argcount - len(method.__defaults__ or ()):code.co_argcount]
    assert sorted(spec["parameters"]["required"]) == sorted(
        set(spec["parameters"]["properties"]) - set(optional))


def test_only_the_first_block_counts_and_backticks_inside_strings_are_fine():
  edit = format_tool_call("edit", path="README.md", old="```\ncode\n```", new="")
  text = edit + "\n" + format_tool_call("submit")
  call = parse_first(text)
  assert call.name == "edit" and call.arguments["old"] == "```\ncode\n```"
  pretty = '```tool\n{\n  "name": "view",\n  "arguments": {"path": "a.py"}\n}\n```'
  assert parse_first(pretty).arguments["path"] == "a.py"
  inline = '```tool\n{"name": "search", "arguments": {"text": "a ``` b"}}\n```'
  assert parse_first(inline).arguments == {"text": "a ``` b"}
  # The key the coding environment's blocks used before they were the shared format.
  assert parse_first('```tool\n{"name": "view", "args": {"path": "a.py"}}\n```') == ToolCall(
      "view", {"path": "a.py"})


@pytest.mark.parametrize("block, message", [
    ("{bad json", "not valid JSON"),
    ("[1, 2]", 'a tool call is a JSON object {"name": <tool>, "arguments"'),
    ('{"name": "view", "path": "a.py"}', "unexpected keys ['path']"),
    ('{"name": "view", "arguments": {"path": "a.py"}, "args": {}}', "unexpected keys ['args']"),
    ('{"name": "rm", "arguments": {}}', "unknown tool 'rm'; the tools are 'list', 'view',"),
    ('{"name": "view", "arguments": []}', '"arguments" of a tool call must be a JSON object'),
    ('{"name": "view", "arguments": {}}', "view needs the argument 'path'"),
    ('{"name": "view", "arguments": {"path": "a", "line": 3}}', "view has no argument 'line'"),
    ('{"name": "view", "arguments": {"path": "a", "start": "3"}}',
     "argument 'start' of view must be a JSON integer, got str"),
    ('{"name": "view", "arguments": {"path": "a", "start": true}}',
     "argument 'start' of view must be a JSON integer, got bool"),
    ('{"name": "edit", "arguments": {"path": 1, "old": "a", "new": "b"}}',
     "argument 'path' of edit must be a JSON string, got int"),
    ('{"name": "view", "arguments": {"path": "\\ud800"}}', "an unpaired surrogate"),
])
def test_malformed_calls_are_tool_call_errors(block, message):
  with pytest.raises(ToolCallError, match="^error: .*" + re.escape(message)):
    parse_first(f"```tool\n{block}\n```")


def test_list_view_search(workspace):
  assert workspace.list() == "notes.txt\npkg/\npkg/mod.py"
  assert workspace.list("pkg") == "pkg/mod.py"
  view = workspace.view("pkg/mod.py", start=2, end=99)
  assert view.splitlines() == ["pkg/mod.py (lines 2-6 of 6):", "     2      return x + 1",
                               "     3  ", "     4  ", "     5  def g(x):",
                               "     6      return x + 1"]
  assert workspace.search("x + 1").splitlines() == [
      "notes.txt:2: beta x + 1", "pkg/mod.py:2:     return x + 1", "pkg/mod.py:6:     return x + 1"]
  assert workspace.search("(x", path="pkg") == "pkg/mod.py:1: def f(x):\npkg/mod.py:5: def g(x):"
  assert workspace.search("nowhere") == "no matches for 'nowhere' under '.'."


def test_listing_and_search_are_capped(workspace):
  files = coding_tools.MAX_LIST_ENTRIES + 5
  for i in range(files):
    with open(os.path.join(workspace.root, f"f{i:04d}.txt"), "w") as f:
      f.write("hit\n")
  listing = workspace.list().splitlines()
  assert len(listing) == coding_tools.MAX_LIST_ENTRIES + 1
  assert listing[-1] == "[8 more entries not shown]"  # 505 files + notes.txt, pkg/, pkg/mod.py.
  matches = workspace.search("hit").splitlines()
  assert len(matches) == coding_tools.MAX_MATCHES + 1
  assert matches[-1] == (f"[more matches not shown: only the first {coding_tools.MAX_MATCHES} "
                         "are listed; narrow the search with path or a longer text]")
  assert matches[:2] == ["f0000.txt:1: hit", "f0001.txt:1: hit"]


def test_search_stops_at_the_cap_whatever_the_files_hold(workspace):
  # It kept and formatted every matching line before cutting the list to MAX_MATCHES:
  # 16 MiB of one-letter lines (four files an agent can create) took 56 s and 700 MB
  # of this process, the sampler's. Now the work stops at the cap.
  content = "x\n" + "a\n" * 150_000
  (pathlib.Path(workspace.root) / "big.txt").write_text(content)
  tracemalloc.start()
  try:
    matches = workspace.search("a", path="big.txt").splitlines()
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert matches[:2] == ["big.txt:2: a", "big.txt:3: a"]
  assert len(matches) == coding_tools.MAX_MATCHES + 1
  assert matches[-1].startswith("[more matches not shown")
  assert peak < 4 * len(content), peak  # the file as bytes and as text; ~50 MB before


def test_search_numbers_lines_and_cuts_them_as_before(workspace):
  (pathlib.Path(workspace.root) / "lines.txt").write_text("a\r\nno\n\n" + "b" * 300 + "a\nlast a")
  assert workspace.search("a", path="lines.txt").split("\n") == [
      "lines.txt:1: a\r", "lines.txt:4: " + "b" * 200, "lines.txt:5: last a"]
  assert workspace.search("a\nno", path="lines.txt") == "no matches for 'a\\nno' under 'lines.txt'."


def test_view_and_edit_number_only_the_lines_they_show(workspace):
  # A 4 MiB file of empty lines took 190 MB of this process to view: every line was
  # numbered, then all but the observation's first few thousand characters dropped.
  content = "\n" * 1_000_000
  (pathlib.Path(workspace.root) / "blank.txt").write_text(content)
  tracemalloc.start()
  try:
    view = workspace.view("blank.txt", start=5)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  lines = view.split("\n")
  shown = coding_tools.MAX_SHOWN_LINES
  assert lines[0] == "blank.txt (lines 5-1000000 of 1000000):" and lines[1] == "     5  "
  assert lines[shown] == f"{shown + 4:>6}  " and len(lines) == shown + 2
  assert lines[-1] == (f"[lines {shown + 5}-1000000 not shown: at most {shown} lines at once; "
                       "view them with start and end]")
  assert peak < 4 * len(content), peak  # ~70 MB before
  assert workspace.view("blank.txt", start=999_999).split("\n") == [
      "blank.txt (lines 999999-1000000 of 1000000):", "999999  ", "1000000  "]
  edited = workspace.edit("pkg/mod.py", "def g(x):", "def g(x):" + "\n#" * 5000)
  assert edited.startswith("edited pkg/mod.py; lines 3-5006 now read:\n     3  \n")
  assert edited.endswith(f"[lines {shown + 3}-5006 not shown: at most {shown} lines at once; "
                         "view them with start and end]")


@pytest.mark.parametrize("start, end, message", [
    (0, None, "lines 0-6 are out of range: pkg/mod.py has 6 lines"),
    (7, 9, "lines 7-9 are out of range"),
    (4, 2, "lines 4-2 are out of range"),
])
def test_view_out_of_range(workspace, start, end, message):
  with pytest.raises(ToolError, match=message):
    workspace.view("pkg/mod.py", start=start, end=end)


def test_unclosed_tool_blocks_are_parsed_in_linear_time():
  # One lazy pattern rescanned the rest of the turn from each unclosed opening:
  # 40 000 characters took 2 s of the sampler's process, 100 000 about 12 s.
  start = time.monotonic()
  assert parse_first("x```tool\n" * 11_000) is None
  assert time.monotonic() - start < 1.0
  assert parse_first('Done.\n```tool\n{"name": "submit"}\n  ```') == ToolCall("submit", {})


def test_an_edit_matching_everywhere_answers_at_once(workspace):
  # Each of 200 000 occurrences counted its line from the top: ~30 s of this process
  # (the sampler's) per call, quadratic in the file a policy grows over a few turns.
  workspace.create("big.py", "a\n" * 200_000)
  start = time.monotonic()
  with pytest.raises(ToolError, match=r"occurs 200000 times in big.py \(starting on lines "
                                      r"1, 2, 3, [0-9, ]*19, 20, \.\.\.\)"):
    workspace.edit("big.py", "a", "b")
  assert time.monotonic() - start < 1.0


def test_edit_needs_exactly_one_occurrence(workspace):
  with pytest.raises(ToolError, match=r"occurs 2 times in pkg/mod.py \(starting on lines 2, 6\)"):
    workspace.edit("pkg/mod.py", "return x + 1", "return x")
  with pytest.raises(ToolError, match="not found in pkg/mod.py"):
    workspace.edit("pkg/mod.py", "return x + 2", "return x")
  with pytest.raises(ToolError, match="old must not be empty"):
    workspace.edit("pkg/mod.py", "", "x")
  result = workspace.edit("pkg/mod.py", "def g(x):\n    return x + 1", "def g(x):\n    return x")
  assert result.startswith("edited pkg/mod.py; lines 3-6 now read:")
  assert workspace.read_text("pkg/mod.py") == SOURCE[:-6] + "x\n"


def test_edit_keeps_crlf_line_endings(workspace):
  path = os.path.join(workspace.root, "win.txt")
  with open(path, "wb") as f:
    f.write(b"a\r\nb\r\n")
  workspace.edit("win.txt", "b", "c")
  with open(path, "rb") as f:
    assert f.read() == b"a\r\nc\r\n"


def test_create(workspace):
  assert workspace.create("new/deep/file.py", "x = 1\n") == "created new/deep/file.py (1 lines)."
  assert workspace.read_text("new/deep/file.py") == "x = 1\n"
  with pytest.raises(ToolError, match="already exists; use edit"):
    workspace.create("notes.txt", "")


@pytest.mark.parametrize("path, message", [
    ("/etc/passwd", "is an absolute path"),
    ("../outside.txt", "is outside the repository"),
    ("pkg/../../outside.txt", "is outside the repository"),
    ("", "invalid path"),
    ("a\x00b", "invalid path"),
])
def test_paths_cannot_leave_the_workspace(workspace, path, message):
  for tool in (lambda: workspace.view(path), lambda: workspace.create(path, "x"),
               lambda: workspace.edit(path, "a", "b"), lambda: workspace.list(path),
               lambda: workspace.search("a", path)):
    with pytest.raises(ToolError, match=message):
      tool()
  assert not os.path.exists(os.path.join(os.path.dirname(workspace.root), "outside.txt"))


def test_symlinks_out_of_the_workspace_are_refused(workspace, tmp_path):
  secret = tmp_path / "secret.txt"
  secret.write_text("secret\n")
  os.symlink(secret, os.path.join(workspace.root, "link.txt"))
  os.symlink(tmp_path, os.path.join(workspace.root, "linkdir"))
  for tool in (lambda: workspace.view("link.txt"), lambda: workspace.edit("link.txt", "s", "x"),
               lambda: workspace.create("linkdir/new.txt", "x"), lambda: workspace.list("linkdir")):
    with pytest.raises(ToolError, match="outside the repository"):
      tool()
  assert workspace.search("secret") == "no matches for 'secret' under '.'."
  assert secret.read_text() == "secret\n" and not (tmp_path / "new.txt").exists()


def test_special_and_binary_files(workspace):
  os.mkfifo(os.path.join(workspace.root, "pipe"))
  with pytest.raises(ToolError, match="not a regular file"):
    workspace.view("pipe")  # Would block forever if opened.
  assert workspace.search("alpha") == "notes.txt:1: alpha"  # Skips the FIFO.
  with open(os.path.join(workspace.root, "blob.bin"), "wb") as f:
    f.write(b"\xff\xfe\x00alpha")
  with pytest.raises(ToolError, match="not UTF-8 text"):
    workspace.view("blob.bin")
  with pytest.raises(ToolError, match="is a directory"):
    workspace.view("pkg")
  with pytest.raises(ToolError, match="does not exist"):
    workspace.view("missing.py")


def test_a_path_longer_than_any_in_the_repository_is_refused_before_it_is_resolved(
    workspace, monkeypatch):
  # realpath lstat-ed every prefix of the path, each longer than the last: quadratic in
  # the policy's text (100 000 components took 2 s of this process).
  calls = []
  real_lstat = os.lstat
  monkeypatch.setattr(os, "lstat", lambda *args, **kwargs: calls.append(args) or real_lstat(
      *args, **kwargs))
  with pytest.raises(ToolError, match="has 100000 characters; no path in the repository is "
                                      "longer than 1024 bytes"):
    workspace.resolve("a/" * 50_000)
  assert not calls
  longest = "pkg/" + "./" * 507 + "mod.py"
  assert len(longest) == 1024 and workspace.resolve(longest) == os.path.join(workspace.root,
                                                                             "pkg", "mod.py")
