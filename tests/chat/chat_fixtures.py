"""Tiny local tokenizers that carry each family's official chat template.

Each is a byte-level BPE (Llama 3 / Qwen pre-tokenizer split) trained here on a few sentences, with the family's
control tokens as added tokens, saved as a Hugging Face tokenizer directory
(tokenizer.json, tokenizer_config.json and the template from
tests/fixtures/chat_templates), so transformers loads it with
`AutoTokenizer.from_pretrained` and no hub access.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import tokenizers
import transformers

from sao_jax.sampler import engine as engine_lib
from sao_jax.sampler.scripted import StepAtOnce

TEMPLATES = pathlib.Path(__file__).parent.parent / "fixtures" / "chat_templates"
_QWEN_TEXT = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
              "</tool_response>"]
FAMILIES = {
    # name: (template file, special tokens, non-special added tokens, tokenizer_config tokens,
    #        template location)
    "qwen3": ("qwen3.jinja", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], _QWEN_TEXT,
              {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}, "jinja"),
    "qwen2_5": ("qwen2_5.jinja", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], _QWEN_TEXT[2:],
                {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "config"),
    "llama3": ("llama3.jinja", ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
               [], {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "jinja"),
    "llama3_2": ("llama3_2.jinja", ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                    "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
                 [], {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "config"),
    "gemma3": ("gemma3.jinja", ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                                "<start_of_image>"], [],
               {"bos_token": "<bos>", "eos_token": "<eos>",
                "pad_token": "<pad>"}, "config"),
}
# The pre-tokenizer split of Llama 3 and Qwen2/2.5/3 tokenizers.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["What is 2 + 2? The answer is 4.", "def add(a, b):\n    return a + b\n",
          "You are a helpful assistant. Cutting Knowledge Date: December 2023",
          "Let me think about the tool output: 42\n\n", "user assistant system tool model"] * 20


def build_tokenizer_dir(directory: pathlib.Path, family: str) -> pathlib.Path:
  """Writes `family`'s tiny tokenizer directory under `directory`; returns it."""
  template_file, specials, texts, config_tokens, where = FAMILIES[family]
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
      tokenizers.pre_tokenizers.Split(tokenizers.Regex(SPLIT), behavior="isolated"),
      tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=400, special_tokens=specials, show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tokenizer.train_from_iterator(CORPUS, trainer)
  tokenizer.add_tokens([tokenizers.AddedToken(text, special=False, normalized=False)
                        for text in texts])
  out = directory / family
  out.mkdir(parents=True, exist_ok=True)
  tokenizer.save(str(out / "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", **config_tokens}
  template = (TEMPLATES / template_file).read_text(encoding="utf-8")
  if where == "jinja":
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
  else:
    config["chat_template"] = template
  (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
  return out


def hf_tokenizer(directory: pathlib.Path, family: str):
  """transformers' tokenizer of `family`'s directory, with its template: the reference."""
  template_file, _, _, special_tokens, _ = FAMILIES[family]
  hf = transformers.PreTrainedTokenizerFast(
      tokenizer_file=str(directory / "tokenizer.json"),
      **{name: token for name, token in special_tokens.items() if token is not None})
  hf.chat_template = (TEMPLATES / template_file).read_text(encoding="utf-8")
  return hf


class ScriptedEngine(StepAtOnce):
  """The part of `Engine` the runner uses, for one episode at a time: turn k samples
  the canonical tokens of `actions[k]` and the format's end token."""

  def __init__(self, chat, actions):
    self.version, self._chat, self._actions = 0, chat, actions
    self.episode = {"tokens": [], "mask": [], "turns": 0}

  def submit(self, episode_id, tokens, *, seed=None):
    self.episode["tokens"] += list(tokens)
    self.episode["mask"] += [0] * len(tokens)
    self.episode["queued"] = episode_id

  def step(self):
    if "queued" not in self.episode:
      return []
    episode_id = self.episode.pop("queued")
    ids = self._chat.tokenizer.encode(self._actions[self.episode["turns"]],
                                      add_special_tokens=False).ids + [self._chat.end_token_id]
    self.episode["turns"] += 1
    context = len(self.episode["tokens"])
    self.episode["tokens"] += ids
    self.episode["mask"] += [1] * len(ids)
    return [engine_lib.Turn(episode_id, np.asarray(ids, np.int32),
                            np.full(len(ids), -0.5, np.float32), "stop_token", (0, 0), context)]

  @property
  def busy(self):
    return "queued" in self.episode

  def room(self, episode_id):
    return 1 << 30

  def finish(self, episode_id):
    mask = np.asarray(self.episode["mask"], np.int32)
    return engine_lib.Generation(episode_id, np.asarray(self.episode["tokens"], np.int32), mask,
                                 -0.5 * mask.astype(np.float32), (0, 0), self.episode["turns"])
