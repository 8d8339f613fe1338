r"""Final-answer extraction and checking for math environments.

Format: the final answer is the content of the *last* `\boxed{...}` in the
assistant turn (braces balanced, so `\boxed{\frac{1}{2}}` works).

`verify_answer(predicted, gold)` decides correctness, in this order:

1. Equal after normalisation (surrounding `$` and whitespace, a trailing
   period, repeated spaces) -> correct.
2. A plain-text gold answer (letters, spaces, `'` and `-` only, e.g. "Paris")
   is matched case-insensitively and nothing else: math parsers would read
   "Paris" as the product p*a*r*i*s and accept any anagram.
3. Against a gold without a percent sign, a percentage prediction counts as
   its number: `7\%` is 7, never also 0.07 (`_PERCENT` markers are dropped).
   math-verify reads `7\%` as 7 against 7 and as 0.07 against 0.07, and
   `700\%` matches both 7 and 700: one answer for two golds a factor of 100
   apart (dollars or cents, a fraction or its percentage), a hedge.
4. Predictions that could make the symbolic check explode (over
   `MAX_ANSWER_CHARS`, a power inside an exponent, an exponent or factorial
   argument of 5+ digits) -> incorrect.
5. `math-verify` (Hugging Face's `math_verify.parse` / `verify`, both sides
   wrapped in `\boxed{}`) when it can parse both: handles 1/2 vs 0.5,
   `\frac12`, `3\sqrt2` vs `\sqrt{18}`, `x+1` vs `1+x`, sets, thousands
   separators. It runs in a child process (`checker`): an answer that keeps it
   busy past `_DEADLINE_S` (or over its memory cap) is incorrect.
6. Fallback when math-verify cannot parse one side: exact rational comparison
   of plain numbers (integers, decimals, `a/b`, `,` thousands separators);
   anything else is incorrect.

Step 4 only saves the child's time on answers known to explode; the child's
deadline is the guard (no pattern list catches every explosive answer, e.g.
`2^{+99999999999}` or `(99999999)!`), on any thread.
"""

from __future__ import annotations

import fractions
import re

from sao_jax.envs.math import checker

MAX_ANSWER_CHARS = 512
_TIMEOUT_S = 5  # math-verify's own limit per parse and per comparison
_DEADLINE_S = 3 * _TIMEOUT_S + 5  # then the checker is killed: two parses, a comparison, slack
_PLAIN_TEXT = re.compile(r"[A-Za-z][A-Za-z '\-]*")
_EXPLOSIVE = re.compile(r"(\^|\*\*)\s*[{(]?[^})]*(\^|\*\*)"  # power in an exponent
                        r"|(\^|\*\*)\s*[{(]?\s*\d{5,}"  # 5+ digit exponent
                        r"|\d{5,}\s*!")  # 5+ digit factorial
# What math-verify reads as a percent sign (`\%`, `%`, `percent`, `percentage`, `pct`,
# also inside `\text{}`): what step 3 drops.
_PERCENT = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{\s*(?:\\?%|percent(?:age)?|pct)\s*\}"
                      r"|\\?%|percent(?:age)?|pct", re.IGNORECASE)
_NUMBER = re.compile(r"[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?(/\d+)?|[+-]?\.\d+")


def extract_boxed(text: str) -> str | None:
  r"""Content of the last `\boxed{...}`, or None if there is no complete one.

  One pass, matching braces with a stack: a box is complete where the brace it
  opens is closed, and the last complete one is the one that opens last. (Scanning
  from each unclosed `\boxed{` to the end was quadratic: ~1.5 s for 10 000
  characters of `\boxed{`, the sampler's time.)"""
  opened: list[int] = []  # per open brace: where its box's content starts, or -1
  last = None
  for i, char in enumerate(text):
    if char == "{":
      opened.append(i + 1 if text[max(i - len("\\boxed"), 0):i] == "\\boxed" else -1)
    elif char == "}" and opened:
      start = opened.pop()
      if start >= 0 and (last is None or start > last[0]):
        last = (start, i)
  return None if last is None else text[last[0]:last[1]].strip()


def _normalize(answer: str) -> str:
  answer = answer.strip().strip("$").strip().rstrip(".").strip()
  return " ".join(answer.split())


def _as_number(answer: str) -> fractions.Fraction | None:
  if not _NUMBER.fullmatch(answer):
    return None
  try:
    return fractions.Fraction(answer.replace(",", ""))
  except ZeroDivisionError:  # "1/0": no number (it raised out of the environment's step)
    return None


def verify_answer(predicted: str, gold: str) -> bool:
  """Whether `predicted` matches the reference `gold` (rules in the module docstring)."""
  predicted, gold = _normalize(predicted), _normalize(gold)
  if not predicted:
    return False
  if predicted == gold:
    return True
  if _PLAIN_TEXT.fullmatch(gold):
    return predicted.casefold() == gold.casefold()
  if _PERCENT.search(predicted) and not _PERCENT.search(gold):
    predicted = _normalize(_PERCENT.sub(" ", predicted))  # one reading only, see step 3
    if not predicted:
      return False
  if len(predicted) > MAX_ANSWER_CHARS or _EXPLOSIVE.search(predicted):
    return False
  verdict = checker.verify(predicted, gold, timeout_s=_TIMEOUT_S, deadline_s=_DEADLINE_S)
  if verdict is not None:
    return verdict
  predicted_number, gold_number = _as_number(predicted), _as_number(gold)
  return predicted_number is not None and predicted_number == gold_number


def reference_answer(value: str | int, answer_format: str) -> str:
  r"""The reference answer a dataset cell holds, written as `answer_format`
  (`sao_jax.config.dataset.ANSWER_FORMATS`): "plain" = the cell itself (an integer
  becomes its decimal text), "gsm8k" = the text after the last `####` with
  thousands separators removed ("#### 1,000" -> "1000"), "boxed" = the content of
  the last `\boxed{...}`. ValueError saying what is missing when the cell does not
  hold an answer in that format."""
  if isinstance(value, int) and not isinstance(value, bool):
    if answer_format != "plain":
      raise ValueError(f"an integer cannot hold a {answer_format!r} answer; "
                       "use answer_format='plain'")
    return str(value)
  if not isinstance(value, str):
    raise ValueError(f"expected text or an integer, got {type(value).__name__}")
  if answer_format == "gsm8k":
    _, marker, answer = value.rpartition("####")
    answer = answer.strip().replace(",", "")
    if not marker or not answer:
      raise ValueError("no answer after '####' (GSM8K solutions end in '#### <answer>')")
    return answer
  if answer_format == "boxed":
    answer = extract_boxed(value)
    if not answer:
      raise ValueError("no complete, non-empty \\boxed{...}")
    return answer
  if not value.strip():
    raise ValueError("empty answer")
  return value.strip()
