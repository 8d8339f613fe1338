"""JSON from untrusted bytes (peers, shared directories) with a size and depth cap.

`json.loads` recurses once per nesting level, so `[[[[...]]]]` a few thousand
deep raises RecursionError, and it parses whatever size it is handed. `loads`
checks both caps first, without recursion and in linear time: it blanks every string literal and
takes the running maximum of (opening - closing brackets) over what is left,
then parses. Every failure is a `ValueError` naming `what`.

The bytes are decoded as UTF-8 (else `ValueError`) and that text is parsed:
`json.loads(bytes)` would also detect UTF-16 and UTF-32, where a quote byte can
be half of another character (U+2200 is `00 22` in UTF-16-LE), so the
byte-level string blanking would hide real brackets and a 100 000-deep array
would reach the parser. In UTF-8 no byte of a multi-byte character is ASCII, so
the depth counted on the bytes is the depth of the text parsed.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

# A JSON string literal: quotes around non-quote, non-backslash bytes or escapes. An
# unterminated one runs to the end (JSON reads it so too, and rejects it): requiring the
# closing quote made every later quote a new start scanned to the end, quadratic time
# (1 MB of '\\"' took hours).
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)
_OPEN = np.frombuffer(b"[{", np.uint8)
_CLOSE = np.frombuffer(b"]}", np.uint8)


def _nesting(data: bytes) -> tuple[np.ndarray, np.ndarray]:
  """`data` with its string literals blanked, and the bracket depth after each byte."""
  code = np.frombuffer(_STRING.sub(b'""', data), np.uint8)
  steps = np.isin(code, _OPEN).astype(np.int64) - np.isin(code, _CLOSE)
  return code, np.cumsum(steps)


def depth(data: bytes) -> int:
  """Deepest bracket nesting of the JSON text `data` (0 for a scalar)."""
  return int(_nesting(data)[1].max(initial=0))


def line_past(data: bytes, max_depth: int) -> int | None:
  """The line (from 1) where the JSON text `data` first nests deeper than `max_depth`,
  or None if it never does. A JSON string holds no raw line break, so blanking the
  strings keeps every line break of the text."""
  code, levels = _nesting(data)
  deeper = np.flatnonzero(levels > max_depth)
  if deeper.size == 0:
    return None
  return int(np.count_nonzero(code[:deeper[0]] == ord("\n"))) + 1


def loads(data: bytes, *, max_bytes: int, max_depth: int, what: str) -> Any:
  """`json.loads(data)` once `data` is at most `max_bytes` long and `max_depth` deep."""
  if len(data) > max_bytes:
    raise ValueError(f"{what}: {len(data)} bytes of JSON, more than the {max_bytes} allowed")
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as error:
    raise ValueError(f"{what}: not JSON (not UTF-8: {error})") from None
  nesting = depth(data)
  if nesting > max_depth:
    raise ValueError(f"{what}: JSON nested {nesting} deep, more than the {max_depth} allowed "
                     f"(from line {line_past(data, max_depth)})")
  try:
    return json.loads(text)
  except ValueError as error:  # JSONDecodeError
    raise ValueError(f"{what}: not JSON ({error})") from None
