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
int, `'{:>999999999}'.format(1)`, a string doubled with `~` in a loop. So every
render runs on a budget of steps, sizes and items read or built
(`sao_jax.chat.jinja_budget`: the caps, what counts, what remains unbounded),
and a step that could build a large value from small inputs is checked against
a bound before it runs (`sao_jax.chat.jinja_bounds`: every bound). This module
wires both into jinja2: `_Budgeted` rewrites a parsed template so that loops
count their items and `~`, slices, comparisons and output pieces are checked;
the environment checks every operator (`*`, `**`, `+`, `%`), call,
`str.format`, filter and test; `_Template` starts a fresh count per render.
`lipsum` (pages of lorem ipsum on demand) is not offered.
"""

from __future__ import annotations

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

# The caps are read from the module when a check runs (see jinja_budget's docstring).
from sao_jax.chat import jinja_budget as budget
from sao_jax.chat.jinja_bounds import (_check_binop, _check_filter, _check_ints, _check_method,
                                       _check_widths, _printed, _text_length)
from sao_jax.chat.jinja_budget import (_STEPS, _materialized, _predict, _refuse, _sized, _tick,
                                       _work)


@jinja2.pass_context
def _counted(context, iterable):
  """The items of a loop's iterable, one step each (wraps every `for` loop's iterable)."""
  for item in iterable:
    _tick()
    yield item


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
  if counter[2] > budget.MAX_LENGTH:
    raise _refuse(f"wrote more than {budget.MAX_LENGTH} characters of output in one render")
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
    _tick(budget.CALL_STEPS)
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
           add_generation_prompt: bool, variables: Mapping[str, Any],
           tools: Sequence[Mapping[str, Any]] | None = None) -> str:
  """The template's text for `messages`; `variables` are the special tokens and
  template switches (`enable_thinking`); `tools` the OpenAI-format function
  schemas, as transformers passes them (None: no tools). Messages are passed as plain dicts with
  reasoning aliased the way transformers does (`reasoning_content`, `thinking`)."""
  plain = []
  for message in messages:
    message = dict(message)
    reasoning = next((message[key] for key in ("reasoning_content", "thinking", "reasoning")
                      if message.get(key) is not None), None)
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    plain.append(message)
  return template.render(messages=plain, tools=[dict(t) for t in tools] if tools else None,
                         documents=None,
                         add_generation_prompt=add_generation_prompt, **variables)
