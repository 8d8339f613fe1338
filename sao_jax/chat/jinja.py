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
recursive ones included, and per filter; CALL_STEPS per call, macros included:
a hostile template stops within seconds), and no operator, call
or filter may build a string, list or dict longer than MAX_LENGTH, an int
longer than MAX_INT_BITS, or take an int argument or format width above
MAX_LENGTH. Real templates (Qwen3, Llama 3, Gemma 3) take a few steps per
message. `lipsum` (pages of lorem ipsum on demand) is not offered.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
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

MAX_STEPS = 1_000_000  # loop iterations and calls in one render
CALL_STEPS = 10  # steps a call takes: a jinja2 macro call costs 20-100 loop iterations' time
MAX_LENGTH = 1 << 24  # characters or items of one computed value; ints and widths passed
MAX_INT_BITS = 1 << 16  # bits of an int a template computes

_STEPS: contextvars.ContextVar[list[int]] = contextvars.ContextVar("chat_template_steps")
_SIZED = (str, list, tuple, dict)
# A printf conversion's width and precision: '%-08.3f', '%(name)10s'.
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d*)(?:\.(\d*))?")


def _refuse(what: str) -> jinja2.exceptions.SecurityError:
  return jinja2.exceptions.SecurityError(
      f"the chat template {what}; a chat template may take {MAX_STEPS} steps per render, "
      f"build values of {MAX_LENGTH} items and ints of {MAX_INT_BITS} bits "
      "(sao_jax.chat.jinja); this one is broken or hostile, use another checkpoint's template")


def _tick(steps: int = 1) -> None:
  counter = _STEPS.get()
  counter[0] += steps
  if counter[0] > MAX_STEPS:
    raise _refuse(f"took more than {MAX_STEPS} steps (loop iterations and calls) in one render")


def _sized(value: Any) -> Any:
  if isinstance(value, _SIZED) and len(value) > MAX_LENGTH:
    raise _refuse(f"built a {type(value).__name__} of {len(value)} items")
  return value


def _check_ints(values: Sequence[Any]) -> None:
  for value in values:
    if isinstance(value, int) and abs(value) > MAX_LENGTH:
      raise _refuse(f"passed the int {value} to a call or filter")


def _check_widths(numbers: Sequence[str], fmt: str) -> None:
  if any(number and int(number) > MAX_LENGTH for number in numbers):
    raise _refuse(f"formats with widths {numbers} ({fmt[:80]!r})")


def _check_percent(fmt: Any) -> None:
  if isinstance(fmt, str):
    _check_widths([n for match in _PERCENT.findall(fmt) for n in match], fmt)


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
  if operator == "%":
    _check_percent(left)


@jinja2.pass_context
def _counted(context, iterable):
  """The items of a loop's iterable, one step each (wraps every `for` loop's iterable)."""
  for item in iterable:
    _tick()
    yield item


@jinja2.pass_context
def _length_checked(context, value):
  """`value` (a `~` concatenation) if it is within MAX_LENGTH."""
  return _sized(value)


class _Budgeted(jinja2.visitor.NodeTransformer):
  """Counts every loop item and checks every `~` result (module docstring)."""

  def visit_For(self, node):
    node = self.generic_visit(node)
    node.iter = jinja2.nodes.Filter(node.iter, "(counted)", [], [], None, None,
                                    lineno=node.iter.lineno)
    return node

  def visit_Concat(self, node):
    return jinja2.nodes.Filter(self.generic_visit(node), "(length checked)", [], [], None, None,
                               lineno=node.lineno)


def _budgeted_filter(name, filter_):
  @functools.wraps(filter_)
  def checked(*args, **kwargs):
    _tick()
    _check_ints([*args, *kwargs.values()])
    if name == "format":
      _check_percent(next((arg for arg in args if isinstance(arg, str)), None))
    return _sized(filter_(*args, **kwargs))
  return checked


class _Template(jinja2.Template):
  """A template whose every render starts a fresh step count."""

  def render(self, *args, **kwargs):
    token = _STEPS.set([0])
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
    self.filters = {name: _budgeted_filter(name, f) for name, f in self.filters.items()}
    self.filters.update({"(counted)": _counted, "(length checked)": _length_checked})
    del self.globals["lipsum"]

  def _parse(self, source, name, filename):
    return _Budgeted().visit(super()._parse(source, name, filename))

  def call_binop(self, context, operator, left, right):
    _check_binop(operator, left, right)
    return _sized(super().call_binop(context, operator, left, right))

  def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
    _tick(CALL_STEPS)
    _check_ints([*args, *kwargs.values()])
    if isinstance(__obj, jinja2.runtime.LoopContext) and args:  # `loop(children)`, recursive
      args = (_counted(__context, args[0]), *args[1:])
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
