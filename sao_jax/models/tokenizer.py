"""Tokenizer (Hugging Face `tokenizers`) and the ChatML special tokens.

  load_tokenizer(path)                                   -> tokenizers.Tokenizer
  train_tokenizer(texts, vocab_size)                     -> tokenizers.Tokenizer (tiny, local)
  valid_utf8(text)                                       -> text the tokenizer accepts

How conversations are rendered (the checkpoint's chat template, or ChatML for
the tokenizers `train_tokenizer` makes) is `sao_jax.chat`.

Untrusted message content (a tool's output, a file, a prompt) is encoded with
every control-token string in it as the ordinary tokens that spell it, so it
cannot forge turn boundaries or roles: `sao_jax.chat.untrusted`.

Text is forced to valid UTF-8 before encoding (`valid_utf8`): a Python string
can hold lone surrogates (a file name with undecodable bytes as `os.listdir`
returns it, a tool's output), which the tokenizer rejects; each becomes U+FFFD.
"""

from __future__ import annotations

import pathlib
from typing import Iterable

import tokenizers

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# Beside a tokenizer.json, where transformers (>= 4.43) reads and writes a chat template,
# and the config that may hold one instead (`chat_template`) with the special tokens.
TEMPLATE_FILE, TOKENIZER_CONFIG = "chat_template.jinja", "tokenizer_config.json"


def load_tokenizer(path: str | pathlib.Path) -> tokenizers.Tokenizer:
  """Loads `tokenizer.json` from a file or a model directory."""
  path = pathlib.Path(path)
  file = path / "tokenizer.json" if path.is_dir() else path
  if not file.is_file():
    raise FileNotFoundError(f"{str(file)!r} not found; pass a tokenizer.json or a directory holding one")
  try:
    return tokenizers.Tokenizer.from_file(str(file))
  except Exception as error:  # tokenizers raises a bare Exception for a file it cannot parse
    raise ValueError(f"{str(file)!r} is not a tokenizer.json the tokenizers library reads "
                     f"({error}); pass the tokenizer.json of a Hugging Face model directory"
                     ) from error


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> tokenizers.Tokenizer:
  """A byte-level BPE tokenizer trained on `texts`, with Qwen's chat special tokens.

  For runs that start from scratch without a hub (the CPU demo, tests): every
  byte is in the base alphabet, so any text encodes.
  """
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[END_OF_TEXT, IM_START, IM_END],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tokenizer.train_from_iterator(texts, trainer)
  return tokenizer


def valid_utf8(text: str) -> str:
  """`text` with every lone surrogate replaced by U+FFFD (a valid pair, which
  UTF-8 cannot hold either, becomes the character it encodes)."""
  try:
    text.encode("utf-8")
    return text
  except UnicodeEncodeError:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
