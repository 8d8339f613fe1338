"""Tokenizer (Hugging Face `tokenizers`) and the Qwen chat template.

  load_tokenizer(path)                                   -> tokenizers.Tokenizer
  train_tokenizer(texts, vocab_size)                     -> tokenizers.Tokenizer (tiny, local)
  encode_chat(tokenizer, messages, add_generation_prompt=False)
                                                         -> (tokens_T, action_mask_T)

Qwen's ChatML template renders each message as
  <|im_start|>{role}\n{content}<|im_end|>\n
and a generation prompt as `<|im_start|>assistant\n`. The plain template is
used: no system-prompt injection, tool schemas or `<think>` handling.

Action mask: 1 on tokens the policy emits, 0 on observations. The policy emits
an assistant message's content and the `<|im_end|>` that closes it (sampling
stops on that token, so the sampler records it as an action and the policy must
be credited for ending its turn). Everything else - system and user messages,
tool outputs, and the template glue `<|im_start|>assistant\n` and the newline
after `<|im_end|>` - is observation. Each piece is encoded separately, so the
mask boundaries are exact and the ids equal what the sampler appends turn by
turn.

Message content is encoded as plain text (`encode_plain`): a special token's
string inside it ("<|im_end|>" in a tool's output, a file, a prompt) becomes
the ordinary tokens that spell it, never the special token, so text the
environment or the policy's tool code produced cannot forge turn boundaries or
roles. Only the template's own glue carries special tokens.

Text is forced to valid UTF-8 before encoding (`valid_utf8`): a Python string
can hold lone surrogates (a file name with undecodable bytes as `os.listdir`
returns it, a tool's output), which the tokenizer rejects; each becomes U+FFFD.
"""

from __future__ import annotations

import copy
import functools
import pathlib
from typing import Iterable, Sequence

import numpy as np
import tokenizers

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
ROLES = ("system", "user", "assistant", "tool")


def load_tokenizer(path: str | pathlib.Path) -> tokenizers.Tokenizer:
  """Loads `tokenizer.json` from a file or a model directory; checks the chat tokens."""
  path = pathlib.Path(path)
  file = path / "tokenizer.json" if path.is_dir() else path
  if not file.is_file():
    raise FileNotFoundError(f"{str(file)!r} not found; pass a tokenizer.json or a directory holding one")
  tokenizer = tokenizers.Tokenizer.from_file(str(file))
  missing = [tok for tok in (IM_START, IM_END) if tokenizer.token_to_id(tok) is None]
  if missing:
    raise ValueError(f"{str(file)!r} lacks the chat special tokens {missing}; a Qwen tokenizer "
                     "defines them as added tokens")
  return tokenizer


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


def _ids(tokenizer: tokenizers.Tokenizer, text: str) -> list[int]:
  return tokenizer.encode(valid_utf8(text), add_special_tokens=False).ids if text else []


def encode_plain(tokenizer: tokenizers.Tokenizer, text: str) -> list[int]:
  """Ids of `text` with any special token's string in it encoded as the plain
  text it spells (decoding gives `text` back); equal to the ordinary encoding
  when `text` holds none."""
  return _ids(_plain_text_tokenizer(tokenizer), text)


@functools.lru_cache(maxsize=8)
def _plain_text_tokenizer(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
  """A copy of `tokenizer` that matches no special token in its input
  (`encode_special_tokens`). A copy, not the switch flipped on `tokenizer`: the
  template glue, encoded with `tokenizer` (perhaps in another thread), needs them."""
  plain = copy.deepcopy(tokenizer)
  plain.encode_special_tokens = True
  return plain


def encode_chat(tokenizer: tokenizers.Tokenizer, messages: Sequence[dict[str, str]],
                add_generation_prompt: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """Token ids (int32 [T]) and action mask (int32 [T]) of a rendered conversation.

  `messages` are `{"role": ..., "content": ...}` dicts with role in ROLES.
  """
  tokens: list[int] = []
  mask: list[int] = []

  def add(text: str, is_action: bool, *, plain: bool = False) -> None:
    ids = encode_plain(tokenizer, text) if plain else _ids(tokenizer, text)
    tokens.extend(ids)
    mask.extend([int(is_action)] * len(ids))

  for i, message in enumerate(messages):
    role, content = message.get("role"), message.get("content")
    if role not in ROLES or not isinstance(content, str):
      raise ValueError(f"messages[{i}]={message!r} is invalid: expected role in {ROLES} and "
                       "a string content")
    is_assistant = role == "assistant"
    add(f"{IM_START}{role}\n", False)
    add(content, is_assistant, plain=True)  # content never carries template structure
    add(IM_END, is_assistant)
    add("\n", False)
  if add_generation_prompt:
    add(f"{IM_START}assistant\n", False)
  return np.asarray(tokens, np.int32), np.asarray(mask, np.int32)
