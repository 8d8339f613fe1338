"""A turn's text, decoded a few tokens at a time, for the engine's stop patterns.

  text = TurnText(detokenize)
  text.extend(turn_tokens)   # after each decode call: the turn so far; -> its text

The engine searches its stop patterns in the turn's text after every decode
call. Decoding the whole turn each time costs O(turn) per call and O(turn^2)
per turn (a 32k-token turn: seconds of host time, `benchmarks/turn_text.py`).
`extend` decodes only what is new, behind a window: with `read` tokens already
in `text` and `window` <= read the tokens decoded last time,

  text += decode(tokens[window:]) minus its prefix decode(tokens[window:read])

which is what a full decode appends for byte-level BPE (bytes concatenate) and
for SentencePiece decoders (their first-token rule, dropping a leading space,
applies to the window's first token in both decodes, so it cancels; at the
turn's start the window is empty, as in a full decode). Tokens whose text ends
in U+FFFD, an incomplete UTF-8 character, wait for the next call, unless more
than `MAX_PENDING` wait (no character spans more bytes; a policy emitting stray
continuation bytes must not grow the window). Invalid bytes are not local: a
SentencePiece byte-fallback decoder turns a whole run of <0xNN> tokens into
U+FFFD when one of them is invalid, rewriting text already read. So a decode
with U+FFFD in it, or one that breaks the prefix rule (decode(window) not a
prefix of decode(window + new)), falls back to one full decode, as the engine
did on every call before: `text` is never wrong, only late by the pending tail,
and only a policy that keeps emitting invalid bytes costs what it did.
tests/sampler/test_turn_text.py checks it against the full decode on random
token streams of both tokenizer kinds.
"""

from __future__ import annotations

from typing import Callable, Sequence

MAX_PENDING = 4  # tokens held back for an incomplete UTF-8 character (<= 3 bytes missing)


class TurnText:
  """The text of a turn's tokens[:read], kept current by `extend` (module docstring)."""

  def __init__(self, detokenize: Callable[[Sequence[int]], str]):
    self._detokenize = detokenize
    self.text = ""
    self._window = 0  # tokens[_window:_read]: decoded last time, the context for what follows
    self._read = 0    # tokens[:_read] are in text

  def extend(self, tokens: Sequence[int]) -> str:
    """The text of `tokens`, which continue the tokens of the previous call."""
    if len(tokens) < self._read:
      raise ValueError(f"TurnText.extend got {len(tokens)} tokens after {self._read}: a turn "
                       "only grows; start a new TurnText for a new turn")
    if len(tokens) == self._read:
      return self.text
    context = self._detokenize(tokens[self._window:self._read]) if self._read else ""
    new = self._detokenize(tokens[self._window:])
    if new.endswith("\ufffd") and len(tokens) - self._read <= MAX_PENDING:
      return self.text
    if "\ufffd" in new or not new.startswith(context):
      self.text = self._detokenize(tokens)  # invalid bytes can rewrite earlier text
    else:
      self.text += new[len(context):]
    self._window, self._read = self._read, len(tokens)
    return self.text
