"""Every `sao-*` command the docs show works as shown (issue #37): the pages under
docs/, the README, CONTRIBUTING.md and the "exact command" of every configs/ file's
docstring.

- A command in a code block is parsed by the command's own parser, and when it
  names a config (`--config configs/...py`) the config and its `--set`s are
  loaded and validated, which is `sao-train --check`, with the directories of a
  `PYTHONPATH=...` prefix importable (a reward function's module). Shell variables the docs
  define (`export REMOTE="..."`, `LORA="..."`) are expanded; `<placeholders>`
  become `1`; optional groups of a usage line (`[--resume]`) are checked flag by
  flag and then dropped.
- A command quoted inline in prose (`sao-plan --topology v5p:2x2x1`) is often
  partial, so only its flags are checked: each must be one the command has.
"""

import argparse
import ast
import pathlib
import re
import shlex
import sys

import pytest

from sao_jax.cli import convert, flags
from sao_jax.cli import docsgen
from sao_jax.jobs import startup

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "envs" / "datasets"))
from dataset_fixtures import write_parquet, write_saved_dataset  # noqa: E402

PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"])
PAGES = [p for p in PAGES if "research/results/" not in p.relative_to(ROOT).as_posix()]
TOOLS = r"(sao-(?:train|eval|sampler|convert|plan))(?=\s|$)(.*)"
# In prose, the tool's name anywhere in a code span.
COMMAND = re.compile(r"(?:^|[\s/])" + TOOLS)
# In a code block, a command line: the tool first (after VAR=value assignments and a
# path such as .venv/bin/), or after a launcher's `--` (tpu_scripts/run.sh ... -- sao-train).
COMMAND_LINE = re.compile(r"(?:^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:[\w.~/-]*/)?|\s--\s+)" + TOOLS)
FENCE = re.compile(r"^\s*```")
DEFINITION = re.compile(r"^[ \t]*(?:export[ \t]+)?([A-Z][A-Z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S+)",
                        re.M)


def _logical_lines(block: list[str]) -> list[str]:
  """Lines of a code block with backslash continuations joined."""
  out, current = [], ""
  for line in block:
    if line.rstrip().endswith("\\"):
      current += line.rstrip()[:-1] + " "
    else:
      out.append(current + line)
      current = ""
  if current:
    out.append(current)
  return out


def _code_blocks(text: str) -> list[list[str]]:
  blocks, current = [], None
  for line in text.splitlines():
    if FENCE.match(line):
      if current is None:
        current = []
      else:
        blocks.append(_logical_lines(current))
        current = None
    elif current is not None:
      current.append(line)
  return blocks


def _definitions() -> dict[str, str]:
  """Shell variables the docs define in their code blocks (NAME=value, export NAME="..."),
  a quoted value possibly spanning lines."""
  out = {}
  for page in PAGES:
    for block in re.findall(r"^\s*```[^\n]*\n(.*?)^\s*```", page.read_text(), re.S | re.M):
      for match in DEFINITION.finditer(block):
        value = match.group(2)
        if value[:1] in "\"'":
          value = value[1:-1]
        out.setdefault(match.group(1), " ".join(value.replace("\\\n", " ").split()))
  return out


def _strip_comment(command: str) -> str:
  """The command without a trailing `# comment` (outside quotes) or a following pipe/chain."""
  quote = None
  for index, char in enumerate(command):
    if char in "\"'" and quote in (None, char):
      quote = None if quote else char
    elif quote is None and (char == "#" and (index == 0 or command[index - 1] == " ")
                            or char in "|;" or command[index:index + 2] == "&&"):
      return command[:index]
  return command


def _config_docstring_blocks(path: pathlib.Path) -> list[list[str]]:
  """The indented command lines of a config file's docstring (its "exact command")."""
  doc = ast.get_docstring(ast.parse(path.read_text())) or ""
  return [_logical_lines([line for line in doc.splitlines() if line.startswith("    ")])]


def _block_commands() -> list[tuple[str, str, str]]:
  """(where, command, the PYTHONPATH its line sets or "") of every command line."""
  out = []
  sources = [(page, _code_blocks(page.read_text())) for page in PAGES]
  sources += [(path, _config_docstring_blocks(path))
              for path in sorted((ROOT / "configs").rglob("*.py"))]
  for page, blocks in sources:
    for block in blocks:
      for line in block:
        if line.lstrip().startswith("#"):
          continue
        match = COMMAND_LINE.search(line.strip())
        if match:
          where = f"{page.relative_to(ROOT)}: {line.strip()[:80]}"
          # A comment starting "fails" marks an example of an error the docs show.
          fails = re.search(r"#\s*fails\b", line) is not None
          path = re.match(r"\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*?PYTHONPATH=(\S+)\s", line)
          out.append((where, match.group(1) + _strip_comment(match.group(2)) +
                      (" #fails" if fails else ""), path.group(1) if path else ""))
  return out


def _inline_commands() -> list[tuple[str, str]]:
  out = []
  for page in PAGES:
    text, fenced = [], False
    for line in page.read_text().splitlines():  # prose only: drop fenced blocks
      if FENCE.match(line):
        fenced = not fenced
      elif not fenced:
        text.append(line)
    text = "\n".join(text)
    for span in re.findall(r"`([^`]+)`", text):
      match = COMMAND.search(" " + span.replace("\n", " "))
      if match and match.group(2).strip():
        out.append((f"{page.relative_to(ROOT)}: `{span[:60]}`", match.group(1) + match.group(2)))
  return out


def _parser_for(tokens: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
  """The parser of `tokens[0]` (a subcommand's when the next token names one)."""
  parser = docsgen.cli_parsers()[tokens[0]]()
  rest = tokens[1:]
  subs = docsgen.subcommands(parser)
  if subs and rest and rest[0] in subs:
    return subs[rest[0]], rest[1:]
  return parser, rest


def _options(parser: argparse.ArgumentParser) -> set[str]:
  return {opt for action in parser._actions for opt in action.option_strings}  # pylint: disable=protected-access


def _expand(command: str, definitions: dict[str, str]) -> str:
  for _ in range(3):  # definitions may use each other
    command = re.sub(r"\$\{?([A-Z][A-Z0-9_]*)\}?",
                     lambda m: definitions.get(m.group(1), m.group(0)), command)
  return re.sub(r"<[^<>]*>", "1", command)


BLOCK_COMMANDS = _block_commands()
INLINE_COMMANDS = _inline_commands()


def test_the_docs_show_commands_of_every_tool():
  shown = {command.split()[0] for _, command, _ in BLOCK_COMMANDS}
  assert shown == set(docsgen.cli_parsers()), shown
  assert len(BLOCK_COMMANDS) >= 25 and len(INLINE_COMMANDS) >= 10


def _with_dataset(overrides: list[str], tmp_path: pathlib.Path) -> list[str]:
  """`overrides` with an `env.dataset.path` the docs name (a GSM8K or MATH-500 file the
  reader downloads) replaced by a one-row stand-in with the columns the command maps."""
  values = dict(o.split("=", 1) for o in overrides)
  path = values.get("env.dataset.path")
  if not path or (ROOT / path).exists():
    return overrides
  answer = {"gsm8k": "so #### 2", "boxed": "\\boxed{2}"}.get(
      values.get("env.dataset.answer_format", "plain"), "2")
  columns = {}

  def put(name: str, value) -> None:  # a dotted name is a field of a struct column
    column, _, field = name.partition(".")
    columns[column] = [{field: value} if field else value]

  put(values.get("env.dataset.prompt_column", "problem"), "What is 1 + 1?")
  put(values.get("env.dataset.answer_column", "answer"), answer)
  if values.get("env.dataset.source_column"):
    put(values["env.dataset.source_column"], "algebra")
  metadata = values.get("env.dataset.metadata_columns", "()")
  for name in (ast.literal_eval(metadata) if metadata.startswith("(") else metadata.split(",")):
    put(name, {"index": 0})
  stand_in = tmp_path / pathlib.Path(path).name
  if values.get("env.task_source") == "parquet":
    write_parquet(stand_in, columns)
  else:
    write_saved_dataset(stand_in, columns)
  return [o for o in overrides if not o.startswith("env.dataset.path=")] + [
      f"env.dataset.path={stand_in}"]


@pytest.mark.parametrize("where, command, pythonpath", BLOCK_COMMANDS,
                         ids=[w for w, _, _ in BLOCK_COMMANDS])
def test_a_command_in_a_code_block_parses_and_its_config_checks(where, command, pythonpath,
                                                                tmp_path, monkeypatch):
  for entry in filter(None, pythonpath.split(":")):
    monkeypatch.syspath_prepend(str(ROOT / entry))
  definitions = _definitions()
  fails = command.endswith(" #fails")
  expanded = _expand(command.removesuffix(" #fails"), definitions)
  assert "$" not in expanded, f"{where}: a variable the docs never define: {expanded}"
  tokens = shlex.split(expanded)
  parser, rest = _parser_for(tokens)
  head = tokens[1:len(tokens) - len(rest)]  # the subcommand, if any
  # A usage line's optional groups: each flag in them must exist; then they go.
  joined = " ".join(rest)
  for group in re.findall(r"\[([^\[\]]*)\]", joined):
    for flag in re.findall(r"--[a-z][a-z0-9-]*", group):
      assert flag in _options(parser), f"{where}: {flag} is not a flag of {tokens[0]}"
  usage = "[" in joined  # a usage line: placeholders such as FILE stand for a config
  if usage:
    rest = re.sub(r"\[[^\[\]]*\]", " ", joined).replace("...", " ").split()
  try:
    args = flags.parse(docsgen.cli_parsers()[tokens[0]](), head + rest, convert.ALIASES)
  except SystemExit as error:
    pytest.fail(f"{where}: {tokens[0]} refused {head + rest} (exit {error.code})")
  if not getattr(args, "config", None) or (usage and not (ROOT / args.config).is_file()):
    assert not fails, f"{where}: marked as failing, but there is no config to check"
    return
  if fails:
    with pytest.raises(ValueError):
      startup.load(ROOT / args.config, _with_dataset(args.overrides, tmp_path))
  else:
    startup.load(ROOT / args.config, _with_dataset(args.overrides, tmp_path))


@pytest.mark.parametrize("where, command", INLINE_COMMANDS, ids=[w for w, _ in INLINE_COMMANDS])
def test_the_flags_of_a_command_quoted_in_prose_exist(where, command):
  tokens = shlex.split(_expand(command, _definitions()).replace("[", " ").replace("]", " "))
  parser, rest = _parser_for(tokens)
  for token in rest:
    flag = token.split("=")[0]
    if flag.startswith("--"):
      assert flag in _options(parser) or flag in convert.ALIASES, (
          f"{where}: {flag} is not a flag of {' '.join(tokens[:len(tokens) - len(rest)])}")
