"""Size bounds of chat-template steps (`sao_jax.chat.jinja`), checked before a step runs.

A step that would build more than MAX_LENGTH (`sao_jax.chat.jinja_budget`) from
small inputs is refused before it runs, from a bound computed without building
the value: `replace` (method and filter), `join`, `expandtabs`, `translate`,
`encode`, `hex`, the case maps, `format`/`format_map`/`%`/`|format` (widths,
`*` widths, a field used many times), `|indent`, `|wordwrap`, `|urlize`,
`|xmlattr`, `|escape`, `|urlencode`, `|tojson` (indent, separators), `|pprint`,
`~`, and everything that prints a container with str(): a list holding one
string a thousand times prints it a thousand times (`_Printed`); `|batch` and
`|slice` count the lists they make against MAX_WORK. `*` and `**` may not build
an int longer than MAX_INT_BITS, `*` and `+` no sequence longer than
MAX_LENGTH, and no call or filter takes an int argument or format width above
MAX_LENGTH. (`strftime_now` and `|sum` of lists are bounded where
`sao_jax.chat.jinja` defines them.)

A bound is never below the size of what the step builds, and a check never
changes a result: it refuses or lets the step run. A few bounds refuse early
where the value would fit (the case maps and `encode` of a non-ASCII string
over MAX_LENGTH / 3 or / 100 characters, `|urlize` and `|wordwrap` of texts near
MAX_LENGTH / 12 and / 2).
"""

from __future__ import annotations

import codecs
import re
import string
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.filters
import jinja2.runtime
import jinja2.utils
import markupsafe

# The caps are read from the module when a check runs (see jinja_budget's docstring).
from sao_jax.chat import jinja_budget as budget
from sao_jax.chat.jinja_budget import _SIZED, _charge, _materialized, _predict, _refuse

# A printf conversion: '%-08.3f', '%(name)10s', '%*.*d' (widths from the arguments).
_PERCENT = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.?)", re.DOTALL)
_NUMBER_TEXT = 320  # more than any int or float prints as (%f of 1e308: 309 digits), widths aside
_SHORT_REPR = 256  # more than the repr of any other object a template reaches (macro, loop, range)
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines breaks
_CONTROLS = dict.fromkeys(range(32))  # characters json.dumps escapes as \uXXXX (or \n ...)


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
    if len(value) > budget.MAX_LENGTH:  # every item prints as a character at least
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
      if total > budget.MAX_LENGTH:
        break
    self.open.discard(id(value))
    self.memo[key] = total
    return total


def _printed(value: Any, mode: str = "str", how: str = "") -> int:
  """The bound of _Printed, refused if above MAX_LENGTH."""
  length = _Printed(mode).length(value)
  if length > budget.MAX_LENGTH:
    raise _refuse(f"would print a {type(value).__name__} as up to {length} characters"
                  f"{' with ' + how if how else ''}")
  return length


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
      if sizes[-1] > budget.MAX_LENGTH:
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
  if widest <= 1 or len(text) * widest <= budget.MAX_LENGTH or not isinstance(table, dict):
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
    if total > budget.MAX_LENGTH:
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
    if isinstance(value, int) and abs(value) > budget.MAX_LENGTH:
      raise _refuse(f"passed the int {value} to a call or filter")


def _check_widths(numbers: Sequence[str], fmt: str) -> None:
  if any(number and int(number) > budget.MAX_LENGTH for number in numbers):
    raise _refuse(f"formats with widths {numbers} ({fmt[:80]!r})")


def _check_binop(operator: str, left: Any, right: Any) -> None:
  """Refuses before computing it an operator result above the caps (module docstring)."""
  ints = isinstance(left, int) and isinstance(right, int)
  if operator == "*" and ints and left.bit_length() + right.bit_length() > budget.MAX_INT_BITS:
    raise _refuse(f"multiplied ints of {left.bit_length()} and {right.bit_length()} bits")
  if operator == "*" and not ints:
    sequence, count = (left, right) if isinstance(right, int) else (right, left)
    if (isinstance(sequence, _SIZED) and isinstance(count, int)
        and len(sequence) * count > budget.MAX_LENGTH):
      raise _refuse(f"repeated a {type(sequence).__name__} of {len(sequence)} items {count} times")
  if (operator == "**" and ints and right > 0 and abs(left) > 1
      and right * left.bit_length() > budget.MAX_INT_BITS):
    raise _refuse(f"raised an int of {left.bit_length()} bits to the power {right}")
  if (operator == "+" and isinstance(left, _SIZED) and isinstance(right, _SIZED)
      and len(left) + len(right) > budget.MAX_LENGTH):
    raise _refuse(f"joined values of {len(left)} and {len(right)} items with +")
  if operator == "%" and isinstance(left, (str, bytes)):
    _check_printf(left, right, _escape_factor(left))



def _text_length(value: Any) -> int:
  return len(value) if isinstance(value, str) else _Printed().length(value)
