"""A turn's text, decoded a few tokens at a time, for the engine's stop patterns.

  text = TurnText(detokenize)
  text.extend(turn_tokens)   # after each decode call: the turn so far; -> detokenize(turn_tokens)

The engine searches its stop patterns in the turn's text after every decode
call. Decoding the whole turn each time costs O(turn) per call and O(turn^2)
per turn (a 32k-token turn: seconds of host time, `benchmarks/turn_text.py`).
`extend` returns exactly what `detokenize(turn_tokens)` returns, but decodes
only a few recent tokens per call. It keeps `text`, the decode of the turn's
first `read` tokens, and marks: token counts `c` whose decode does not end in
U+FFFD (so `c` is not inside a character or an invalid byte run), with where
that decode ends in `text`. A call decodes from an anchor mark `a` < `read`:

  text += decode(tokens[a:]) minus its prefix decode(tokens[a:read])

which is what a full decode appends when the cut at `a` is clean. Decoders
are local except at a few places, each checked, not assumed:
- a first-token rule (SentencePiece's Metaspace or Strip drop the leading
  space of the first token) applies to the anchor's token in both decodes and
  cancels; decode(tokens[a:read]) may lack only leading whitespace of what
  `text` holds after the mark;
- a character split across tokens (byte-level BPE decodes an incomplete UTF-8
  tail as U+FFFD): up to `MAX_PENDING` trailing tokens whose text ends in
  U+FFFD stay out of `text`; their text is in the returned string only;
- a byte-fallback run (SentencePiece's <0xNN> tokens) decodes as a whole: one
  invalid byte turns every token of the run into U+FFFD, tokens already in
  `text` included. A run through the mark starts valid (the mark's rule), so
  a rewrite turns the first character of decode(tokens[a:read]) into U+FFFD:
  that character must exist and not be U+FFFD already.
An anchor that fails a check is replaced by an older mark (2, 4, 8... back
while they span at most a quarter of the turn), then by the turn's start,
where the full decode is taken as it is. So the text is never wrong or late,
valid text costs O(new tokens + window) per call whatever characters it holds
(split ones, U+FFFD written as a character), and a call costs one full decode,
as every call did before, only when a byte-fallback run through its anchor
changes: invalid bytes, or a run of <0xNN> tokens still open at the call's
end. Not covered: a decoder that fuses tokens before a first-token rule that
acts past the token's start (Metaspace after ByteFallback drops every U+2581
of the fused first run); current LLM tokenizers replace U+2581 first.
tests/sampler/test_turn_text.py checks it against the full decode on random
and adversarial token streams of both tokenizer kinds.
"""

from __future__ import annotations

from typing import Callable, Sequence

MAX_PENDING = 4  # trailing tokens held out of `text` for an incomplete UTF-8 character


class TurnText:
  """`extend(tokens)` == detokenize(tokens) for a growing turn (module docstring)."""

  def __init__(self, detokenize: Callable[[Sequence[int]], str]):
    self._detokenize = detokenize
    self.text = ""  # detokenize(tokens[:read])
    self._read = 0
    # (c, offset), c <= read: text[:offset] == detokenize(tokens[:c]), which does not end
    # in U+FFFD (a cut there is not inside a character, nor inside a byte run already
    # invalid).
    self._marks = [(0, 0)]
    self._last = (0, "")  # (len(tokens), what extend returned) of the previous call

  def extend(self, tokens: Sequence[int]) -> str:
    """detokenize(tokens), for `tokens` that continue the tokens of the previous call."""
    n = len(tokens)
    if n < self._last[0]:
      raise ValueError(f"TurnText.extend got {n} tokens after {self._last[0]}: a turn "
                       "only grows; start a new TurnText for a new turn")
    if n == self._last[0]:
      return self._last[1]
    for anchor, offset in self._anchors(n):
      full = self._from_anchor(tokens, anchor, offset)
      if full is not None:
        break
    self._last = (n, full)
    return full

  def _anchors(self, n: int):
    """The marks before `read` to try, latest first, then 2, 4, 8... back while they span
    at most a quarter of the turn (beyond that one full decode is cheaper than the
    tries), then the turn's start."""
    marks = [mark for mark in self._marks[-64:] if 0 < mark[0] < self._read]
    back, span = 1, max(64, n // 4)
    while back <= len(marks) and n - marks[-back][0] <= span:
      yield marks[-back]
      back *= 2
    yield self._marks[0]

  def _from_anchor(self, tokens: Sequence[int], anchor: int, offset: int) -> str | None:
    """Commits tokens decoded from mark `anchor` if its cut is clean (module docstring)
    and returns the decode of all `tokens`; None if the cut is not clean. From the
    turn's start (anchor 0) the full decode is right by definition."""
    n, read = len(tokens), self._read
    # text is the decode of tokens[:read]: from the turn's start it needs no decode.
    context = self._detokenize(tokens[anchor:read]) if anchor else self.text
    held = self.text[offset:]
    # What the anchor's tokens decode to may lack only the leading whitespace a
    # first-token rule drops. Its first character must show whether the new tokens
    # rewrote a byte run through the anchor: such a rewrite turns it into U+FFFD, so it
    # must exist (a lone space byte, stripped, would hide the rewrite) and not be
    # U+FFFD already (the character written as bytes).
    if anchor and not (context and not context.startswith("\ufffd") and held.endswith(context)
                       and not held[:len(held) - len(context)].strip()):
      return None
    new = self._detokenize(tokens[anchor:])
    if not new.startswith(context):
      if anchor:
        return None
      context, read = "", 0  # the turn's start: the full decode replaces the text
      self.text, self._read, self._marks = "", 0, [(0, 0)]
    commit, part = n, new
    # Maybe an incomplete character: hold its tokens back, so that the next call can
    # anchor here. Not from the start of a long turn: each try would be a full decode.
    if new.endswith("\ufffd") and (anchor or n <= 64):
      for cut in range(n - 1, max(read, n - MAX_PENDING) - 1, -1):
        part = self._detokenize(tokens[anchor:cut]) if cut > anchor else ""
        if not part.endswith("\ufffd") and part.startswith(context):
          commit = cut
          break
      else:
        commit, part = n, new  # no character spans this many tokens: the bytes are invalid
    base = self.text
    self.text = base + part[len(context):]
    if commit > read:
      self._read = commit
      if not self.text.endswith("\ufffd"):
        self._marks.append((commit, len(self.text)))
    return base + new[len(context):]
