"""The template environment: transformers' filters and globals, inside jinja2's sandbox."""

import jinja2
import pytest

from sao_jax.chat.jinja import compile_template, render


def run(source, **variables):
  return render(compile_template(source), [{"role": "user", "content": "hi"}],
                add_generation_prompt=False, variables=variables)


def test_transformers_helpers():
  assert run("{{ {'b': 'é<', 'a': 1} | tojson }}") == '{"b": "é<", "a": 1}'  # no HTML escaping
  assert run("{{ [1] | tojson(indent=2) }}") == "[\n  1\n]"
  assert run("{% for m in messages %}{% if true %}{% break %}{% endif %}x{% endfor %}ok") == "ok"
  assert run("{% generation %}{{ messages[0].content }}{% endgeneration %}") == "hi"
  assert run("{% set ns = namespace(n=1) %}{% set ns.n = 2 %}{{ ns.n }}") == "2"
  assert run("{{ bos_token }}{{ enable_thinking }}", bos_token="<s>", enable_thinking=False) == (
      "<s>False")
  assert len(run("{{ strftime_now('%Y') }}")) == 4
  with pytest.raises(jinja2.TemplateError, match="no such role"):
    run("{{ raise_exception('no such role') }}")


def test_a_template_cannot_reach_python_internals():
  with pytest.raises(jinja2.exceptions.SecurityError):
    run("{{ ''.__class__.__mro__ }}")
  with pytest.raises(jinja2.exceptions.SecurityError):
    run("{% set ns = namespace() %}{% set ns._x = 1 %}")
  with pytest.raises(jinja2.exceptions.SecurityError):
    run("{{ messages.append(1) }}")  # immutable: a template cannot edit the conversation
