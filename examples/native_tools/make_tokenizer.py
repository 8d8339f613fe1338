"""Writes a tiny tokenizer directory that ships the Qwen3 chat template, for trying
native tool calls on the CPU demo model without downloading a checkpoint.

    .venv/bin/python examples/native_tools/make_tokenizer.py runs/native_tools/tokenizer

A byte-level BPE trained on a few sentences, with Qwen3's control tokens
(`<|im_start|>`, `<|im_end|>`, `<tool_call>`, `<tool_response>`, ...) and its
official template (tests/fixtures/chat_templates/qwen3.jinja, as Qwen3
checkpoints ship it). For a real run, point `run.tokenizer` and `run.init` at a
Qwen3 / Qwen2.5 / Llama 3.1 checkpoint directory instead.
"""

import json
import pathlib
import sys

import tokenizers

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "tests" / "fixtures" / "chat_templates" / "qwen3.jinja"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
        "</tool_response>"]
CORPUS = ["Solve the math problem. What is 12 + 30? The answer is \\boxed{42}.",
          '{"name": "python", "arguments": {"code": "print(12 + 30)"}}',
          "You may call the python tool to run code; its printed output will be sent back.",
          TEMPLATE.read_text(encoding="utf-8")] * 50


def write(directory: str | pathlib.Path, vocab_size: int = 512) -> pathlib.Path:
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size - len(TEXT), special_tokens=SPECIAL, show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tokenizer.train_from_iterator(CORPUS, trainer)
  tokenizer.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in TEXT])
  tokenizer.save(str(directory / "tokenizer.json"))
  (directory / "chat_template.jinja").write_text(TEMPLATE.read_text(encoding="utf-8"),
                                                 encoding="utf-8")
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
       "pad_token": "<|endoftext|>"}), encoding="utf-8")
  return directory


if __name__ == "__main__":
  print(write(sys.argv[1] if len(sys.argv) > 1 else "runs/native_tools/tokenizer"))
