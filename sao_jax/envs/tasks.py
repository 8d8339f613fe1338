"""Task files: JSONL loading and endless shuffled iteration.

`load_jsonl(path)` reads one JSON object per line with a non-empty string
`"prompt"`, an `"answer"` (string, or an integer/float written as text) and
optionally `"id"` (string, unique across the file) and `"program"` (Python that
prints the answer, used by `envs.math.tasks.demonstration`); any other keys go into
`Task.metadata`. Rows in the verl shape load too: `"prompt"` a list of chat
messages (`Task.messages`; the prompt text is its last user message), the answer
in `"reward_model": {"ground_truth": ...}` when there is no `"answer"`, and
`"data_source"` kept as `metadata["source"]` (the per-source metrics' key). Any bad line, blank lines included, raises ValueError naming
the file, the line number and the problem: nothing is skipped silently. Bad
lines include invalid UTF-8, NaN / Infinity / overflowing numbers (`1e999`)
anywhere in a row, and values nested deeper than `MAX_NESTING` levels.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import types
from typing import Iterator

from sao_jax import bounded_json
from sao_jax.envs.base import Task

MAX_NESTING = 64  # levels of arrays/objects in one JSONL row; task rows need a handful


def load_jsonl(path: str | os.PathLike) -> list[Task]:
  """Tasks from a JSONL file (format in the module docstring)."""
  tasks, seen = [], {}
  for line_no, where, line in jsonl_lines(path):
    task = _parse_row(line, where, default_id=f"{os.path.basename(path)}:{line_no}")
    claim_id(task, seen, where, line_no)
    tasks.append(task)
  if not tasks:
    raise ValueError(f"{os.fspath(path)}: no tasks; expected one JSON object per line.")
  return tasks


def jsonl_lines(path: str | os.PathLike) -> Iterator[tuple[int, str, str]]:
  """(line number, "path:line", text) of each line of `path`; ValueError naming the
  line when it is not valid UTF-8 (text-mode reading would fail without a line)."""
  with open(path, "rb") as f:
    for line_no, raw in enumerate(f, start=1):
      where = f"{os.fspath(path)}:{line_no}"
      try:
        yield line_no, where, raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not valid UTF-8 (byte {e.start + 1} of the line is "
                         f"{raw[e.start:e.start + 1]!r}); save the file as UTF-8.") from None


def claim_id(task: Task, seen: dict[str, int], where: str, line_no: int) -> None:
  """Records `task.id` as used on `line_no`; ValueError if an earlier line used it."""
  if task.id in seen:
    raise ValueError(f"{where}: id {task.id!r} already used on line {seen[task.id]}; "
                     "ids must be unique.")
  seen[task.id] = line_no


def parse_json_line(line: str, where: str):
  """One JSONL line's value; ValueError naming `where` for blank or invalid lines,
  non-finite numbers and nesting deeper than `MAX_NESTING`."""
  if not line.strip():
    raise ValueError(f"{where}: blank line; remove it (every line must be a JSON object).")
  # Checked before parsing, without recursion: the parser recurses once per level.
  if bounded_json.depth(line.encode("utf-8", "surrogatepass")) > MAX_NESTING:
    raise ValueError(f"{where}: values nested more than {MAX_NESTING} levels deep; "
                     "flatten the row.")
  try:
    return json.loads(line, parse_constant=_non_finite(where), parse_float=_finite_float(where))
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno}).") from None


def _non_finite(where: str):
  def reject(token: str):
    raise ValueError(f"{where}: {token} is not a number JSON allows; write a finite number "
                     "(or a string).")
  return reject


def _finite_float(where: str):
  def parse(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
      raise ValueError(f"{where}: {token} overflows to infinity; write a finite number "
                       "(or a string).")
    return value
  return parse


def _parse_row(line: str, where: str, default_id: str) -> Task:
  row = parse_json_line(line, where)
  if not isinstance(row, dict):
    raise ValueError(f"{where}: expected a JSON object with 'prompt' and 'answer', "
                     f"got {type(row).__name__}.")
  prompt, answer = row.pop("prompt", None), row.pop("answer", None)
  messages = ()
  if isinstance(prompt, list):
    prompt, messages = _chat_prompt(prompt, where)
  if answer is None and isinstance(row.get("reward_model"), dict):
    answer = row["reward_model"].get("ground_truth")
  if isinstance(row.get("data_source"), str) and "source" not in row:
    row["source"] = row["data_source"]
  if not isinstance(prompt, str) or not prompt.strip():
    raise ValueError(f"{where}: 'prompt' must be a non-empty string or a list of chat "
                     f"messages, got {prompt!r}.")
  if isinstance(answer, (int, float)) and not isinstance(answer, bool):
    answer = str(answer)
  if not isinstance(answer, str) or not answer.strip():
    raise ValueError(f"{where}: 'answer' must be a non-empty string or a number, got {answer!r}.")
  task_id = row.pop("id", default_id)
  if not isinstance(task_id, str) or not task_id:
    raise ValueError(f"{where}: 'id' must be a non-empty string, got {task_id!r}.")
  if not isinstance(row.get("program", ""), str):
    raise ValueError(f"{where}: 'program' must be a string of Python code, "
                     f"got {row['program']!r}.")
  return Task(id=task_id, prompt=prompt, answer=answer.strip(), messages=messages,
              metadata=types.MappingProxyType(row))


CHAT_ROLES = ("system", "user", "assistant")  # of a chat-message prompt's messages


def _chat_prompt(messages: list, where: str) -> tuple[str, tuple]:
  """(the last user message's text, the messages) of a chat-message prompt."""
  out = []
  for i, message in enumerate(messages):
    if (not isinstance(message, dict) or message.get("role") not in CHAT_ROLES
        or not isinstance(message.get("content"), str)):
      raise ValueError(f"{where}: 'prompt' message {i} is not {{'role': one of {CHAT_ROLES}, "
                       f"'content': text}}, got {message!r:.200}.")
    out.append(types.MappingProxyType({"role": message["role"], "content": message["content"]}))
  users = [m["content"] for m in out if m["role"] == "user"]
  if not users or out[-1]["role"] == "assistant":
    raise ValueError(f"{where}: a chat 'prompt' needs a user message and must not end with an "
                     "assistant message (the policy writes that one).")
  return users[-1], tuple(out)


def iterate_shuffled(tasks: list[Task], *, seed: int = 0, start: int = 0) -> Iterator[Task]:
  """`tasks` in a fresh seeded order each epoch, without end, from stream position
  `start` (epoch `start // len(tasks)`; no earlier epoch is shuffled)."""
  if not tasks:  # else an endless loop over nothing
    raise ValueError("no tasks to iterate")
  first_epoch, offset = divmod(start, len(tasks))
  for epoch in itertools.count(first_epoch):
    order = list(tasks)
    random.Random(f"sao-epoch/{seed}/{epoch}").shuffle(order)
    yield from order[offset:]
    offset = 0


def check_generator_args(difficulty: int, kind: str, *, max_difficulty: int,
                         kinds: tuple[str, ...]) -> None:
  """ValueError naming a task generator's bad `difficulty` or `kind`."""
  if isinstance(difficulty, bool) or difficulty not in range(1, max_difficulty + 1):
    raise ValueError(f"difficulty={difficulty!r} is invalid: expected an integer in "
                     f"1..{max_difficulty}.")
  if kind not in kinds:
    raise ValueError(f"kind={kind!r} is invalid: allowed values are {', '.join(map(repr, kinds))}.")
