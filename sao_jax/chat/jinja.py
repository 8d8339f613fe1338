"""Chat templates rendered the way transformers renders them.

  compile_template(source)                      -> jinja2.Template
  render(template, messages, *, add_generation_prompt, variables) -> str

A checkpoint's chat template is untrusted Jinja code from a model directory. It
runs in jinja2's `ImmutableSandboxedEnvironment` with the environment
transformers' `apply_chat_template` builds (transformers 5:
`utils/chat_template_utils.py`): `trim_blocks` and `lstrip_blocks`, the
`loopcontrols` extension, a `tojson` filter that is `json.dumps` without HTML
escaping (`ensure_ascii=False`, optional indent/separators/sort_keys),
`raise_exception(message)` raising `TemplateError`, `strftime_now(format)`, a
`dict` constructor and a `namespace` that refuses underscore-prefixed
attributes. A template sees `messages`, `tools` and `documents` (None: no
environment declares tool schemas; tools are called through the text of a
turn), `add_generation_prompt`, the tokenizer's special tokens (`bos_token`,
`eos_token`, ...) and template variables such as `enable_thinking`, exactly
the names `apply_chat_template(messages, **variables)` passes.
The `{% generation %}` tag transformers adds (for `return_assistant_tokens_mask`)
renders its body unchanged here: the action mask comes from rendering turn by
turn (`sao_jax.chat.format`), not from tags a template may lack.

Budget. The sandbox keeps a template away from Python internals but not from
work without bound: two nested `range(100000)` loops, `'a' * 10**10` (which
jinja2 would even fold into a constant while compiling), `9 ** (9 ** 9)` as an
int, `'{:>999999999}'.format(1)`, a string doubled with `~` in a loop. So one
render may take at most MAX_STEPS steps (one per loop iteration, filtered or
recursive ones included, and per filter or test; CALL_STEPS per call, macros
included), no operator, call or filter may build a string, bytes, list or dict
longer than MAX_LENGTH, an int longer than MAX_INT_BITS, or take an int
argument or format width above MAX_LENGTH, and the render writes at most
MAX_LENGTH characters (template text and `{{ }}` pieces, in macros and blocks
too). A step that would build more than MAX_LENGTH from small inputs is refused
before it runs, from a bound computed without building the value: `replace`
(method and filter), `join`, `expandtabs`, `translate`, `encode`, `hex`, the
case maps, `format`/`format_map`/`%`/`|format` (widths, `*` widths, a field
used many times), `strftime_now`, `|indent`, `|wordwrap`, `|urlize`,
`|xmlattr`, `|escape`, `|urlencode`, `|tojson` (indent, separators), `|pprint`,
`|sum` of lists, `~`, and everything that prints a container with str(): a
list holding one string a thousand times prints it a thousand times
(`_Printed`); `|batch` and `|slice` count the lists they make. And all calls,
filters, operators and comparisons of a render read or build at most MAX_WORK
items in all, so a loop can neither keep many distinct values just under
MAX_LENGTH nor scan one a million times (`'x' in s`, hours at a step each).
Real templates (Qwen3, Llama 3, Gemma 3) take a few steps per message and read
or build about ten times their output. `lipsum` (pages of lorem ipsum on
demand) is not offered.

What remains, bounded but not by these caps: sizes are counted in items, not
bytes, so a list of MAX_LENGTH distinct small objects (`|batch(1)`,
`|slice(n)`, `s.split(',')`, `d.items()|list`) takes about 1 GB; a few bounds
refuse early where the value would fit (the case maps and `encode` of a
non-ASCII string over MAX_LENGTH / 3 or / 100 characters, `|urlize` and
`|wordwrap` of texts near MAX_LENGTH / 12 and / 2); and work that is neither
read nor built by a call, filter or operator (`|sort` is n log n, dictionary
lookups) counts as one step.
"""

from __future__ import annotations

import codecs
import contextvars
import datetime
import functools
import inspect
import itertools
import json
import re
import string
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.runtime
import jinja2.sandbox
import jinja2.utils
import jinja2.visitor
import markupsafe

MAX_STEPS = 1_000_000  # loop iterations and calls in one render
CALL_STEPS = 10  # steps a call takes: a jinja2 macro call costs 20-100 loop iterations' time
MAX_LENGTH = 1 << 24  # characters or items of one computed value; ints and widths passed
MAX_INT_BITS = 1 << 16  # bits of an int a template computes
MAX_WORK = 1 << 26  # characters and items read or built by a render's calls, filters, operators

# Per render: [steps, items read or built, characters written].
_STEPS: contextvars.ContextVar[list[int]] = contextvars.ContextVar("chat_template_steps")
_SIZED = (str, bytes, list, tuple, dict)
# A printf conversion: '%-08.3f', '%(name)10s', '%*.*d' (widths from the arguments).
_PERCENT = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.?)", re.DOTALL)
_NUMBER_TEXT = 320  # more than any int or float prints as (%f of 1e308: 309 digits), widths aside
_SHORT_REPR = 256  # more than the repr of any other object a template reaches (macro, loop, range)
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines breaks
_CONTROLS = dict.fromkeys(range(32))  # characters json.dumps escapes as \uXXXX (or \n ...)


def _refuse(what: str) -> jinja2.exceptions.SecurityError:
  return jinja2.exceptions.SecurityError(
      f"the chat template {what}; a chat template may take {MAX_STEPS} steps per render, "
      f"build values of {MAX_LENGTH} items (read or build {MAX_WORK} in all), ints of "
      f"{MAX_INT_BITS} bits (sao_jax.chat.jinja); this one is broken or hostile, use another "
      "checkpoint's template")


def _tick(steps: int = 1) -> None:
  counter = _STEPS.get()
  counter[0] += steps
  if counter[0] > MAX_STEPS:
    raise _refuse(f"took more than {MAX_STEPS} steps (loop iterations and calls) in one render")


def _work(*values: Any) -> None:
  """Counts the items of `values` (read or built by a call, filter or operator) against
  MAX_WORK: a loop can neither keep a thousand distinct strings of MAX_LENGTH in a list nor
  scan one a million times (`'x' in s`: a step each, hours in all)."""
  _charge(sum(len(value) for value in values if isinstance(value, _SIZED)))


def _charge(items: int) -> None:
  counter = _STEPS.get()
  counter[1] += items
  if counter[1] > MAX_WORK:
    raise _refuse(f"read or built more than {MAX_WORK} items in all in one render")


def _sized(value: Any) -> Any:
  """`value`, refused if longer than MAX_LENGTH; counted against MAX_WORK."""
  if isinstance(value, _SIZED) and len(value) > MAX_LENGTH:
    raise _refuse(f"built a {type(value).__name__} of {len(value)} items")
  _work(value)
  return value


def _predict(size: int, how: str) -> None:
  """Refuses, before it is computed, a value whose size (an upper bound) passes MAX_LENGTH."""
  if size > MAX_LENGTH:
    raise _refuse(f"would build a value of up to {size} items with {how}")


def _str_repr_length(text: str, ascii_only: bool = False) -> int:
  """At least len(repr(text)) (len(ascii(text)) if `ascii_only`), without building it."""
  if text.isprintable() and (text.isascii() or not ascii_only):
    return len(text) + 2 + text.count("\\") + text.count("'")
  return len(text) * (4 if text.isascii() else 10) + 2  # '\x00', '\U0010ffff'


def _json_str_length(text: str, ensure_ascii: bool) -> int:
  """At least len(json.dumps(text, ensure_ascii=...)), without building it."""
  if ensure_ascii and not text.isascii():
    return len(text) * 12 + 2  # a surrogate pair, '\ud83d\ude00'
  controls = 0 if text.isprintable() else len(text) - len(text.translate(_CONTROLS))
  return len(text) + 2 + text.count('"') + text.count("\\") + 5 * controls


class _Printed:
  """Upper bounds of the text `str`, `repr`, `ascii`, `json.dumps` or `pprint.pformat` make
  of a value, without making it; counting stops once past MAX_LENGTH. len() does not see
  this size: a list holding one string a thousand times prints it a thousand times.

  `mode` is "str", "repr", "ascii", "json" (with `indent`, `separators`, `ensure_ascii`
  as json.dumps takes them) or "pprint" (pformat's layout: one item a line, indented by
  its column, strings split into one chunk a word)."""

  def __init__(self, mode: str = "str", *, indent: Any = None, separators: Any = None,
               ensure_ascii: bool = False):
    self.mode, self.ensure_ascii, self.memo, self.open = mode, ensure_ascii, {}, set()
    self.indent = " " * indent if isinstance(indent, int) else indent
    default = (",", ": ") if indent is not None else (", ", ": ")
    self.item_sep, self.key_sep = (separators if isinstance(separators, (list, tuple))
                                   and len(separators) == 2 else default)

  def length(self, value: Any) -> int:
    if isinstance(value, str) and self.mode == "str":
      return len(value)  # a str prints as itself; inside a container, as its repr
    if isinstance(value, jinja2.runtime.Undefined):
      return 0 if self.mode == "str" else 9
    return self._length(value, 0)

  def _line(self, column: int) -> int:
    """The characters before an item: a newline and its indentation (json indent, pprint)."""
    if self.mode == "pprint":
      return 1 + column
    if self.mode == "json" and self.indent is not None:
      return 1 + len(str(self.indent)) * column
    return 0

  def _length(self, value: Any, column: int) -> int:
    json_mode = self.mode == "json"
    if isinstance(value, str):
      if json_mode:
        return _json_str_length(value, self.ensure_ascii)
      quoted = _str_repr_length(value, self.mode == "ascii") + (0 if type(value) is str else 8)
      return quoted + (len(value) + 1) * (3 + column) * (self.mode == "pprint")
    if isinstance(value, (bool, type(None))):
      return 5
    if isinstance(value, int):
      return value.bit_length() // 3 + 2
    if isinstance(value, (float, complex)):
      return 64
    if isinstance(value, (bytes, bytearray)):
      return 4 * len(value) + 14 + (len(value) + 1) * (3 + column) * (self.mode == "pprint")
    if isinstance(value, jinja2.utils.Namespace):
      attrs = object.__getattribute__(value, "_Namespace__attrs")
      return 12 + self._length(attrs, column + 12)
    if isinstance(value, (dict, list, tuple, set, frozenset, type({}.items()),
                          type({}.keys()), type({}.values()))):
      return self._container(value, column)
    return 0 if json_mode else _SHORT_REPR  # json.dumps refuses it (TypeError)

  def _container(self, value: Any, column: int) -> int:
    key = (id(value), column, self.mode)
    if key in self.memo:  # the same object again: it prints the same
      return self.memo[key]
    if id(value) in self.open:
      return 5  # a cycle prints as [...] (json.dumps refuses it)
    if len(value) > MAX_LENGTH:  # every item prints as a character at least
      return len(value)
    self.open.add(id(value))
    items = value.items() if isinstance(value, dict) else value
    total = 20 + self._line(column)  # brackets, 'frozenset(', 'dict_items(', closing line
    inner, json_mode = column + 1, self.mode == "json"
    pair = 4 * isinstance(value, type({}.items()))  # a view's items print as tuples
    for item in items:
      if isinstance(value, dict):
        name, item = item
        # json.dumps writes an int, float, bool or None key as a string: quoted.
        name_length = self._length(name, inner) + 2 * (json_mode and not isinstance(name, str))
        total += name_length + len(self.key_sep)
        if self.mode == "pprint":
          total += self._length(item, inner + name_length + 2)
        else:
          total += self._length(item, inner)
      else:
        total += self._length(item, inner) + pair
      total += len(self.item_sep) + self._line(inner)
      if total > MAX_LENGTH:
        break
    self.open.discard(id(value))
    self.memo[key] = total
    return total


def _printed(value: Any, mode: str = "str", how: str = "") -> int:
  """The bound of _Printed, refused if above MAX_LENGTH."""
  length = _Printed(mode).length(value)
  if length > MAX_LENGTH:
    raise _refuse(f"would print a {type(value).__name__} as up to {length} characters"
                  f"{' with ' + how if how else ''}")
  return length


def _materialized(iterable: Any) -> Any:
  """`iterable` as a list (a generator is consumed once: the caller passes this list on)."""
  if isinstance(iterable, (str, bytes, list, tuple)):
    return iterable
  items = list(itertools.islice(iterable, MAX_LENGTH + 1))
  if len(items) > MAX_LENGTH:
    raise _refuse(f"passed an iterable of more than {MAX_LENGTH} items")
  return items


def _check_printf(fmt: Any, args: Any, escape: int = 1) -> None:
  """Refuses `fmt % args` above MAX_LENGTH: widths (also `*` ones taken from the
  arguments), a mapping key used many times, a container printed whole. `escape` is the
  factor of Markup's escaping of the arguments."""
  if isinstance(fmt, bytes):
    fmt = fmt.decode("latin-1")
  if not isinstance(fmt, str):
    return
  positional = list(args) if isinstance(args, tuple) else [args]
  printed, total, index = _Printed(), len(fmt), 0

  def take() -> Any:
    nonlocal index
    index += 1
    return positional[index - 1] if index <= len(positional) else None

  for name, width, precision, conversion in _PERCENT.findall(fmt):
    if conversion == "%" and not (name or width or precision):
      continue
    sizes = []
    for number in (width, precision):
      value = take() if number == "*" else int(number or 0)
      sizes.append(abs(value) if isinstance(value, int) else 0)
      if sizes[-1] > MAX_LENGTH:
        raise _refuse(f"formats with widths {[width, precision]} ({fmt[:80]!r})")
    value = (args.get(name) if isinstance(args, dict) else None) if name else take()
    printed.mode = {"r": "repr", "a": "ascii"}.get(conversion, "str")
    total += max(sizes[0], printed.length(value) * escape + sizes[1] + _NUMBER_TEXT)
    _predict(total, f"the format {fmt[:80]!r}")


def _check_format(fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any],
                  escape: int = 1) -> None:
  """Refuses `fmt.format(*args, **kwargs)` above MAX_LENGTH: widths, a field used many
  times, a container printed whole (fields of an argument, `{0[1]}`, print shorter than it)."""
  printed, total, auto = _Printed(), len(fmt), 0
  ints = [abs(v) for v in [*args, *kwargs.values()] if isinstance(v, int)]
  try:
    fields = [(f, spec, c) for _, f, spec, c in string.Formatter().parse(fmt) if f is not None]
  except ValueError:
    return  # malformed: str.format raises it when called
  for field, spec, conversion in fields:
    base = re.match(r"[^.\[]*", field).group()
    if base.isdigit():
      value = args[int(base)] if int(base) < len(args) else None
    elif base:
      value = kwargs.get(base)
    else:
      value = args[auto] if auto < len(args) else None
      auto += 1 + spec.count("{")
    printed.mode = {"r": "repr", "a": "ascii"}.get(conversion, "str")
    widths = sum(map(int, re.findall(r"\d+", spec))) + spec.count("{") * max(ints, default=0)
    total += printed.length(value) * escape + widths + _NUMBER_TEXT
    _predict(total, f"the format {fmt[:80]!r}")


def _escape_factor(receiver: Any) -> int:
  """How much longer Markup's methods make their arguments ('"' -> '&#34;')."""
  return 5 if isinstance(receiver, markupsafe.Markup) else 1


def _check_method(method: Any, args: tuple, kwargs: dict) -> tuple:
  """Refuses a call of a str or bytes method whose result would pass MAX_LENGTH
  (replace, join, expandtabs, translate, format, encode, ...); returns the arguments,
  a generator passed to join made a list."""
  receiver, name = getattr(method, "__self__", None), getattr(method, "__name__", None)
  if not isinstance(receiver, (str, bytes)) or name not in _METHOD_SIZES:
    return args
  if name == "join" and args:
    args = (_materialized(args[0]), *args[1:])
  try:
    size = _METHOD_SIZES[name](receiver, *args, **kwargs)
  except (TypeError, ValueError, LookupError):
    return args  # the method itself raises it, with Python's message
  _predict(size, f"{type(receiver).__name__}.{name}")
  return args


def _replace_size(text, old, new, count=-1):
  found = text.count(old) if count < 0 else min(text.count(old), count)
  return len(text) + found * max(len(new) * _escape_factor(text) - len(old), 0)


def _join_size(separator, items):
  if isinstance(items, (str, bytes)):
    return len(items) + len(separator) * max(len(items) - 1, 0)
  strings = [len(item) for item in items if isinstance(item, (str, bytes))]
  return len(separator) * max(len(items) - 1, 0) + sum(strings) * _escape_factor(separator)


def _translate_size(text, table):
  if not isinstance(text, str):
    return len(text)  # bytes.translate maps byte to byte
  values = table.values() if isinstance(table, dict) else table
  widest = max((len(v) for v in values if isinstance(v, str)), default=1)
  if widest <= 1 or len(text) * widest <= MAX_LENGTH or not isinstance(table, dict):
    return len(text) * max(widest, 1)
  return len(text) + sum(text.count(chr(k)) * (len(v) - 1) for k, v in table.items()
                         if isinstance(k, int) and 0 <= k < 0x110000 and isinstance(v, str))


def _encode_size(text, encoding="utf-8", errors="strict"):
  codec = codecs.lookup(encoding).name
  if text.isascii() and codec in ("utf-8", "ascii", "iso8859-1", "cp1252"):
    return len(text)
  if errors == "strict" and codec.startswith(("utf-8", "utf-16", "utf-32")):
    return 4 * len(text) + 4
  return 100 * len(text) + 4  # errors='namereplace': '\N{...}', up to 88 characters a character


_METHOD_SIZES = {
    "replace": _replace_size,
    "join": _join_size,
    "expandtabs": lambda text, tabsize=8: len(text) + text.count(
        "\t" if isinstance(text, str) else b"\t") * max(tabsize - 1, 0),
    "translate": lambda text, table, *delete: _translate_size(text, table),
    "format": lambda text, *args, **kwargs: _check_format(
        text, args, kwargs, _escape_factor(text)) or 0,
    "format_map": lambda text, mapping: _check_format(
        text, (), mapping, _escape_factor(text)) or 0,
    "encode": _encode_size,
    "decode": lambda data, *args, **kwargs: 4 * len(data),  # errors='backslashreplace': \xNN
    "hex": lambda data, *args: 3 * len(data),  # two digits and a separator a byte
    # Case maps make at most three characters of one ('ß'.upper() == 'SS', 'ΐ' -> 3).
    **{name: lambda text: len(text) * (1 if text.isascii() else 3)
       for name in ("upper", "lower", "title", "capitalize", "casefold", "swapcase")},
}


def _check_filter(name: str, arguments: dict, passed: Any) -> None:
  """Refuses a filter call whose result would pass MAX_LENGTH; `arguments` are the
  filter's bound arguments (a generator to join or batch is made a list, in place) and
  `passed` what jinja2 passes first (an eval context for join)."""
  first = next((key for key in ("s", "value", "d", "iterable") if key in arguments), None)
  value = arguments.get(first)
  if name in _PRINTING_FILTERS:  # the filter prints its input with str() first
    length = _printed(value, how=f"|{name}")
    if name in ("upper", "lower", "title", "capitalize") and not (
        isinstance(value, str) and value.isascii()):
      _predict(3 * length, f"|{name}")
    if name in ("e", "escape", "forceescape"):
      _predict(5 * length, f"|{name}")  # '"' -> '&#34;'
    if name == "urlencode":
      _predict(12 * length, "|urlencode")  # a 4-byte character -> '%F0%9F%98%80'
  if name in ("batch", "slice"):  # a list per row: items the result's length does not count
    arguments["value"] = items = _materialized(value)
    rows = arguments.get("slices") or len(items) // max(arguments.get("linecount") or 1, 1) + 1
    _charge(rows if isinstance(rows, int) else 0)
  size = _FILTER_SIZES.get(name)
  if size is not None:
    _predict(size(arguments, value, passed), f"|{name}")


def _join_filter_size(arguments, value, eval_ctx):
  arguments["value"] = items = _materialized(value)
  if arguments.get("attribute") is not None:
    items = [jinja2.filters.make_attrgetter(eval_ctx.environment,
                                            arguments["attribute"])(item) for item in items]
  printed, separator = _Printed(), _printed(arguments.get("d", ""))
  if isinstance(items, str):
    return len(items) + separator * max(len(items) - 1, 0)
  total = separator * max(len(items) - 1, 0)
  for item in items:
    total += printed.length(item)
    if total > MAX_LENGTH:
      break
  return total


def _replace_filter_size(arguments, value, passed):
  old, new, count = arguments.get("old"), arguments.get("new"), arguments.get("count")
  if all(isinstance(text, str) for text in (value, old, new)):
    return _replace_size(value, old, new, -1 if count is None else count)
  # Printed first: bound by the new text between every two characters.
  return (_printed(value) + 1) * (_printed(new) + 1)


def _json_filter_size(arguments, value, passed):
  separators = arguments.get("separators")
  if separators is not None and not all(isinstance(s, str) for s in separators):
    return 0  # json.dumps refuses them
  indent = arguments.get("indent")
  if indent is not None and not isinstance(indent, (int, str)):
    return 0
  return _Printed("json", indent=indent, separators=separators,
                  ensure_ascii=bool(arguments.get("ensure_ascii"))).length(value)


def _indent_filter_size(arguments, value, passed):
  text_length = _printed(value, how="|indent")
  width = arguments.get("width", 4)
  indention = width if isinstance(width, str) else " " * max(width, 0)
  lines = (sum(value.count(c) for c in _LINE_BREAKS) if isinstance(value, str)
           else text_length) + 2
  return text_length + lines * (len(indention) + 1)


def _wordwrap_filter_size(arguments, value, passed):
  text_length = _printed(value, how="|wordwrap")
  wrapstring = arguments.get("wrapstring")
  return text_length + (text_length + 1) * len(wrapstring if isinstance(wrapstring, str) else "\n")


def _urlize_filter_size(arguments, value, passed):
  text_length = _printed(value, how="|urlize")
  extra = sum(len(arguments.get(name) or "") for name in ("target", "rel")
              if isinstance(arguments.get(name), (str, type(None))))
  # A link ('a.io') per four characters, each printed twice, escaped, in an <a> tag.
  return 12 * text_length + (text_length // 4 + 1) * (64 + extra)


def _xmlattr_filter_size(arguments, value, passed):
  if not isinstance(value, dict):
    return 0
  printed = _Printed()
  return sum(printed.length(k) + 4 + 5 * printed.length(v) for k, v in value.items())


_PRINTING_FILTERS = frozenset({
    "capitalize", "center", "e", "escape", "forceescape", "lower", "replace", "safe",
    "string", "striptags", "title", "trim", "truncate", "upper", "urlencode", "wordcount",
    "format", "indent", "wordwrap", "urlize"})
_FILTER_SIZES = {
    "replace": _replace_filter_size,
    "join": _join_filter_size,
    "tojson": _json_filter_size,
    "pprint": lambda arguments, value, passed: _Printed("pprint").length(value),
    "indent": _indent_filter_size,
    "wordwrap": _wordwrap_filter_size,
    "urlize": _urlize_filter_size,
    "xmlattr": _xmlattr_filter_size,
    "format": lambda arguments, value, passed: _check_printf(
        value if isinstance(value, str) else "",
        arguments.get("kwargs") or tuple(arguments.get("args", ()))) or 0,
}


def _check_ints(values: Sequence[Any]) -> None:
  for value in values:
    if isinstance(value, int) and abs(value) > MAX_LENGTH:
      raise _refuse(f"passed the int {value} to a call or filter")


def _check_widths(numbers: Sequence[str], fmt: str) -> None:
  if any(number and int(number) > MAX_LENGTH for number in numbers):
    raise _refuse(f"formats with widths {numbers} ({fmt[:80]!r})")


def _check_binop(operator: str, left: Any, right: Any) -> None:
  """Refuses before computing it an operator result above the caps (module docstring)."""
  ints = isinstance(left, int) and isinstance(right, int)
  if operator == "*" and ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
    raise _refuse(f"multiplied ints of {left.bit_length()} and {right.bit_length()} bits")
  if operator == "*" and not ints:
    sequence, count = (left, right) if isinstance(right, int) else (right, left)
    if (isinstance(sequence, _SIZED) and isinstance(count, int)
        and len(sequence) * count > MAX_LENGTH):
      raise _refuse(f"repeated a {type(sequence).__name__} of {len(sequence)} items {count} times")
  if (operator == "**" and ints and right > 0 and abs(left) > 1
      and right * left.bit_length() > MAX_INT_BITS):
    raise _refuse(f"raised an int of {left.bit_length()} bits to the power {right}")
  if (operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED)
      and len(left) + len(right) > MAX_LENGTH):
    raise _refuse(f"joined values of {len(left)} and {len(right)} items with +")
  if operator == "%" and isinstance(left, (str, bytes)):
    _check_printf(left, right, _escape_factor(left))


@jinja2.pass_context
def _counted(context, iterable):
  """The items of a loop's iterable, one step each (wraps every `for` loop's iterable)."""
  for item in iterable:
    _tick()
    yield item


def _text_length(value: Any) -> int:
  return len(value) if isinstance(value, str) else _Printed().length(value)


@jinja2.pass_context
def _joined(context, operands):
  """`a ~ b ~ ...`: the operands' text, refused before it is built if above MAX_LENGTH."""
  _predict(sum(map(_text_length, operands)), "~")
  join = jinja2.runtime.markup_join if context.eval_ctx.autoescape else jinja2.runtime.str_join
  return _sized(join(operands))


@jinja2.pass_context
def _written(context, value):
  """A piece of the render's output (`{{ ... }}` or template text), counted before it is
  printed: a render writes at most MAX_LENGTH characters, macro and block bodies included."""
  counter = _STEPS.get()
  counter[2] += _text_length(value)
  if counter[2] > MAX_LENGTH:
    raise _refuse(f"wrote more than {MAX_LENGTH} characters of output in one render")
  return value


def _read(context, value):
  """`value`, counted against MAX_WORK (an operand of a comparison)."""
  _work(value)
  return value


class _Budgeted(jinja2.visitor.NodeTransformer):
  """Counts every loop item, checks every `~` result and output piece (module docstring)."""

  @staticmethod
  def _wrap(node, name):
    return jinja2.nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

  def visit_For(self, node):
    node = self.generic_visit(node)
    node.iter = self._wrap(node.iter, "(counted)")
    return node

  def visit_Concat(self, node):
    operands = jinja2.nodes.List(self.generic_visit(node).nodes, lineno=node.lineno)
    return self._wrap(operands, "(joined)")

  def visit_Getitem(self, node):
    node = self.generic_visit(node)  # `s[1:]` (compiled as Python's slicing) copies: counted
    return self._wrap(node, "(sliced)") if isinstance(node.arg, jinja2.nodes.Slice) else node

  def visit_Compare(self, node):
    node = self.generic_visit(node)  # `x in s`, `s == t` scan their operands: counted
    node.expr = self._wrap(node.expr, "(read)")
    for operand in node.ops:
      operand.expr = self._wrap(operand.expr, "(read)")
    return node

  def visit_Output(self, node):
    node = self.generic_visit(node)
    node.nodes = [self._wrap(child, "(written)") for child in node.nodes]
    return node


@jinja2.pass_environment
def _sum(environment, iterable, attribute=None, start=0):
  """jinja2's `sum`, concatenating lists and tuples once (Python's sum copies the total
  so far per item: quadratic) after checking the total against MAX_LENGTH."""
  items = _materialized(iterable)
  if attribute is not None:
    items = list(map(jinja2.filters.make_attrgetter(environment, attribute), items))
  if isinstance(start, (list, tuple)) and all(type(item) is type(start) for item in items):
    _predict(len(start) + sum(map(len, items)), "|sum")
    return type(start)(itertools.chain(start, itertools.chain.from_iterable(items)))
  return sum(items, start)


def _budgeted_filter(name, filter_):
  """`filter_`, one step a call, refused before it runs if its result would pass the caps."""
  # jinja2 passes a context, eval context or environment first to a filter marked so; an
  # async-capable filter's signature (that of its sync variant) may not name it.
  passed = int(getattr(filter_, "jinja_pass_arg", None) is not None)
  parameters = list(inspect.signature(filter_).parameters.values())
  if passed and parameters[0].name in ("context", "eval_ctx", "environment", "env"):
    parameters = parameters[1:]
  signature = inspect.Signature(parameters)

  @functools.wraps(filter_)
  def checked(*args, **kwargs):
    _tick()
    _check_ints([*args, *kwargs.values()])
    _work(*args, *kwargs.values())
    try:
      bound = signature.bind(*args[passed:], **kwargs)
    except TypeError:
      bound = None  # the filter raises it, with jinja2's message
    if bound is not None:
      _check_filter(name, bound.arguments, args[0] if passed else None)
      args, kwargs = (*args[:passed], *bound.args), bound.kwargs
    return _sized(filter_(*args, **kwargs))
  return checked


def _budgeted_test(name, test):
  """`test`, one step a call; `lower` and `upper` print their value (str()) first."""
  @functools.wraps(test)
  def checked(*args, **kwargs):
    _tick()
    _work(*args, *kwargs.values())
    if name in ("lower", "upper") and args:
      _printed(args[0], how=f"is {name}")
    return test(*args, **kwargs)
  return checked


class _Template(jinja2.Template):
  """A template whose every render starts a fresh count of steps, items and output."""

  def render(self, *args, **kwargs):
    token = _STEPS.set([0, 0, 0])
    try:
      return super().render(*args, **kwargs)
    finally:
      _STEPS.reset(token)


class _Environment(jinja2.sandbox.ImmutableSandboxedEnvironment):
  """jinja2's immutable sandbox with the budget of the module docstring."""

  intercepted_binops = frozenset({"*", "**", "+", "%"})
  template_class = _Template

  def __init__(self, **options):
    super().__init__(**options)
    self.filters["sum"] = _sum
    self.filters = {name: _budgeted_filter(name, f) for name, f in self.filters.items()}
    self.filters.update({"(counted)": _counted, "(joined)": _joined, "(written)": _written,
                         "(sliced)": jinja2.pass_context(lambda context, value: _sized(value)),
                         "(read)": jinja2.pass_context(_read)})
    self.tests = {name: _budgeted_test(name, t) for name, t in self.tests.items()}
    del self.globals["lipsum"]

  def _parse(self, source, name, filename):
    return _Budgeted().visit(super()._parse(source, name, filename))

  def call_binop(self, context, operator, left, right):
    _check_binop(operator, left, right)
    _work(left, right)
    return _sized(super().call_binop(context, operator, left, right))

  def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
    _tick(CALL_STEPS)
    _check_ints([*args, *kwargs.values()])
    if isinstance(__obj, jinja2.runtime.LoopContext) and args:  # `loop(children)`, recursive
      args = (_counted(__context, args[0]), *args[1:])
    method = getattr(__obj, "__wrapped__", __obj)
    args = _check_method(method, args, kwargs)
    _work(getattr(method, "__self__", None), *args, *kwargs.values())
    return _sized(super().call(__context, __obj, *args, **kwargs))

  def wrap_str_format(self, value):
    fmt = getattr(value, "__self__", None)
    if isinstance(fmt, str) and getattr(value, "__name__", None) in ("format", "format_map"):
      try:
        specs = [spec for _, field, spec, _ in string.Formatter().parse(fmt) if field is not None]
      except ValueError:
        specs = []  # malformed: str.format raises it when called
      _check_widths(re.findall(r"\d+", "".join(specs)), fmt)
    return super().wrap_str_format(value)


class _Generation(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` renders its body (transformers' tag)."""

  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()


class _Namespace(jinja2.utils.Namespace):
  """`namespace(...)` that refuses underscore-prefixed attributes (CPython internals)."""

  def __init__(*args, **kwargs):  # `self` in args, so `namespace(self=...)` works (as Jinja's)
    self, attrs = args[0], dict(*args[1:], **kwargs)
    for name in attrs:
      _Namespace._check(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name, value):
    _Namespace._check(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check(name):
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(
          f"a chat template cannot store the attribute {name!r} on a namespace")


class _Dict:
  """`dict(...)` and `dict.fromkeys(...)` without the type object itself."""

  def __call__(self, *args, **kwargs):
    return dict(*args, **kwargs)

  def fromkeys(self, *args, **kwargs):
    return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def _strftime_now(format_string):
  if isinstance(format_string, str):  # '%c' (2 characters) -> 'Wed Dec  2 18:13:46 2026'
    _predict(16 * len(format_string), "strftime_now")
  return datetime.datetime.now().strftime(format_string)


def compile_template(source: str) -> jinja2.Template:
  """`source` compiled in the sandboxed environment described above."""
  environment = _Environment(trim_blocks=True, lstrip_blocks=True,
                             extensions=[_Generation, jinja2.ext.loopcontrols])
  environment.filters["tojson"] = _budgeted_filter("tojson", _tojson)
  environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                             dict=_Dict(), namespace=_Namespace)
  return environment.from_string(source)


def render(template: jinja2.Template, messages: Sequence[Mapping[str, Any]], *,
           add_generation_prompt: bool, variables: Mapping[str, Any]) -> str:
  """The template's text for `messages`; `variables` are the special tokens and
  template switches (`enable_thinking`). Messages are passed as plain dicts with
  reasoning aliased the way transformers does (`reasoning_content`, `thinking`)."""
  plain = []
  for message in messages:
    message = dict(message)
    reasoning = next((message[key] for key in ("reasoning_content", "thinking", "reasoning")
                      if message.get(key) is not None), None)
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    plain.append(message)
  return template.render(messages=plain, tools=None, documents=None,
                         add_generation_prompt=add_generation_prompt, **variables)
