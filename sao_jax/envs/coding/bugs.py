"""The bank of small functions and plantable bugs behind `generator`.

Each `Template` is a correct, pure Python function (for loops only, so no
planted bug can hang a test) with one or more `Bug`s: `old` is a snippet that
occurs exactly once in the correct source and `new` replaces it. `edge_cases`
are fixed argument tuples, among them one that exposes each bug (the buggy
function returns something else or raises); `random_case` draws more. tests/envs
check every one of these properties for the whole bank.

Bug kinds: "off_by_one" (range or slice bounds, update order), "wrong_operator"
(comparison, boolean or arithmetic operator), "missing_edge_case" (a guard or
normalisation step removed), "wrong_value" (a constant or variable swapped).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable

from sao_jax.config.env import CODING_BUG_KINDS

KINDS = CODING_BUG_KINDS

_WORDS = ("apple", "banana", "level", "radar", "sky", "tree", "queue", "rhythm", "noon",
          "orange", "civic", "data")


@dataclasses.dataclass(frozen=True)
class Bug:
  kind: str
  old: str
  new: str


@dataclasses.dataclass(frozen=True)
class Template:
  name: str
  source: str
  bugs: tuple[Bug, ...]
  edge_cases: tuple[tuple[Any, ...], ...]
  random_case: Callable[[random.Random], tuple[Any, ...]]


def _ints(rng: random.Random, lo: int, hi: int, max_len: int, min_len: int = 0) -> list[int]:
  return [rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))]


def _text(rng: random.Random, words: int, sep: str = " ") -> str:
  return sep.join(rng.choice(_WORDS) for _ in range(words))


def _capitalised(rng: random.Random, text: str) -> str:
  return "".join(ch.upper() if rng.random() < 0.3 else ch for ch in text)


def _palindrome(rng: random.Random) -> str:
  word = rng.choice(_WORDS)
  return _capitalised(rng, word + " " + word[::-1] if rng.random() < 0.5 else word)


def _range_case(rng: random.Random) -> tuple[list[int], int, int]:
  lo = rng.randint(0, 10)
  return _ints(rng, 0, 20, 8), lo, lo + rng.randint(0, 10)


BANK: tuple[Template, ...] = (
    Template("sum_range", '''def sum_range(a, b):
    """Sum of the integers from a to b inclusive (0 when a > b)."""
    total = 0
    for i in range(a, b + 1):
        total += i
    return total
''', (Bug("off_by_one", "range(a, b + 1)", "range(a, b)"),),
             ((1, 3), (0, 0), (5, 4), (-2, 2)),
             lambda rng: (rng.randint(-10, 10), rng.randint(-10, 30))),
    Template("count_vowels", '''def count_vowels(text):
    """Number of vowels (a, e, i, o, u, either case) in text."""
    count = 0
    for ch in text.lower():
        if ch in "aeiou":
            count += 1
    return count
''', (Bug("missing_edge_case", "text.lower()", "text"),
      Bug("wrong_operator", 'if ch in "aeiou"', 'if ch not in "aeiou"')),
             (("Apple",), ("",), ("rhythm",), ("EDUCATION",)),
             lambda rng: (_capitalised(rng, _text(rng, rng.randint(1, 3))),)),
    Template("max_index", '''def max_index(values):
    """Index of the first largest value, or -1 for an empty list."""
    if not values:
        return -1
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best
''', (Bug("missing_edge_case", "    if not values:\n        return -1\n", ""),
      Bug("wrong_operator", "values[i] > values[best]", "values[i] >= values[best]"),
      Bug("off_by_one", "range(1, len(values))", "range(1, len(values) - 1)")),
             (([],), ([3, 1, 3],), ([1, 2, 5],), ([7],)),
             lambda rng: (_ints(rng, 0, 9, 7, min_len=1),)),
    Template("is_leap", '''def is_leap(year):
    """Whether year is a leap year in the Gregorian calendar."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
''', (Bug("wrong_operator", "(year % 100 != 0 or year % 400 == 0)",
          "(year % 100 != 0 and year % 400 == 0)"),
      Bug("missing_edge_case", "year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
          "year % 4 == 0 and year % 100 != 0")),
             # Two years divisible by 400: random ones are, one draw in 400.
             ((2000,), (1900,), (2024,), (2023,), (2400,)),
             lambda rng: (rng.randint(1600, 2400),)),
    Template("factorial", '''def factorial(n):
    """n! for n >= 0."""
    result = 1
    for i in range(2, n + 1):
        result *= i
    return result
''', (Bug("off_by_one", "range(2, n + 1)", "range(2, n)"),
      Bug("wrong_operator", "result *= i", "result += i")),
             ((0,), (1,), (3,), (5,)),
             lambda rng: (rng.randint(0, 12),)),
    Template("average", '''def average(values):
    """Arithmetic mean of values, or 0.0 for an empty list."""
    if not values:
        return 0.0
    return sum(values) / len(values)
''', (Bug("missing_edge_case", "    if not values:\n        return 0.0\n", ""),
      Bug("wrong_operator", "sum(values) / len(values)", "sum(values) // len(values)")),
             (([],), ([1, 2],), ([4],), ([2, 4, 9],)),
             lambda rng: (_ints(rng, -5, 20, 6, min_len=1),)),
    Template("fizzbuzz", '''def fizzbuzz(n):
    """Fizz for multiples of 3, Buzz for multiples of 5, FizzBuzz for both, else n."""
    if n % 15 == 0:
        return "FizzBuzz"
    if n % 3 == 0:
        return "Fizz"
    if n % 5 == 0:
        return "Buzz"
    return str(n)
''', (Bug("missing_edge_case", '    if n % 15 == 0:\n        return "FizzBuzz"\n', ""),
      Bug("wrong_operator", "n % 5 == 0", "n % 5 != 0")),
             ((15,), (5,), (9,), (7,)),
             lambda rng: (rng.randint(1, 100),)),
    Template("reverse_words", '''def reverse_words(text):
    """The words of text in reverse order, separated by single spaces."""
    return " ".join(reversed(text.split()))
''', (Bug("missing_edge_case", "text.split()", 'text.split(" ")'),),
             (("hello world",), ("  hello   world ",), ("",), ("one",)),
             lambda rng: (_text(rng, rng.randint(1, 4), sep=rng.choice((" ", "  "))),)),
    Template("to_fahrenheit", '''def to_fahrenheit(celsius):
    """Degrees Fahrenheit for a temperature in degrees Celsius."""
    return celsius * 9 / 5 + 32
''', (Bug("wrong_operator", "+ 32", "- 32"),),
             ((0,), (100,), (-40,), (37,)),
             lambda rng: (rng.randint(-50, 150),)),
    Template("median", '''def median(values):
    """Median of a non-empty list (mean of the two middle values for even lengths)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
''', (Bug("missing_edge_case", "ordered = sorted(values)", "ordered = list(values)"),
      Bug("off_by_one", "(ordered[middle - 1] + ordered[middle]) / 2",
          "(ordered[middle] + ordered[middle + 1]) / 2"),
      Bug("wrong_operator", "len(ordered) % 2 == 1", "len(ordered) % 2 == 0")),
             (([3, 1, 2],), ([1, 2, 3, 4],), ([5],), ([4, 8],)),
             lambda rng: (_ints(rng, 0, 20, 7, min_len=1),)),
    Template("chunk", '''def chunk(values, size):
    """values split into consecutive lists of size items (the last may be shorter)."""
    return [values[i:i + size] for i in range(0, len(values), size)]
''', (Bug("off_by_one", "values[i:i + size]", "values[i:i + size - 1]"),),
             (([1, 2, 3, 4, 5], 2), ([], 3), ([1, 2], 5), ([1, 2, 3], 1)),
             lambda rng: (_ints(rng, 0, 9, 8), rng.randint(1, 4))),
    Template("digit_sum", '''def digit_sum(n):
    """Sum of the decimal digits of n (the sign is ignored)."""
    total = 0
    for ch in str(abs(n)):
        total += int(ch)
    return total
''', (Bug("missing_edge_case", "str(abs(n))", "str(n)"),),
             ((-12,), (0,), (9045,), (7,)),
             lambda rng: (rng.randint(-10**6, 10**6),)),
    Template("is_palindrome", '''def is_palindrome(text):
    """Whether text reads the same backwards, ignoring case and non-alphanumerics."""
    letters = [ch.lower() for ch in text if ch.isalnum()]
    return letters == letters[::-1]
''', (Bug("missing_edge_case", "for ch in text if ch.isalnum()]", "for ch in text]"),
      Bug("missing_edge_case", "[ch.lower()", "[ch")),
             # Two cases with punctuation or spaces: random ones (a word, or a word and
             # its reverse) never show the dropped isalnum filter.
             (("Race car",), ("Abba",), ("abc",), ("",), ("No lemon, no melon",)),
             lambda rng: (_palindrome(rng),)),
    Template("dedupe", '''def dedupe(values):
    """values without repeats, keeping the first occurrence of each, in order."""
    seen = set()
    result = []
    for value in values:
        if value not in seen:
            seen.add(value)
            result.append(value)
    return result
''', (Bug("missing_edge_case", "            seen.add(value)\n", ""),
      Bug("wrong_operator", "if value not in seen", "if value in seen")),
             (([1, 1, 2],), ([],), ([3, 2, 3, 1, 2],), ([5],)),
             lambda rng: (_ints(rng, 0, 5, 8),)),
    Template("count_in_range", '''def count_in_range(values, lo, hi):
    """How many of the values v satisfy lo <= v <= hi."""
    return sum(1 for v in values if lo <= v <= hi)
''', (Bug("off_by_one", "if lo <= v <= hi", "if lo <= v < hi"),
      Bug("wrong_value", "sum(1 for", "sum(v for")),
             (([1, 2, 3], 1, 3), ([], 0, 10), ([5, 10, 15], 6, 14), ([4, 4], 4, 4)),
             _range_case),
    Template("running_total", '''def running_total(values):
    """Prefix sums: item i is values[0] + ... + values[i]."""
    totals = []
    total = 0
    for value in values:
        total += value
        totals.append(total)
    return totals
''', (Bug("off_by_one", "        total += value\n        totals.append(total)",
          "        totals.append(total)\n        total += value"),
      Bug("wrong_value", "    total = 0\n", "    total = 1\n")),
             (([1, 2, 3],), ([],), ([5],), ([-1, 1],)),
             lambda rng: (_ints(rng, -5, 10, 7),)),
    Template("clamp", '''def clamp(x, lo, hi):
    """x limited to the interval [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
''', (Bug("wrong_value", "        return hi", "        return lo"),
      Bug("wrong_operator", "if x > hi", "if x < hi")),
             ((12, 0, 10), (5, 0, 10), (-3, 0, 10), (10, 0, 10)),
             lambda rng: (rng.randint(-20, 30), 0, rng.randint(1, 20))),
    Template("is_power_of_two", '''def is_power_of_two(n):
    """Whether n is one of 1, 2, 4, 8, ..."""
    return n > 0 and n & (n - 1) == 0
''', (Bug("missing_edge_case", "n > 0 and n & (n - 1) == 0", "n & (n - 1) == 0"),
      Bug("wrong_value", "(n - 1)", "(n + 1)")),
             ((0,), (4,), (6,), (1,)),
             lambda rng: (rng.randint(-4, 300),)),
    Template("capitalize_words", '''def capitalize_words(text):
    """text with the first letter of every space-separated word upper-cased."""
    return " ".join(word[:1].upper() + word[1:] for word in text.split(" "))
''', (Bug("off_by_one", "word[:1].upper() + word[1:]", "word[:1].upper() + word[2:]"),
      Bug("missing_edge_case", "word[:1].upper()", "word[0].upper()")),
             (("hello world",), ("",), ("a  b",), ("x",)),
             lambda rng: (_text(rng, rng.randint(1, 4)),)),
    Template("last_index", '''def last_index(values, target):
    """Index of the last occurrence of target in values, or -1."""
    for i in range(len(values) - 1, -1, -1):
        if values[i] == target:
            return i
    return -1
''', (Bug("off_by_one", "range(len(values) - 1, -1, -1)", "range(len(values) - 1, 0, -1)"),
      Bug("wrong_value", "    return -1", "    return 0")),
             (([5, 1], 5), ([1, 2, 1], 1), ([], 3), ([4], 3)),
             lambda rng: (_ints(rng, 0, 4, 6), rng.randint(0, 4))),
)
