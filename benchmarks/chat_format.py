"""Host cost of rendering an episode's turns with a checkpoint's chat template.

  .venv/bin/python benchmarks/chat_format.py [--turns 10 50 200 --reps 5 --tokenizer-dir DIR]

Per policy turn the sampler appends the next observation with
`ChatFormat.continuation` (`sao_jax.chat.format`): two renders of the whole
conversation in the sandboxed template (with and without the new messages, to
find where the turn ended) and the encoding of the appended text. The
reference is transformers' `apply_chat_template(conversation, tokenize=True,
add_generation_prompt=True)` of the same conversation: one render plus the
tokenization of all of it, what re-rendering each turn from scratch costs.
Conversations are coding-like: a 2,000-character system prompt, then turns of
a reasoned action and a 15-line tool result. `--tokenizer-dir` defaults to a
tiny byte-level BPE with Qwen3's control tokens and its official template
(tests/fixtures/chat_templates/qwen3.jinja); the tokenizer matters little here,
the template is what costs. Medians over `--reps`; the last line is
`RESULT {json}` with ms per turn for ours and the reference at each length and
their ratio.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import tokenizers
import transformers

from sao_jax.chat import load_chat

ROOT = pathlib.Path(__file__).resolve().parents[1]
QWEN3 = ROOT / "tests" / "fixtures" / "chat_templates" / "qwen3.jinja"


def tiny_qwen3_dir(directory: pathlib.Path) -> pathlib.Path:
  tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=1000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tokenizer.train_from_iterator(["def f(x):\n    return x + 1\n", "Let me think."] * 50, trainer)
  tokenizer.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in
                        ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                         "</tool_response>")])
  tokenizer.save(str(directory / "tokenizer.json"))
  (directory / "chat_template.jinja").write_text(QWEN3.read_text())
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
       "pad_token": "<|endoftext|>"}))
  return directory


def conversation(turns: int) -> list[dict]:
  messages = [{"role": "system", "content": "You are a coding agent. " * 80},
              {"role": "user", "content": "Fix the failing test in utils.py."}]
  for i in range(turns):
    messages += [{"role": "assistant",
                  "content": f"<think>\nStep {i}: look at the file.\n</think>\n\n```python\n"
                             f"print(open('utils.py').read())\n```"},
                 {"role": "tool", "content": "def f(x):\n    return x + 1\n" * 7 + "ok"}]
  return messages


def median_ms(fn, reps: int) -> float:
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(1000 * (time.perf_counter() - start))
  return statistics.median(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--turns", type=int, nargs="+", default=[10, 50, 200])
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--tokenizer-dir", "--tokenizer_dir", dest="tokenizer_dir", default=None,
                      help="a tokenizer directory with a chat template (old spelling kept)")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    directory = pathlib.Path(args.tokenizer_dir or tiny_qwen3_dir(pathlib.Path(tmp)))
    chat = load_chat(directory)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    result = {"name": "chat_format", "template": str(directory)}
    for turns in args.turns:
      messages = conversation(turns)
      history, new = messages[:-1], messages[-1:]  # the last tool result is being appended
      ours = median_ms(lambda: chat.continuation(history, new, closed=True), args.reps)
      theirs = median_ms(lambda: reference.apply_chat_template(
          messages, tokenize=True, add_generation_prompt=True, return_dict=False), args.reps)
      print(f"{turns:4d} turns: continuation {ours:8.2f} ms   apply_chat_template "
            f"{theirs:8.2f} ms   ratio {ours / theirs:5.2f}", flush=True)
      result.update({f"ms_per_turn_at_{turns}": round(ours, 3),
                     f"reference_ms_at_{turns}": round(theirs, 3),
                     f"ratio_at_{turns}": round(ours / theirs, 3)})
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
