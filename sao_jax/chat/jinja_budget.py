"""The per-render budget of a chat template (`sao_jax.chat.jinja`): caps and counters.

A checkpoint's chat template is untrusted code. jinja2's sandbox keeps it away
from Python internals but not from work without bound, so one render may take
at most MAX_STEPS steps (one per loop iteration, filtered or recursive ones
included, and per filter or test; CALL_STEPS per call, macros included), no
operator, call or filter may build a string, bytes, list or dict longer than
MAX_LENGTH, an int longer than MAX_INT_BITS, or take an int argument or format
width above MAX_LENGTH, and the render writes at most MAX_LENGTH characters
(template text and `{{ }}` pieces, in macros and blocks too). And all calls,
filters, operators and comparisons of a render read or build at most MAX_WORK
items in all, so a loop can neither keep many distinct values just under
MAX_LENGTH nor scan one a million times (`'x' in s`, hours at a step each).
Real templates (Qwen3, Llama 3, Gemma 3) take a few steps per message and read
or build about ten times their output. A step that would build more than
MAX_LENGTH from small inputs is refused before it runs, from the bounds of
`sao_jax.chat.jinja_bounds`.

This module holds the caps, the counters of one render (`_STEPS`, a context
variable that `sao_jax.chat.jinja` sets afresh for every render: steps, items
read or built, characters written) and the checks that charge them; each
refusal is a `jinja2.exceptions.SecurityError` naming what the template did and
the caps. Other modules read the caps here when they check (`budget.MAX_LENGTH`),
never a copy taken at import, so lowering a cap here lowers it for every check.

What remains, bounded but not by these caps: sizes are counted in items, not
bytes, so a list of MAX_LENGTH distinct small objects (`|batch(1)`,
`|slice(n)`, `s.split(',')`, `d.items()|list`) takes about 1 GB; and work that
is neither read nor built by a call, filter or operator (`|sort` is n log n,
dictionary lookups) counts as one step.
"""

from __future__ import annotations

import contextvars
import itertools
from typing import Any

import jinja2

MAX_STEPS = 1_000_000  # loop iterations and calls in one render
CALL_STEPS = 10  # steps a call takes: a jinja2 macro call costs 20-100 loop iterations' time
MAX_LENGTH = 1 << 24  # characters or items of one computed value; ints and widths passed
MAX_INT_BITS = 1 << 16  # bits of an int a template computes
MAX_WORK = 1 << 26  # characters and items read or built by a render's calls, filters, operators

# Per render: [steps, items read or built, characters written].
_STEPS: contextvars.ContextVar[list[int]] = contextvars.ContextVar("chat_template_steps")
_SIZED = (str, bytes, list, tuple, dict)


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


def _materialized(iterable: Any) -> Any:
  """`iterable` as a list (a generator is consumed once: the caller passes this list on)."""
  if isinstance(iterable, (str, bytes, list, tuple)):
    return iterable
  items = list(itertools.islice(iterable, MAX_LENGTH + 1))
  if len(items) > MAX_LENGTH:
    raise _refuse(f"passed an iterable of more than {MAX_LENGTH} items")
  return items
