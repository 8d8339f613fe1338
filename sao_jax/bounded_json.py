"""JSON from untrusted bytes (peers, shared directories) with a size and depth cap.

`json.loads` recurses once per nesting level, so `[[[[...]]]]` a few thousand
deep raises RecursionError, and it parses whatever size it is handed. `loads`
checks both caps first, without recursion: it blanks every string literal and
takes the running maximum of (opening - closing brackets) over what is left,
then parses. Every failure is a `ValueError` naming `what`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

# A JSON string literal: quotes around non-quote, non-backslash bytes or escapes.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.frombuffer(b"[{", np.uint8)
_CLOSE = np.frombuffer(b"]}", np.uint8)


def depth(data: bytes) -> int:
  """Deepest bracket nesting of the JSON text `data` (0 for a scalar)."""
  code = np.frombuffer(_STRING.sub(b'""', data), np.uint8)
  steps = np.isin(code, _OPEN).astype(np.int64) - np.isin(code, _CLOSE)
  return int(np.cumsum(steps).max(initial=0))


def loads(data: bytes, *, max_bytes: int, max_depth: int, what: str) -> Any:
  """`json.loads(data)` once `data` is at most `max_bytes` long and `max_depth` deep."""
  if len(data) > max_bytes:
    raise ValueError(f"{what}: {len(data)} bytes of JSON, more than the {max_bytes} allowed")
  nesting = depth(data)
  if nesting > max_depth:
    raise ValueError(f"{what}: JSON nested {nesting} deep, more than the {max_depth} allowed")
  try:
    return json.loads(data)
  except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
    raise ValueError(f"{what}: not JSON ({error})") from None
