"""Episodes in a checkpoint's own chat template: tokens equal transformers'
`apply_chat_template` on the same messages (official Qwen3, Qwen2.5, Llama 3.1, Llama 3.2
and Gemma 3 templates, tiny local tokenizers), and the action mask covers
exactly what the policy generates: each assistant turn and its end token."""

import datetime
import json
import types

import numpy as np
import pytest
import transformers

from chat_fixtures import FAMILIES, TEMPLATES
from sao_jax.chat import chat_format, load_chat
from sao_jax.chat import jinja as jinja_lib
from sao_jax.models.tokenizer import load_tokenizer, train_tokenizer

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is 2 + 2?"}
ANSWER = "The answer is 4."
REASONED = "<think>\nLet me think: 2 + 2 = 4.\n</think>\n\nRun the tool."
TOOL = {"role": "tool", "content": "4"}
CALL = {"role": "assistant", "content": "", "reasoning_content": "I add.",
        "tool_calls": [{"type": "function", "function": {"name": "add",
                                                         "arguments": {"a": 2, "b": 2}}}]}
END = {"qwen3": "<|im_end|>", "qwen2_5": "<|im_end|>", "llama3": "<|eot_id|>",
       "llama3_2": "<|eot_id|>", "gemma3": "<end_of_turn>"}


@pytest.fixture(scope="module")
def formats(family_dirs):
  """family -> (our ChatFormat of the directory, transformers' tokenizer built from the
  same tokenizer.json, special tokens and official template string)."""
  out = {}
  for family, path in family_dirs.items():
    template_file, _, _, special_tokens, _ = FAMILIES[family]
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"),
        **{name: token for name, token in special_tokens.items() if token is not None})
    hf.chat_template = (TEMPLATES / template_file).read_text(encoding="utf-8")
    out[family] = (load_chat(path), hf)
  return out


def reference(hf, messages, **kwargs):
  return list(hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs))


def action_texts(hf, tokens, mask):
  """The decoded text of each run of mask-1 tokens."""
  edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
  return [hf.decode(tokens[a:b].tolist(), skip_special_tokens=False)
          for a, b in zip(edges[::2], edges[1::2])]


CASES = {
    # name: (families, messages, add_generation_prompt, expected actions per family)
    "one_turn": (("qwen3", "qwen2_5", "llama3", "llama3_2", "gemma3"), [SYSTEM, USER,
                 {"role": "assistant", "content": ANSWER}], False,
                 {"qwen3": ["<think>\n\n</think>\n\n" + ANSWER + "<|im_end|>"]}),
    "prompt": (("qwen3", "qwen2_5", "llama3", "llama3_2", "gemma3"), [SYSTEM, USER], True, {}),
    "tool_episode": (("qwen3", "qwen2_5", "llama3", "llama3_2"), [SYSTEM, USER,
                     {"role": "assistant", "content": REASONED}, TOOL,
                     {"role": "assistant", "content": ANSWER}], False,
                     {"qwen3": [REASONED + "<|im_end|>",
                                "<think>\n\n</think>\n\n" + ANSWER + "<|im_end|>"]}),
    "tool_result_then_prompt": (("qwen3", "qwen2_5", "llama3", "llama3_2"), [USER,
                                {"role": "assistant", "content": REASONED}, TOOL, TOOL], True,
                                {"qwen3": [REASONED + "<|im_end|>"]}),
    "tool_calls": (("qwen3", "qwen2_5", "llama3", "llama3_2"), [USER, CALL, TOOL,
                   {"role": "assistant", "content": ANSWER}], False, {
                       "qwen3": ['<think>\nI add.\n</think>\n\n<tool_call>\n{"name": "add", '
                                 '"arguments": {"a": 2, "b": 2}}\n</tool_call><|im_end|>',
                                 "<think>\n\n</think>\n\n" + ANSWER + "<|im_end|>"],
                       "qwen2_5": ['<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}'
                                   '\n</tool_call><|im_end|>', ANSWER + "<|im_end|>"],
                       "llama3": ['{"name": "add", "parameters": {"a": 2, "b": 2}}<|eot_id|>',
                                  ANSWER + "<|eot_id|>"],
                       "llama3_2": ['{"name": "add", "parameters": {"a": 2, "b": 2}}<|eot_id|>',
                                    ANSWER + "<|eot_id|>"]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tokens_equal_apply_chat_template_and_mask_is_the_policy_turns(formats, case):
  families, messages, generation, expected = CASES[case]
  for family in families:
    chat, hf = formats[family]
    tokens, mask = chat.encode(messages, add_generation_prompt=generation)
    assert tokens.tolist() == reference(hf, messages, add_generation_prompt=generation), family
    turns = [m for m in messages if m["role"] == "assistant"]
    want = expected.get(family, [m["content"] + END[family] for m in turns])
    assert action_texts(hf, tokens, mask) == want, family


def test_enable_thinking_false_masks_out_the_empty_think_block(formats, family_dirs):
  chat, hf = formats["qwen3"]
  chat = chat_format(family_dirs["qwen3"], chat.tokenizer, enable_thinking=False)
  messages = [USER, {"role": "assistant", "content": ANSWER}]
  tokens, mask = chat.encode(messages)
  assert tokens.tolist() == reference(hf, messages, enable_thinking=False)
  assert action_texts(hf, tokens, mask) == [ANSWER + "<|im_end|>"]
  prompt = chat.encode(messages[:1], add_generation_prompt=True)[0]
  assert prompt.tolist() == reference(hf, messages[:1], add_generation_prompt=True,
                                      enable_thinking=False)
  assert hf.decode(prompt.tolist()).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_qwen3_history_rewrites_keep_what_the_policy_saw(formats, family_dirs):
  """Qwen3 is not prefix-stable: under enable_thinking=False the empty think block
  of a turn disappears once it is not the last, and with thinking the reasoning
  of turns before the latest user query is dropped. The episode keeps the turns
  as the policy generated them and appends only the new messages."""
  chat, hf = formats["qwen3"]
  quiet = chat_format(family_dirs["qwen3"], chat.tokenizer, enable_thinking=False)
  messages = [USER, {"role": "assistant", "content": "Run it."}, TOOL,
              {"role": "assistant", "content": ANSWER}]
  tokens, mask = quiet.encode(messages)
  full = hf.apply_chat_template(messages, tokenize=False, enable_thinking=False)
  assert "<|im_start|>assistant\nRun it." in full  # transformers drops the first empty block
  assert hf.decode(tokens.tolist()) == full.replace(
      "<|im_start|>assistant\nRun it.", "<|im_start|>assistant\n<think>\n\n</think>\n\nRun it.")
  expected = (reference(hf, messages[:1], add_generation_prompt=True, enable_thinking=False)
              + hf.encode("Run it.<|im_end|>", add_special_tokens=False)
              + hf.encode("\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n"
                          "<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
              + hf.encode(ANSWER + "<|im_end|>\n", add_special_tokens=False))
  assert tokens.tolist() == expected
  assert action_texts(hf, tokens, mask) == ["Run it.<|im_end|>", ANSWER + "<|im_end|>"]

  first = "<think>\nR1\n</think>\n\nA1"
  messages = [USER, {"role": "assistant", "content": first},
              {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": ANSWER}]
  tokens, mask = chat.encode(messages)
  full = hf.apply_chat_template(messages, tokenize=False)
  assert "<|im_start|>assistant\nA1<|im_end|>" in full  # transformers strips R1
  assert hf.decode(tokens.tolist()) == full.replace("assistant\nA1", "assistant\n" + first)
  assert action_texts(hf, tokens, mask) == [
      first + "<|im_end|>", "<think>\n\n</think>\n\n" + ANSWER + "<|im_end|>"]


def test_llama3_2_episode_across_midnight_appends_only_the_new_messages(formats, monkeypatch):
  """Llama 3.2 writes today's date into the system turn, so a conversation rendered
  after midnight no longer starts with the text the policy saw; the appended tokens
  are still exactly the tool turn and the generation prompt."""
  chat, hf = formats["llama3_2"]
  days = iter([datetime.datetime(2026, 1, 1, 23, 59), datetime.datetime(2026, 1, 2, 0, 0)])
  monkeypatch.setattr(jinja_lib, "datetime", types.SimpleNamespace(
      datetime=types.SimpleNamespace(now=lambda: next(days))))
  history = [SYSTEM, USER, {"role": "assistant", "content": "Run it."}]
  tokens = chat.continuation(history, [TOOL], closed=True)
  assert hf.decode(tokens.tolist()) == ('<|start_header_id|>ipython<|end_header_id|>\n\n"4"'
                                        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_continuation_of_a_cut_turn_starts_with_the_end_token(formats):
  for family in ("qwen3", "llama3"):
    chat, _ = formats[family]
    history = [USER, {"role": "assistant", "content": "```python\nprint(4)\n```"}]
    closed = chat.continuation(history, [TOOL], closed=True)
    cut = chat.continuation(history, [TOOL], closed=False)
    assert cut.tolist() == [chat.end_token_id] + closed.tolist()


def test_a_template_without_a_tool_role_refuses_tool_results_by_name(formats):
  chat, _ = formats["gemma3"]
  with pytest.raises(ValueError, match="refused a conversation with roles.*alternate"):
    chat.encode([USER, {"role": "assistant", "content": ANSWER}, TOOL])
  # Before any episode: the sampler and sao-eval check the environment's observation role.
  with pytest.raises(ValueError, match=r"env.name='math_tool' answers the policy with 'tool' "
                                       r"messages, but .*alternate.*env.name='style'"):
    chat.require_role("tool", "env.name='math_tool'")
  chat.require_role("user", "env.name='style'")
  formats["qwen3"][0].require_role("tool", "env.name='math_tool'")


def test_bad_input_is_refused_naming_it(formats, family_dirs, tmp_path):
  chat, _ = formats["llama3"]
  with pytest.raises(ValueError, match="enable_thinking switch"):
    chat_format(family_dirs["llama3"], chat.tokenizer, enable_thinking=False)
  with pytest.raises(ValueError, match=r"messages\[1\].*robot"):
    chat.encode([USER, {"role": "robot", "content": "hi"}])
  with pytest.raises(ValueError, match="messages\\[0\\] is an assistant"):
    chat.encode([{"role": "assistant", "content": "hi"}, USER])
  config = {"chat_template": [{"name": "tool_use", "template": "x"}]}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="no 'default' template"):
    chat_format(tmp_path, chat.tokenizer)
  with pytest.raises(ValueError, match="ships no chat template.*ChatML tokens"):
    chat_format(None, load_tokenizer(family_dirs["llama3"]))


def test_a_named_default_template_and_added_token_dicts_are_read(formats, family_dirs, tmp_path):
  """tokenizer_config.json may list templates by name and spell a special token as an
  AddedToken dict (older checkpoints); both load as transformers reads them."""
  chat, hf = formats["llama3"]
  template = (family_dirs["llama3"] / "chat_template.jinja").read_text()
  config = {"chat_template": [{"name": "default", "template": template}],
            "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>"}}
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  messages = [USER, {"role": "assistant", "content": ANSWER}]
  tokens, _ = chat_format(tmp_path, chat.tokenizer).encode(messages)
  assert tokens.tolist() == reference(hf, messages)


@pytest.fixture(scope="module")
def chatml():
  tokenizer = train_tokenizer(["What is 2 + 2?", "The answer is 4.", "user assistant system tool"] * 5,
                              vocab_size=300)
  return chat_format(None, tokenizer)


def test_chatml_is_the_format_of_tokenizers_the_run_trains(chatml, tmp_path):
  messages = [USER, {"role": "assistant", "content": ANSWER}, {"role": "tool", "content": "ok"}]
  ids, mask = chatml.encode(messages, add_generation_prompt=True)
  decode = lambda ids: chatml.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
  assert decode(ids) == ("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
                         "The answer is 4.<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n"
                         "<|im_start|>assistant\n")
  assert decode(ids[mask == 1]) == "The answer is 4.<|im_end|>"
  assert chatml.end_token == "<|im_end|>"
  chatml.tokenizer.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "chat_template.jinja").write_text("stale")
  chatml.save(tmp_path)  # a run directory records ChatML too, over a stale template
  assert (tmp_path / "chat_template.jinja").read_text() == chatml.template
  again = load_chat(tmp_path)
  assert (again.template, again.name) == (chatml.template, "ChatML")


def test_a_saved_template_reloads_identically(formats, tmp_path):
  chat, hf = formats["qwen3"]
  chat.tokenizer.save(str(tmp_path / "tokenizer.json"))
  chat.save(tmp_path)
  again = load_chat(tmp_path / "tokenizer.json")
  messages = [SYSTEM, USER, {"role": "assistant", "content": REASONED}, TOOL]
  np.testing.assert_array_equal(again.encode(messages, True)[0], chat.encode(messages, True)[0])


def test_load_tokenizer_names_a_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    load_tokenizer(tmp_path)


def test_deeply_nested_tokenizer_config_is_a_clear_error(tmp_path):
  """A checkpoint's tokenizer_config.json is input: 100 000 nested brackets made
  `json.loads` raise RecursionError; the cap names the file."""
  (tmp_path / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
  with pytest.raises(ValueError, match="tokenizer_config.json: JSON nested 100000 deep"):
    chat_format(tmp_path, train_tokenizer(["a b"], vocab_size=300))
