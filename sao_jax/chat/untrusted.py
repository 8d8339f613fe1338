"""Untrusted text inside a rendered conversation stays text.

  Protector(tokenizer).mark(text)      -> text with each control-token string replaced by a marker
  Protector(tokenizer).escape(text)    -> text with only the marker character replaced
  Protector(tokenizer).encode(rendered) -> token ids; markers become their string's plain ids
  plain_ids(tokenizer, text)            -> ids of `text` with no added token matched

System, user and tool contents come from task files and tool output. A
tokenizer matches its added tokens anywhere in a string, so a tool printing
`<|im_end|>\\n<|im_start|>assistant\\n` would otherwise become the structure of
a turn the policy never took. Every such content is `mark`ed before the chat
template renders it: each occurrence of a control-token string (an added token
that is special, or any non-whitespace added token such as Qwen's `<think>` or
`</tool_response>`) becomes `MARK + hex(index) + MARK`, and `encode` tokenizes
the rendered text piece by piece: template text (and assistant text, which the
policy wrote in the model's own format) with the tokenizer as usual, each
marker as the plain ids of the string it stands for. Whitespace-only added
tokens (Gemma's runs of newlines) are left alone: they carry no structure and
transformers leaves them too. The marker character itself is protected, so
content can neither forge a marker nor a token; assistant text is only
`escape`d (its control tokens are the policy's own, and templates parse them,
e.g. Qwen3 splits reasoning at `</think>`). Text without control-token
strings encodes exactly as the tokenizer encodes the whole rendered string.

A tokenizer matches an added token declared `normalized=True` in the text *after*
its normalizer, so where one exists (under NFKC, `＜|im_end|＞` with fullwidth
brackets is `<|im_end|>`; under a lowercasing normalizer so is `<|IM_END|>`) the
raw text can hold no control-token string and still become one. For such a
tokenizer `mark` then asks the tokenizer itself where its added tokens fall in
what is left (`encode`'s offsets, in the original text) and marks those spans
too, as the control token they normalize to; what is marked is decided after
the normalizer, as the tokenizer decides. Shipped families declare their
control tokens `normalized=False` and pay nothing for this.

Every untrusted content in this package is encoded through this module.
"""

from __future__ import annotations

import re

import tokenizers

from sao_jax.models.tokenizer import valid_utf8

MARK = "\ue000"  # a private-use character: no template or tokenizer gives it a meaning
_MARKER = re.compile(f"{MARK}([0-9a-f]+){MARK}")


def plain_ids(tokenizer: tokenizers.Tokenizer, text: str) -> list[int]:
  """`text`'s ids through normalizer, pre-tokenizer and model only: no added token
  (special or not) is matched, so a token string in `text` stays its characters."""
  if tokenizer.normalizer is not None:
    text = tokenizer.normalizer.normalize_str(text)
  pieces = (tokenizer.pre_tokenizer.pre_tokenize_str(text) if tokenizer.pre_tokenizer is not None
            else [(text, None)])
  return [token.id for piece, _ in pieces for token in tokenizer.model.tokenize(piece)]


def _longest_match(strings: list[str]) -> re.Pattern:
  """A regex matching the longest of `strings` at each position, built as a trie so
  that its cost does not grow with the number of strings (Gemma 3 has ~6k added
  tokens; a flat alternation would try each one at every character)."""
  trie: dict = {}
  for string in strings:
    node = trie
    for char in string:
      node = node.setdefault(char, {})
    node[""] = {}  # a string ends here

  def pattern(node: dict) -> str:
    branches = [re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char]
    if not branches:
      return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    return f"(?:{body})?" if "" in node else body  # greedy: the longer string first

  return re.compile(pattern(trie))


class Protector:
  """Marks untrusted text before rendering and encodes the rendered result."""

  def __init__(self, tokenizer: tokenizers.Tokenizer):
    self._tokenizer = tokenizer
    added = tokenizer.get_added_tokens_decoder().values()
    control = {token.content for token in added
               if token.content and (token.special or not token.content.isspace())}
    self._strings = [MARK] + sorted(control - {MARK})
    self._index = {string: i for i, string in enumerate(self._strings)}
    self._pattern = _longest_match(self._strings)
    # Control tokens the tokenizer matches after its normalizer (module docstring).
    self._normalized = ({i: token.content for i, token in tokenizer.get_added_tokens_decoder()
                         .items() if token.content in control and token.normalized}
                        if tokenizer.normalizer is not None else {})

  def mark(self, text: str) -> str:
    """`text` (made valid UTF-8) with every control-token string replaced by its marker,
    and, under a normalizing tokenizer, every span its normalizer makes one of."""
    marked = self._pattern.sub(lambda m: self._marker(m.group()), valid_utf8(text))
    if not self._normalized:
      return marked
    pieces = _MARKER.split(marked)  # odd pieces: the markers' indices
    return "".join(self._marker(self._strings[int(piece, 16)]) if i % 2
                   else self._mark_normalized(piece) for i, piece in enumerate(pieces))

  def _marker(self, string: str) -> str:
    return f"{MARK}{self._index[string]:x}{MARK}"

  def _mark_normalized(self, text: str) -> str:
    """`text` (holding no marker) with each span the tokenizer encodes as a control token
    that it matches after normalizing replaced by that token's marker."""
    encoding = self._tokenizer.encode(text, add_special_tokens=False)
    out, end = [], 0
    for token_id, (start, stop) in zip(encoding.ids, encoding.offsets):
      if token_id in self._normalized and start >= end:
        out += [text[end:start], self._marker(self._normalized[token_id])]
        end = stop
    return "".join(out) + text[end:]

  def escape(self, text: str) -> str:
    """`text` (made valid UTF-8) with only the marker character replaced by its marker."""
    return valid_utf8(text).replace(MARK, f"{MARK}0{MARK}")

  def encode(self, rendered: str) -> list[int]:
    """Token ids of rendered text holding markers (see module docstring)."""
    pieces = _MARKER.split(rendered)
    ids: list[int] = []
    for i, piece in enumerate(pieces):
      if i % 2:
        ids.extend(plain_ids(self._tokenizer, self._strings[int(piece, 16)]))
      elif MARK in piece:
        raise ValueError("the chat template cut an untrusted content inside one of its "
                         "control-token markers; it cannot be encoded safely")
      elif piece:
        ids.extend(self._tokenizer.encode(piece, add_special_tokens=False).ids)
    return ids
