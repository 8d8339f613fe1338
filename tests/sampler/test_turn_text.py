"""TurnText: each call returns exactly the full decode, for byte-level and SentencePiece-
style decoders, on random and adversarial token streams, decoding each token O(1) times
when the bytes are valid."""

import numpy as np
import pytest
import tokenizers

from sao_jax.sampler.turn_text import TurnText

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


def metaspace() -> tokenizers.Tokenizer:
  """Metaspace's first-token rule (prepend_scheme="always"), byte fallback, added and
  special tokens (decoded with the rest when skip_special_tokens=False)."""
  pieces = ([f"<0x{b:02X}>" for b in range(256)] + ["▁", "▁the", "▁def", "x", "(", "):", "é",
            "▁数", "学", "\n", "▁▁", "py", "thon", "\ufffd", "▁\ufffd"] + list("abcdefghij"))
  vocab = {"<unk>": 0, "<s>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>",
                                                         byte_fallback=True))
  tokenizer.add_special_tokens(["<s>", "</s>"])
  tokenizer.add_tokens(["<tool>", " spaced ", "▁x"])
  tokenizer.decoder = tokenizers.decoders.Sequence([
      tokenizers.decoders.ByteFallback(),
      tokenizers.decoders.Metaspace(replacement="▁", prepend_scheme="always")])
  return tokenizer


def byte_ids(tokenizer: tokenizers.Tokenizer) -> list[int]:
  """The ids of single bytes: <0xNN> pieces, or byte-level BPE's 256 base symbols."""
  pieces = [tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256)]
  if None in pieces:
    pieces = [tokenizer.token_to_id(c) for c in tokenizers.pre_tokenizers.ByteLevel.alphabet()]
  return [p for p in pieces if p is not None]


@pytest.mark.parametrize("skip_special", [False, True])
@pytest.mark.parametrize("make", [byte_level, sentencepiece, metaspace])
@pytest.mark.parametrize("seed", range(24))
def test_every_call_returns_the_full_decode(make, seed, skip_special):
  """Random ids, single bytes (stray, partial and invalid UTF-8, byte-fallback runs) and
  real text's tokens, in calls of 1..9 tokens: each call returns exactly the full
  decode, never a late one (a stop pattern in a held-back tail is seen in that call)."""
  tokenizer = make()
  decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=skip_special)
  rng = np.random.default_rng(seed)
  vocab, singles = tokenizer.get_vocab_size(with_added_tokens=True), byte_ids(tokenizer)
  real = [i for text in TEXTS for i in tokenizer.encode(text).ids]
  pick = lambda r: (int(rng.choice(singles)) if r < 0.3 else int(rng.integers(vocab)) if r < 0.6
                    else real[int(rng.integers(len(real)))])
  stream = [pick(rng.random()) for _ in range(150)]
  turn = TurnText(decode)
  n = 0
  while n < len(stream):
    n = min(len(stream), n + int(rng.integers(1, 10)))
    assert turn.extend(stream[:n]) == decode(stream[:n]), n


def test_a_stop_pattern_before_an_incomplete_character_is_seen_in_that_call():
  """The old TurnText held back a whole call of <= MAX_PENDING tokens whose text ended in
  an incomplete character, "</tool>" in it included: the engine saw it a call late."""
  tokenizer = byte_level()
  decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
  head, tail = tokenizer.encode("ok ").ids, tokenizer.encode("</tool>").ids
  euro = tokenizer.encode("€").ids
  assert len(euro) == 3  # three byte tokens: the first alone is an incomplete character
  turn = TurnText(decode)
  turn.extend(head)
  # One call of at most MAX_PENDING tokens: the pattern's last token, then a lead byte.
  tokens = head + tail[:-1]
  turn.extend(tokens)
  tokens = tokens + tail[-1:] + euro[:1]
  assert turn.extend(tokens) == decode(tokens)
  assert "</tool>" in turn.extend(tokens)


def test_a_byte_fallback_run_made_invalid_stays_invalid():
  """One invalid byte makes its whole <0xNN> run U+FFFD, also valid bytes that follow in
  later calls: the old TurnText appended them as text ('AAAAAB'), which the full decode
  never shows (a stop pattern spelled in bytes would match there and nowhere else)."""
  tokenizer = sentencepiece()
  decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
  byte = lambda b: tokenizer.token_to_id(f"<0x{b:02X}>")
  x = tokenizer.token_to_id("x")
  turn = TurnText(decode)
  tokens = []
  for call in ([x] * 4 + [byte(0xFF)], [byte(0x41)] * 5, [byte(0x42)]):
    tokens += call
    assert turn.extend(tokens) == decode(tokens)
  assert "B" not in turn.extend(tokens)


def byte_tokens(tokenizer: tokenizers.Tokenizer) -> dict[int, int]:
  """byte -> the id of the token that is that byte alone."""
  if tokenizer.token_to_id("<0x41>") is not None:
    return {b: tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256)}
  # Byte-level BPE spells byte b as GPT-2's printable stand-in for it.
  printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
  stand_in = dict(zip(printable, printable))
  stand_in.update((b, 256 + k) for k, b in enumerate(b for b in range(256) if b not in stand_in))
  return {b: tokenizer.token_to_id(chr(c)) for b, c in stand_in.items()}


@pytest.mark.parametrize("make", [byte_level, sentencepiece])
@pytest.mark.parametrize("seed", range(30))
def test_text_spelled_in_bytes_with_invalid_bytes_is_the_full_decode(make, seed):
  """Every character as byte tokens: one byte-fallback run across the whole turn, with
  characters split at call boundaries, U+FFFD written as a character (which must not
  hide the run turning invalid) and a few invalid bytes that rewrite it."""
  tokenizer = make()
  decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
  rng = np.random.default_rng(seed)
  data = bytearray("".join(rng.choice(list("aé中😀 \ufffd\n▁"), 150)).encode())
  for _ in range(int(rng.integers(0, 3))):
    data.insert(int(rng.integers(len(data))), int(rng.choice([0xFF, 0x80, 0xE4])))
  ids = byte_tokens(tokenizer)
  stream = [ids[b] for b in data]
  turn = TurnText(decode)
  n = 0
  while n < len(stream):
    n = min(len(stream), n + int(rng.integers(1, 12)))
    assert turn.extend(stream[:n]) == decode(stream[:n]), n


@pytest.mark.parametrize("text", ["ხ😺∑ " * 60, "ok \ufffd then " * 60])
def test_valid_text_decodes_each_token_a_bounded_number_of_times(text):
  """Characters split across tokens (byte-level BPE spells rare ones in bytes) at call
  boundaries, or U+FFFD written as a character, in calls of 8 (steps_per_call's default):
  the old TurnText fell back to a full decode at each, quadratic again."""
  tokenizer = byte_level()
  decoded = []
  def decode(ids):
    decoded.append(len(ids))
    return tokenizer.decode(list(ids), skip_special_tokens=False)
  stream = tokenizer.encode(text).ids
  assert len(stream) > 500
  turn = TurnText(decode)
  for n in range(8, len(stream) + 8, 8):
    turn.extend(stream[:n])
  assert turn.extend(stream) == tokenizer.decode(stream)
  assert sum(decoded) <= 8 * len(stream), (sum(decoded), len(stream))


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
