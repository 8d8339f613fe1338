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
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils


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
  environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
  environment.filters["tojson"] = _tojson
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
