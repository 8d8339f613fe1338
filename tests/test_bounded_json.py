"""JSON from untrusted bytes: size and depth caps checked without recursion."""

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
