"""Host cost of the engine's stop-pattern check over a long turn.

  .venv/bin/python benchmarks/turn_text.py [--tokens 4096 32768 --steps-per-call 8]

After every decode call (`steps_per_call` tokens) the engine searches its stop
patterns (here the default, `PYTHON_TOOL_CALL`) in the turn's text. The
reference decodes the whole turn each time, as the engine did before
`sao_jax.sampler.turn_text`; ours extends a `TurnText`. The turn is prose that
opens no code block, so no call stops it early: the worst case for a long
reasoning turn. The tokenizer is a byte-level BPE trained on that prose
(`sao_jax.models.tokenizer.train_tokenizer`, vocabulary 2,000). Prints the
seconds per turn for both and their ratio; the last line is
`RESULT {json}` with `speedup_at_<tokens>` for each length.
"""

from __future__ import annotations

import argparse
import json
import re
import time

from sao_jax.config.sampler import PYTHON_TOOL_CALL
from sao_jax.models.tokenizer import train_tokenizer
from sao_jax.sampler.turn_text import TurnText

PROSE = ("Let me think about the problem step by step. The function returns x + 1, so "
         "for the input 41 the answer is 42; I should check the edge case where the list "
         "is empty before I call the tool. ")


def seconds(check, tokens: list[int], steps_per_call: int) -> float:
  start = time.perf_counter()
  for n in range(steps_per_call, len(tokens) + 1, steps_per_call):
    assert not check(tokens[:n]), "the prose must not match the stop pattern"
  return time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 32768])
  parser.add_argument("--steps-per-call", "--steps_per_call", dest="steps_per_call", type=int,
                      default=8, help="decode calls of this many tokens (old spelling kept)")
  args = parser.parse_args()
  tokenizer = train_tokenizer([PROSE] * 50, vocab_size=2000)
  decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
  pattern = re.compile(PYTHON_TOOL_CALL, re.DOTALL)
  prose = tokenizer.encode(PROSE).ids
  result = {"name": "turn_text", "steps_per_call": args.steps_per_call}
  for length in args.tokens:
    tokens = (prose * (length // len(prose) + 1))[:length]
    theirs = seconds(lambda turn: pattern.search(decode(turn)), tokens, args.steps_per_call)
    text = TurnText(decode)
    ours = seconds(lambda turn: pattern.search(text.extend(turn)), tokens, args.steps_per_call)
    assert text.text == decode(tokens)
    print(f"{length:6d} tokens: full decode per call {theirs:7.3f} s   TurnText {ours:7.3f} s   "
          f"speedup {theirs / ours:6.1f}x", flush=True)
    result.update({f"reference_s_at_{length}": round(theirs, 3), f"s_at_{length}": round(ours, 4),
                   f"speedup_at_{length}": round(theirs / ours, 1)})
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
