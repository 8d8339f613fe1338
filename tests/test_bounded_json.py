"""JSON from untrusted bytes: size and depth caps checked without recursion."""

import time

import pytest

from sao_jax import bounded_json


def test_depth_ignores_brackets_inside_strings():
  assert bounded_json.depth(b'{"a": [1, {"b": "]]]["}], "c": "\\"[["}') == 3
  assert bounded_json.depth(b"7") == 0


def test_parses_within_the_caps():
  assert bounded_json.loads(b'{"a": [1, 2]}', max_bytes=100, max_depth=2, what="x") == {
      "a": [1, 2]}


@pytest.mark.parametrize("data, message", [
    (b"[" * 100_000 + b"]" * 100_000, "nested 100000 deep, more than the 8 allowed"),
    (b'"' + b"a" * 200 + b'"', "202 bytes of JSON, more than the 100 allowed"),
    (b"{nope", "not JSON"),
    (b'"\xff"', "not JSON"),
])
def test_violations_are_value_errors_naming_what(data, message):
  with pytest.raises(ValueError, match=f"reply: .*{message}"):
    bounded_json.loads(data, max_bytes=max(100, len(data)) if b"[" in data else 100,
                       max_depth=8, what="reply")


def test_utf16_json_cannot_hide_its_nesting_from_the_depth_cap():
  # U+2200 is bytes 00 22 in UTF-16-LE: the byte scan took it for a quote, blanked the
  # brackets up to the next one, and json.loads (which accepts UTF-16) recursed
  # 100 000 deep: RecursionError, not ValueError, out of a peer's record metadata.
  text = '["\u2200", ' + "[" * 100_000 + "]" * 100_000 + ', "\u2200"]'
  with pytest.raises(ValueError, match="meta: not JSON"):
    bounded_json.loads(text.encode("utf-16-le"), max_bytes=1 << 20, max_depth=16, what="meta")


def test_quotes_that_never_close_cost_linear_time():
  # Each escaped quote was a new string start scanned to the end: 80 KB took ~40 s, the
  # 1 MB a peer's record metadata may hold would have taken hours of the learner.
  data = b'"' + b'\\"' * 40_000
  start = time.monotonic()
  with pytest.raises(ValueError, match="meta: not JSON"):
    bounded_json.loads(data, max_bytes=1 << 20, max_depth=16, what="meta")
  assert time.monotonic() - start < 1.0
  assert bounded_json.depth(b'[["a]]]"]]') == 2 and bounded_json.depth(b'["open [[[[') == 1
