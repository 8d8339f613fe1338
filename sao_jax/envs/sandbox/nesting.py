"""How deeply Python source nests, found before it is parsed.

CPython's parser and compiler recurse once per level of the syntax tree: source
nested past ~1000 levels (`x = ` and 5000 `-` or `+` signs, `a.a.a...`,
`f()()()...`, `lambda: lambda: ...`) raises RecursionError or MemoryError from
`ast.parse` and `compile`, errors that name neither the file nor the line.
`deepest(source, limit)` walks the tokens instead (no recursion, linear time)
and returns the first line where an upper bound on the tree's depth passes
`limit`, so the caller can refuse the file with a ValueError naming that line.

The bound, per logical line: the indentation level, plus, for every open
bracket and the line's top level, the depth-making tokens (operators, `.`,
an opening bracket, `not`, `lambda`, `if`, `await`, ...) seen there since its
last `,` or `;`. Commas separate siblings, so a long flat list `[1+2, 3+4, ...]`
stays shallow however long. An f-string is one token to the tokenizer of 3.11;
its replacement fields count by their braces, brackets and operator characters.

`deepest`, `check` and `too_deep` use only the standard library and `MAX_DEPTH`,
so the sandbox pastes their source into the code it runs (`pasteable`).
"""

from __future__ import annotations

# Far past what real code nests, far below where CPython's parser gives up (~1000).
MAX_DEPTH = 400


def deepest(source: str, limit: int) -> tuple[int, int] | None:
  """(depth bound, line) where the nesting bound of `source` first passes `limit`
  (module docstring), or None if it never does or the tokenizer stops first (the
  parser then reports that syntax error itself)."""
  import io
  import tokenize
  closing, separators = frozenset(")]}"), frozenset((",", ";"))
  flat = frozenset(("=", ":", "->"))  # assignment, annotations and slices add no depth here
  deep_names = frozenset(("not", "lambda", "if", "else", "await", "and", "or", "in", "is",
                          "yield", "for"))
  marks = frozenset("([{.+-~*/@&|^<>!=%")
  pending = [0]  # per open bracket (and the line's top level): depth-making tokens so far
  indent = 0
  try:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
      kind, text = token.type, token.string
      extra = 0
      if kind == tokenize.INDENT:
        indent += 1
      elif kind == tokenize.DEDENT:
        indent -= 1
      elif kind == tokenize.NEWLINE:
        pending = [0]
      elif kind == tokenize.OP:
        if text in closing:
          if len(pending) > 1:
            pending.pop()
        elif text in separators:
          pending[-1] = 0
        elif text not in flat:
          pending[-1] += 1
          if text in "([{":
            pending.append(0)
      elif kind == tokenize.NAME and text in deep_names:
        pending[-1] += 1
      elif kind == tokenize.STRING and "f" in text[:text.find(text[-1])].lower():
        field, at = 0, 0  # brace level of replacement fields; only they hold code
        while at < len(text):
          char = text[at]
          if field == 0 and text.startswith(("{{", "}}"), at):
            at += 1
          elif char == "{":
            field += 1
            extra += 1
          elif char == "}":
            field = max(field - 1, 0)
          elif field and char in marks:
            extra += 1
          at += 1
      bound = indent + len(pending) - 1 + sum(pending) + extra
      if bound > limit:
        return bound, token.start[0]
  except (tokenize.TokenError, SyntaxError, ValueError):
    return None
  return None


def check(source: str, what: str, limit: int) -> None:
  """ValueError naming `what` and the line if `source` nests past `limit` (`deepest`)."""
  found = deepest(source, limit)
  if found is not None:
    raise ValueError(f"{what}, line {found[1]}: Python nested too deeply for the parser (a "
                     f"bound of {found[0]} levels, more than the {limit} allowed); flatten it, "
                     "e.g. split the expression into named parts")


def too_deep(source: str, what: str, error: BaseException, limit: int = MAX_DEPTH) -> ValueError:
  """The ValueError for `source`, whose parse or compile raised `error` (RecursionError or
  MemoryError: nested past the parser), naming `what` and, where `deepest` finds it,
  the line. For callers that parse first and look for the line only on failure
  (tokenizing costs tens of ms per file, too much for every tool run)."""
  try:
    check(source, what, limit)
  except ValueError as found:
    return found
  return ValueError(f"{what}: Python nested too deeply for the parser "
                    f"({type(error).__name__}: {error}); flatten it")


def pasteable() -> str:
  """The source of `MAX_DEPTH`, `deepest`, `check` and `too_deep`, for code the sandbox runs."""
  import inspect
  return "\n".join([f"MAX_DEPTH = {MAX_DEPTH}\n"] + [inspect.getsource(f)
                                                     for f in (deepest, check, too_deep)])
