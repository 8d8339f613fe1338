"""TurnText: the incremental decode equals the full one (late only by an incomplete
character), for byte-level and SentencePiece-style decoders, on random token streams."""

import numpy as np
import pytest
import tokenizers

from sao_jax.sampler.turn_text import MAX_PENDING, TurnText

TEXTS = ["def f(x):\n    return x + 1\n", "naïve café — 数学 ✓ 😀 done", "```python\nprint(1)\n```"]


def byte_level() -> tokenizers.Tokenizer:
  """Qwen/Llama-3 style: byte-level BPE; its vocabulary holds every single byte."""
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=400, special_tokens=["<|im_end|>"], show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tokenizer.train_from_iterator(TEXTS * 20, trainer)
  return tokenizer


def sentencepiece() -> tokenizers.Tokenizer:
  """Llama-2/Mistral style: '▁' for spaces, <0xNN> byte fallback, the leading space stripped."""
  pieces = ([f"<0x{b:02X}>" for b in range(256)] + ["▁", "▁the", "▁def", "x", "(", "):", "é", "▁数",
            "学", "\n", "```", "py", "thon"] + list("abcdefghij"))
  vocab = {"<unk>": 0, **{p: i + 1 for i, p in enumerate(pieces)}}
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>",
                                                         byte_fallback=True))
  tokenizer.decoder = tokenizers.decoders.Sequence([
      tokenizers.decoders.Replace("▁", " "), tokenizers.decoders.ByteFallback(),
      tokenizers.decoders.Fuse(), tokenizers.decoders.Strip(" ", 1, 0)])
  return tokenizer


@pytest.mark.parametrize("make", [byte_level, sentencepiece])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_text_is_the_full_decode(make, seed):
  tokenizer = make()
  decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
  rng = np.random.default_rng(seed)
  vocab = tokenizer.get_vocab_size()
  # Random ids (stray and partial UTF-8 bytes included) mixed with real text's tokens.
  real = [i for text in TEXTS for i in tokenizer.encode(text).ids]
  stream = [int(rng.integers(vocab)) if rng.random() < 0.4 else real[int(rng.integers(len(real)))]
            for _ in range(400)]
  turn = TurnText(decode)
  n = 0
  while n < len(stream):
    n = min(len(stream), n + int(rng.integers(1, 9)))
    text = turn.extend(stream[:n])
    assert any(text == decode(stream[:k]) for k in range(max(0, n - MAX_PENDING), n + 1)), n
  # A stream that ends on a complete character is all in the text.
  tail = tokenizer.encode(" done").ids
  assert turn.extend(stream + tail) == decode(stream + tail)


def test_decodes_each_token_a_bounded_number_of_times():
  """The old check decoded the whole turn after every call: 50k token decodes for this
  1,000-token turn in calls of 4; the window keeps it linear."""
  decoded = []
  def decode(ids):
    decoded.append(len(ids))
    return "".join(chr(97 + i % 26) for i in ids)
  turn = TurnText(decode)
  for n in range(4, 1001, 4):
    turn.extend(list(range(n)))
  assert turn.text == decode(range(1000))
  assert sum(decoded) <= 4 * 1000 * 2, sum(decoded)


def test_a_shrinking_turn_is_refused():
  turn = TurnText(lambda ids: "x" * len(ids))
  turn.extend([1, 2, 3])
  with pytest.raises(ValueError, match="a turn only grows"):
    turn.extend([1, 2])
