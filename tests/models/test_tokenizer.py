"""Chat template encoding and action mask with a tiny byte-level BPE tokenizer."""

import numpy as np
import pytest
import tokenizers
from tokenizers import models

from sao_jax.models.tokenizer import IM_END, IM_START, encode_chat, load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
  tok = train_tokenizer(["What is 2 + 2?", "The answer is 4.", "user assistant system tool"] * 5,
                        vocab_size=300)
  path = tmp_path_factory.mktemp("tok")
  tok.save(str(path / "tokenizer.json"))
  return path


def test_chat_ids_and_action_mask(tokenizer_dir):
  tok = load_tokenizer(tokenizer_dir)
  messages = [{"role": "user", "content": "What is 2 + 2?"},
              {"role": "assistant", "content": "The answer is 4."},
              {"role": "tool", "content": "ok"}]
  ids, mask = encode_chat(tok, messages, add_generation_prompt=True)
  assert ids.dtype == mask.dtype == np.int32 and ids.shape == mask.shape
  text = tok.decode(ids.tolist(), skip_special_tokens=False)
  assert text == ("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
                  "The answer is 4.<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n")
  action_text = tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False)
  assert action_text == "The answer is 4.<|im_end|>"
  # The action tokens form one contiguous span: exactly the assistant turn's content + end token.
  starts = np.flatnonzero(np.diff(np.concatenate([[0], mask])) == 1)
  assert len(starts) == 1 and ids[starts[0] - 1] == tok.encode("\n").ids[-1]


def test_bad_message_and_missing_special_tokens(tokenizer_dir, tmp_path):
  tok = load_tokenizer(tokenizer_dir)
  with pytest.raises(ValueError, match="'robot'"):
    encode_chat(tok, [{"role": "robot", "content": "hi"}])
  plain = tokenizers.Tokenizer(models.BPE())
  plain.save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(ValueError, match=r"<\|im_start\|>"):
    load_tokenizer(tmp_path)
