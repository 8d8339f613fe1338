"""Untrusted text on its way to a log line or a terminal: one line, no control characters.

    log(f"dropping trajectories: {reason} (e.g. {untrusted(example, 300)})")
    log(traceback_text(error))   # a traceback whose exception messages are escaped

Text that a policy, a tool, a peer, a dataset file or an HTTP reply chose can
hold terminal escape sequences (`\\x1b]52;` writes the operator's clipboard,
`\\x1b[2K\\r` erases the line it is printed on, `\\x1b]8;` hides a link) and line
breaks that forge whole log lines (a fake `step 1000/1000 | reward 1.000`).
`untrusted` writes every character that is not printable (`str.isprintable`:
C0 and C1 controls, line and paragraph separators, format characters such as
bidi overrides, unpaired surrogates) as its Python escape (`\\x1b`, `\\n`,
`\\u202e`), so the text stays on its line and still shows what it held;
`limit` cuts it, saying how long it was. Printable text passes unchanged.

`traceback_text` is `traceback.format_exception` for such failures: the stack
lines are the program's own source, but an exception's message carries
whatever text failed (a judge's reply, a record's metadata, a file name), so
each message in the chain goes through `untrusted` (cut at `MESSAGE_CHARS`).
"""

from __future__ import annotations

import traceback

MESSAGE_CHARS = 1000  # of one exception's message in a traceback


def logged_at(count: int) -> bool:
  """Whether the `count`-th occurrence of something an adversary can repeat at will
  (a peer's bad message, a planted version) is logged: the 1st, 2nd, 4th, 8th, ..., so
  its log lines grow with the log of the count, not with the count."""
  return count > 0 and count & (count - 1) == 0


def untrusted(text: object, limit: int | None = None) -> str:
  """`str(text)` as one printable line: non-printable characters escaped (module
  docstring); with `limit`, only the first `limit` characters of it, then how many
  there were. The result is at most about 10 * limit characters long."""
  text = str(text)
  cut = limit is not None and len(text) > limit
  shown = text[:limit] if cut else text
  if not shown.isprintable():
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)
  return f"{shown}... ({len(text)} characters)" if cut else shown


def traceback_text(error: BaseException, limit: int | None = None) -> str:
  """`traceback.format_exception(error, limit=limit)` joined, with every exception
  message of the chain (causes and contexts) escaped by `untrusted`."""
  chain, seen = [], set()
  current, connector = error, ""
  while current is not None and id(current) not in seen:
    seen.add(id(current))
    chain.append((current, connector))
    if current.__cause__ is not None:
      current, connector = current.__cause__, (
          "\nThe above exception was the direct cause of the following exception:\n\n")
    elif current.__context__ is not None and not current.__suppress_context__:
      current, connector = current.__context__, (
          "\nDuring handling of the above exception, another exception occurred:\n\n")
    else:
      current = None
  parts = []
  for exc, connector in reversed(chain):  # the oldest first, as Python prints them
    if exc.__traceback__ is not None:
      parts.append("Traceback (most recent call last):\n")
      parts.extend(traceback.format_tb(exc.__traceback__, limit))
    parts.append(_headline(exc) + "\n" + connector)
  return "".join(parts)


def _headline(exc: BaseException) -> str:
  """`module.Type: message`, as Python's last traceback line, the message escaped."""
  kind = type(exc)
  name = kind.__qualname__
  if kind.__module__ not in ("builtins", "__main__"):
    name = f"{kind.__module__}.{name}"
  try:
    message = str(exc)
  except Exception:  # a hostile __str__ must not take the log call down with it
    message = "<exception str() failed>"
  return f"{name}: {untrusted(message, MESSAGE_CHARS)}" if message else name
