"""The template environment: transformers' filters and globals, inside jinja2's sandbox."""

import jinja2
import pytest

from sao_jax.chat import jinja, jinja_budget
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
# budget of sao_jax.chat.jinja_budget and the bounds of jinja_bounds, hang a render or
# allocate gigabytes (scaled down here where the unbounded form would hang the test on
# the old code); each is refused with a SecurityError naming what it did.
@pytest.mark.parametrize("source, what", [
    # jinja2 folds constants while compiling: this allocated the string at load time.
    ("{{ ('a' * 10**12)|length }}", "repeated a str of 1 items"),
    ("{{ [0] * 10**9 }}", "repeated a list of 1 items"),
    ("{{ (7 ** 300000) > 1 }}", "raised an int of 3 bits to the power 300000"),
    ("{% set ns = namespace(n=3) %}{% for i in range(20) %}{% set ns.n = ns.n * ns.n %}"
     "{% endfor %}", "multiplied ints of"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(25) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}", "would build a value of up to 33554432 items with ~"),
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
  monkeypatch.setattr(jinja_budget, "MAX_STEPS", 10_000)
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


# One step builds far more than its inputs: each was computed before the size check ran
# (or never checked). With the caps scaled down, the plain jinja2 rendering (no budget)
# builds more than MAX_LENGTH (MAX_WORK: what all steps read or build); the budgeted
# one refuses before building it. The old code failed each of these: it built the value
# and refused after ("built a str of 20000 items") or returned it.
CAP, WORK_CAP = 10_000, 100_000
ALIASED = "(['b' * 500] * 100)"  # 100 items, 50,000 characters printed
AMPLIFIERS = [
    ("{{ ('a' * 100).replace('a', 'b' * 200)|length }}", "up to 20000 items with str.replace"),
    ("{{ ('a' * 100)|replace('a', 'b' * 200)|length }}", "up to 20000 items with |replace"),
    ("{{ ('a' * 100).replace('', 'b' * 200)|length }}", "up to 20300 items with str.replace"),
    ("{{ (('a' * 100)|safe).replace('a', '\"' * 30)|length }}", "with Markup.replace"),  # escaped
    ("{{ ('a' * 100).encode().replace('a'.encode(), ('b' * 200).encode())|length }}",
     "up to 20000 items with bytes.replace"),
    ("{{ ('x' * 500).join(['a'] * 100)|length }}", "up to 49600 items with str.join"),
    ("{{ (['a'] * 100)|join('x' * 500)|length }}", "with |join"),
    ("{{ ([['b' * 500]] * 100)|join|length }}", "with |join"),  # each item printed
    ("{{ ('\t' * 100).expandtabs(500)|length }}", "up to 50000 items with str.expandtabs"),
    ("{{ ('a' * 100).translate({97: 'b' * 500})|length }}", "with str.translate"),
    ("{{ ('{0}' * 100).format('b' * 500)|length }}", "with the format '\\{0\\}\\{0\\}"),
    ("{{ ('{a}' * 100).format_map({'a': 'b' * 500})|length }}", "with the format '\\{a\\}\\{a\\}"),
    ("{{ '{}'.format(" + ALIASED + ")|length }}", "with the format '{}'"),
    ("{{ (('%(a)s' * 100) % {'a': 'b' * 500})|length }}", "with the format '%\\(a\\)s"),
    ("{{ ('%*d%*d' % (9000, 1, 9000, 1))|length }}", "with the format '%\\*d%\\*d'"),
    ("{{ ('%s' % [" + ALIASED + "])|length }}", "with the format '%s'"),
    ("{{ ('%a' % ('\u4e00' * 2000))|length }}", "with the format '%a'"),
    ("{{ ('%s%s%s'|format('b' * 5000, 'b' * 5000, 'b' * 5000))|length }}", "the format '%s%s%s'"),
    ("{{ strftime_now('%c' * 1000)|length }}", "with strftime_now"),  # 24 characters a %c
    ("{{ ('\n' * 100)|indent(500, blank=true)|length }}", "with |indent"),
    ("{% set ns = namespace(v=1) %}{% for i in range(50) %}{% set ns.v = [ns.v] %}{% endfor %}"
     "{{ ns.v|tojson(indent=100)|length }}", "with |tojson"),
    ("{{ " + ALIASED + "|tojson|length }}", "with |tojson"),
    ("{{ ([1] * 100)|tojson(separators=('x' * 500, ':'))|length }}", "with |tojson"),
    ("{{ " + ALIASED + "|pprint|length }}", "with |pprint"),
    ("{{ {'k' * 100: ['a b c d ' * 10] * 3}|pprint|length }}", "with |pprint"),  # indented
    ("{{ ('a ' * 100)|wordwrap(1, wrapstring='x' * 500)|length }}", "with |wordwrap"),
    ("{{ ('http://a.io ' * 100)|urlize(target='x' * 500)|length }}", "with |urlize"),
    ("{{ {'a': '\"' * 3000}|xmlattr|length }}", "with |xmlattr"),
    ("{{ " + ALIASED + "|string|length }}", "would print a list as up to"),
    ("{{ " + ALIASED + "|upper|length }}", "would print a list as up to"),
    ("{{ ('\"' * 3000)|e|length }}", "up to 15000 items with |e"),
    ("{{ ('ß' * 6000)|upper|length }}", "up to 18000 items with |upper"),
    ("{{ ('\u4e00' * 2000).encode('unicode_escape')|length }}", "with str.encode"),
    ("{{ ('a' * 6000).encode().hex()|length }}", "up to 18000 items with bytes.hex"),
    ("{{ ([['b'] * 500] * 100)|sum(start=[])|length }}", "up to 50000 items with |sum"),
    ("{{ (" + ALIASED + " ~ '')|length }}", "items with ~"),
    # Values no check saw: bytes, the render's output, many values each below the cap.
    ("{{ ('a'.encode() * 20000)|length }}", "repeated a bytes of 1 items 20000 times"),
    ("{{ " + ALIASED + " }}", "wrote more than 10000 characters"),
    ("{% for i in range(100) %}{{ 'b' * 500 }}{% endfor %}", "wrote more than 10000 characters"),
    ("{% for i in range(100) %}" + "b" * 500 + "{% endfor %}", "wrote more than 10000 char"),
    ("{% macro m() %}{% for i in range(100) %}{{ 'b' * 500 }}{% endfor %}{% endmacro %}"
     "{{ m()|length }}", "wrote more than 10000 characters"),
    ("{% set ns = namespace(l=[]) %}{% for i in range(100) %}"
     "{% set ns.l = ns.l + [('b' * 5000)|upper] %}{% endfor %}{{ ns.l|map('length')|sum }}",
     "read or built more than 100000 items in all"),
    ("{% set s = 'b' * 9000 %}{% set ns = namespace(l=[]) %}{% for i in range(100) %}"
     "{% set ns.l = ns.l + [s[i:]] %}{% endfor %}{{ ns.l|map('length')|sum }}",
     "read or built more than 100000 items in all"),
    ("{{ " + ALIASED + " is lower }}", "would print a list as up to .* with is lower"),
    # A list a row: |slice(n) makes n lists of a one-item list.
    ("{% set ns = namespace(n=0) %}{% for i in range(20) %}"
     "{% set ns.n = ns.n + ([1]|slice(9000)|list)|length %}{% endfor %}{{ ns.n }}",
     "read or built more than 100000 items in all"),
    # Scans build nothing: a step each, 15 x 9000 characters read (what the last line prints).
    ("{% set s = 'b' * 9000 %}{% for i in range(15) %}{% if 'x' in s %}{% endif %}{% endfor %}"
     "{{ (s * 15)|length }}", "read or built more than 100000 items in all"),
]


def unbounded(source):
  """What plain jinja2 (no budget) builds for `source`: the number it prints, or the
  length of its output (`is lower` prints its value first: measured with |string)."""
  environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
  environment.filters["tojson"] = jinja._tojson
  environment.globals["strftime_now"] = jinja._strftime_now
  out = environment.from_string(source.replace(" is lower", "|string|length")).render()
  return int(out) if out.isdigit() else len(out)


@pytest.mark.parametrize("source, what", AMPLIFIERS)
def test_a_step_that_would_build_past_the_cap_is_refused_before_it_runs(
    monkeypatch, source, what):
  assert unbounded(source) > CAP or "in all" in what
  assert unbounded(source) > WORK_CAP or "in all" not in what
  monkeypatch.setattr(jinja_budget, "MAX_LENGTH", CAP)
  monkeypatch.setattr(jinja_budget, "MAX_WORK", WORK_CAP)
  with pytest.raises(jinja2.exceptions.SecurityError, match=what):
    run(source)


def test_the_size_checks_leave_ordinary_use_as_jinja2_renders_it(monkeypatch):
  """Every checked operation, at sizes well inside the caps, renders what plain jinja2
  renders (the checks bound sizes; they never change a result)."""
  source = ("{{ 'a-b'.replace('-', '+') }}|{{ 'a-b'|replace('-', '+', 1) }}|"
            "{{ ['a', 1]|join(', ') }}|{{ ', '.join(['a', 'b']) }}|{{ 'x\ty'.expandtabs(4) }}|"
            "{{ 'ab'.translate({97: 'AA'}) }}|{{ '{0}{0}{x!r:>6}'.format('z', x='q') }}|"
            "{{ '%s=%r %(x)s' % ('a', 'b') if false else '%s=%r %5.2f' % ('a', 'b', 2.5) }}|"
            "{{ '%(x)s%(x)s' % {'x': 'y'} }}|{{ '%*d' % (3, 7) }}|{{ '%s'|format([1]) }}|"
            "{{ {'a': [1, {'b': None}]}|tojson(indent=2) }}|{{ [1, 'é']|tojson }}|"
            "{{ {'k': [1, 2]}|pprint }}|{{ 'ab\ncd'|indent(2, first=true) }}|"
            "{{ 'a b c'|wordwrap(1) }}|{{ {'id': 'x\"'}|xmlattr }}|{{ [1, [2]]|string }}|"
            "{{ 'ßa'|upper }}|{{ '<\"'|e }}|{{ 'é'.encode()|length }}|{{ 'a'.encode().hex() }}|"
            "{{ [[1], [2]]|sum(start=[]) }}|{{ [(1,), (2,)]|sum(start=()) }}|{{ [1, 2]|sum }}|"
            "{{ [1] ~ 'x' ~ none }}|{{ {'a': 1} }}|{{ 'aB' is lower }}|{{ 'abc'[1:] }}|"
            "{{ 'go to http://a.io'|urlize(target='_blank') }}|{{ [1, 2, 3]|slice(2)|list }}|"
            "{{ range(3)|batch(2, 0)|list }}|{% set ns = namespace() %}{% set ns.x = [ns] %}"
            "{{ ns }}")  # a cycle prints as [...] or {...}
  plain = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
  plain.filters["tojson"] = jinja._tojson
  assert run(source) == plain.from_string(source).render(messages=[{"role": "user",
                                                                     "content": "hi"}])
