"""The template environment: transformers' filters and globals, inside jinja2's sandbox."""

import jinja2
import pytest

from sao_jax.chat import jinja
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


# A chat template is code from a downloaded checkpoint. Each of these would, without the
# budget of sao_jax.chat.jinja, hang a render or allocate gigabytes (scaled down here
# where the unbounded form would hang the test on the old code); each is refused with
# a SecurityError naming what it did.
@pytest.mark.parametrize("source, what", [
    # jinja2 folds constants while compiling: this allocated the string at load time.
    ("{{ ('a' * 10**12)|length }}", "repeated a str of 1 items"),
    ("{{ [0] * 10**9 }}", "repeated a list of 1 items"),
    ("{{ (7 ** 300000) > 1 }}", "raised an int of 3 bits to the power 300000"),
    ("{% set ns = namespace(n=3) %}{% for i in range(20) %}{% set ns.n = ns.n * ns.n %}"
     "{% endfor %}", "multiplied ints of"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(25) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}", "built a str of 33554432 items"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(25) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}", "joined values of 16777216 and 16777216 items"),
    ("{{ '{:>100000000}'.format(1)|length }}", r"formats with widths \['100000000'\]"),
    ("{{ ('%0100000000d' % 1)|length }}", r"formats with widths \['100000000'"),
    ("{{ ('%0100000000d'|format(1))|length }}", r"formats with widths \['100000000'"),
    ("{{ 'a'.ljust(100000000)|length }}", "passed the int 100000000"),
    ("{{ ('a'|center(100000000))|length }}", "passed the int 100000000"),
    ("{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}",
     "took more than 1000000 steps"),
    ("{% for i in range(2000) %}{% for j in range(2000) if false %}{% endfor %}{% endfor %}",
     "took more than 1000000 steps"),
])
def test_a_template_cannot_loop_or_allocate_without_bound(source, what):
  with pytest.raises(jinja2.exceptions.SecurityError, match=what):
    run(source)


def test_recursion_counts_against_the_step_budget(monkeypatch):
  """Exponential macro recursion and recursive loops spend steps per call and per
  item (a small budget here; the real one stops 2**40 calls within seconds)."""
  monkeypatch.setattr(jinja, "MAX_STEPS", 10_000)
  with pytest.raises(jinja2.exceptions.SecurityError, match="took more than 10000 steps"):
    run("{% macro f(n) %}{% if n < 12 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}"
        "{{ f(0) }}")
  with pytest.raises(jinja2.exceptions.SecurityError, match="took more than 10000 steps"):
    run("{% for x in range(100) recursive %}{% if loop.depth < 3 %}{{ loop(range(100)) }}"
        "{% endif %}{% endfor %}")


def test_the_budget_leaves_ordinary_templates_alone():
  assert run("{{ 'ab' * 2 }}|{{ '%3d' % 7 }}|{{ '{:>3}'.format(7) }}|{{ 2 ** 10 }}|"
             "{{ 'x' ~ 'y' }}|{{ [1] + [2] }}|{{ 'a'|center(3) }}") == (
                 "abab|  7|  7|1024|xy|[1, 2]| a ")
  # Every render starts a fresh count: one template rendered many times is never refused.
  template = compile_template("{% for i in range(100000) %}{% endfor %}ok")
  for _ in range(12):
    assert render(template, [], add_generation_prompt=False, variables={}) == "ok"
  with pytest.raises(jinja2.exceptions.UndefinedError, match="lipsum"):
    run("{{ lipsum(100000) }}")
