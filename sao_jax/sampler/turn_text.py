"""A turn's text, decoded a few tokens at a time, for the engine's stop patterns.

  text = TurnText(detokenize)
  text.extend(turn_tokens)   # after each decode call: the turn so far; -> detokenize(turn_tokens)

The engine searches its stop patterns in the turn's text after every decode
call. Decoding the whole turn each time costs O(turn) per call and O(turn^2)
per turn (a 32k-token turn: seconds of host time, `benchmarks/turn_text.py`).
`extend` returns exactly what `detokenize(turn_tokens)` returns, but decodes
only a few recent tokens per call. It keeps `text`, the decode of the turn's
first `read` tokens, and marks: token counts `c` with the offset where the
decode of tokens[:c] ends in `text`. A call decodes from an anchor mark `a`
(the latest before `read` first):

  text += decode(tokens[a:]) minus its prefix decode(tokens[a:read])

which is what a full decode appends when the cut at `a` is clean. Decoders
are local except at a few places, each checked, not assumed:
- a first-token rule (SentencePiece's Metaspace or Strip drop the leading
  space of the first token): it applies to the anchor's token in both decodes
  and cancels; so decode(tokens[a:read]) may lack only leading whitespace of
  what `text` holds after mark `a`, nothing else;
- a character split across tokens: byte-level BPE decodes an incomplete UTF-8
  tail as U+FFFD. Up to `MAX_PENDING` trailing tokens whose text ends in U+FFFD
  stay out of `text` (a character has at most 4 bytes): their text is added to
  the returned string only, so no mark falls inside a character;
- a byte-fallback run (SentencePiece's <0xNN> tokens) is decoded as a whole:
  one invalid byte turns every token of the run into U+FFFD, also tokens
  already in `text`, and a run that was invalid stays so when valid bytes
  follow. Either shows as decode(tokens[a:read]) differing from what `text`
  holds after mark `a`, or decode(tokens[a:]) not starting with it.
An anchor that fails a check is replaced by an older mark (one, two, four...
marks back, so the search costs O(log) decodes plus the length it reaches
back), down to the turn's start, where the full decode is taken as it is and
the marks are reset. So the text is never wrong or late, a valid stream costs
O(new tokens + window) per call whatever characters it holds (U+FFFD itself
included), and only invalid bytes make a call reach back, to the start of
their byte-fallback run at most (one full decode, as every call did before).
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
    self._marks = [(0, 0)]  # (c, offset): text[:offset] == detokenize(tokens[:c]), c <= read
    self._last = (0, "")    # (len(tokens), what extend returned) of the previous call

  def extend(self, tokens: Sequence[int]) -> str:
    """detokenize(tokens), for `tokens` that continue the tokens of the previous call."""
    n = len(tokens)
    if n < self._last[0]:
      raise ValueError(f"TurnText.extend got {n} tokens after {self._last[0]}: a turn "
                       "only grows; start a new TurnText for a new turn")
    if n == self._last[0]:
      return self._last[1]
    for step in self._anchor_steps():
      anchor, offset = self._marks[-1 - step] if step < len(self._marks) else self._marks[0]
      full = self._from_anchor(tokens, anchor, offset, rewrite=anchor == 0)
      if full is not None:
        break
    self._last = (n, full)
    return full

  def _anchor_steps(self):
    """How many marks back each try anchors: 1, 2, 4, ... then the turn's start."""
    step = 1
    while step < len(self._marks) - 1:
      yield step
      step *= 2
    yield len(self._marks) - 1

  def _from_anchor(self, tokens: Sequence[int], anchor: int, offset: int, *,
                   rewrite: bool) -> str | None:
    """Commits tokens decoded from mark `anchor` if its cut is clean (module docstring)
    and returns the decode of all `tokens`; None if the cut is not clean. At the
    turn's start (`rewrite`) the full decode is right by definition."""
    n, read = len(tokens), self._read
    context = self._detokenize(tokens[anchor:read]) if read > anchor else ""
    held = self.text[offset:]
    new = self._detokenize(tokens[anchor:])
    # What the anchor's tokens decode to may lack only the leading whitespace a
    # first-token rule drops, and only when something is left to show whether the new
    # tokens rewrote them (a lone space byte, stripped, would hide its run turning
    # U+FFFD); the new tokens must leave it as it was.
    dropped = held[:len(held) - len(context)]
    clean = (held.endswith(context) and (not dropped or (context and not dropped.strip()))
             and new.startswith(context))
    if not clean:
      if not rewrite:
        return None
      context, read = "", 0  # the turn's start: the full decode replaces the text
      self.text, self._read, self._marks = "", 0, [(0, 0)]
    commit, part = n, new
    if new.endswith("\ufffd"):  # maybe an incomplete character: hold its tokens back
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
      self._marks.append((commit, len(self.text)))
    return base + new[len(context):]
