"""Plain data with exact types, as JSON: how call arguments and returned values cross
the grading sandbox's boundary.

`encode(value)` maps a value built only from None, bool, int, float, str, list,
tuple and dict (str keys) to a JSON-able tagged form, `[type, payload]`, checking
the *exact* type (`type(x) is int`, so a bool is never an int, and a subclass
with an `__eq__` that always holds is rejected); anything else raises
`TypeError`. `decode` inverts it. Two values are the same exactly when their
encodings are equal (floats compare by value, so 0.0 == -0.0 and NaN never
matches). This file is also sent verbatim into the grading sandbox, so it
imports nothing.
"""

MAX_DEPTH = 20
_ATOMS = {type(None): "none", bool: "bool", int: "int", float: "float", str: "str"}


def encode(value, depth=0):
  """The tagged form of `value` (see the module docstring)."""
  if depth > MAX_DEPTH:
    raise TypeError(f"value nested deeper than {MAX_DEPTH}")
  kind = type(value)
  if kind in _ATOMS:
    return [_ATOMS[kind], value]
  if kind is list or kind is tuple:
    return ["list" if kind is list else "tuple", [encode(v, depth + 1) for v in value]]
  if kind is dict:
    if any(type(k) is not str for k in value):
      raise TypeError("dict keys must be str")
    return ["dict", [[k, encode(v, depth + 1)] for k, v in value.items()]]
  raise TypeError(f"values of type {kind.__name__} cannot be graded")


def decode(tagged, depth=0):
  """The value whose `encode` is `tagged`; TypeError if `tagged` is malformed."""
  if depth > MAX_DEPTH or type(tagged) is not list or len(tagged) != 2:
    raise TypeError("malformed value")
  kind, payload = tagged
  atom_types = {name: t for t, name in _ATOMS.items()}
  if kind in atom_types:
    if type(payload) is not atom_types[kind] and not (kind == "none" and payload is None):
      raise TypeError(f"malformed {kind}")
    return payload
  if kind in ("list", "tuple") and type(payload) is list:
    items = [decode(v, depth + 1) for v in payload]
    return items if kind == "list" else tuple(items)
  if kind == "dict" and type(payload) is list:
    if any(type(p) is not list or len(p) != 2 or type(p[0]) is not str for p in payload):
      raise TypeError("malformed dict")
    return {k: decode(v, depth + 1) for k, v in payload}
  raise TypeError(f"malformed value of kind {kind!r}")
