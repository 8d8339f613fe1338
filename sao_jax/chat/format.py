"""The chat format of a run: the checkpoint's own chat template, else ChatML.

  load_chat(path, enable_thinking=True)  -> ChatFormat (tokenizer + template)
  chat.prompt(messages)                  -> tokens of the first turn's context
  chat.continuation(history, new, closed=...) -> tokens appended after a policy turn
  chat.encode(messages, add_generation_prompt=False) -> (tokens_T, action_mask_T)
  chat.save(directory)                   -> the template files a run directory keeps
  chat.require_role(role, sender)        -> ValueError unless the template renders `role` turns
  chat.tool_format                       -> how the policy calls tools (`tool_calls`)

Every rendering method takes `tools=`: the OpenAI-format function schemas of
the environment's tools (`Environment.tools`), given to the template as
transformers' `apply_chat_template(..., tools=)` gives them (`sao_jax.chat.tool_calls`).

Which format: a tokenizer directory (or the directory holding a tokenizer.json)
that ships a chat template (`chat_template.jinja`, else `chat_template` in
`tokenizer_config.json`) is rendered with that template (`sao_jax.chat.jinja`),
with the special tokens `tokenizer_config.json` names and `enable_thinking`;
one without is rendered as ChatML, the format of the tokenizers a run trains
itself: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message and
`<|im_start|>assistant\\n` as the generation prompt. Environments send
`{"role", "content"}` messages with role in ROLES (a tool result is role
"tool"); the template decides how each looks (Qwen3 puts tool results in a user
turn as `<tool_response>...</tool_response>`, Llama 3 in an `ipython` turn).

Turns. The policy's turn is what it generates after the generation prompt: for
assistant message i of conversation M,
  action_i = render(M[:i+1])[len(render(M[:i], gen)) : the end of its end token]
where the end token is the special token the template closes an assistant turn
with (found once by rendering a probe turn) and what follows it (ChatML's "\\n")
is template text. The action mask is 1 exactly on action tokens; everything the
template adds around them (headers, the generation prompt, an empty
`<think>\\n\\n</think>\\n\\n` that Qwen3 puts in the prompt under
enable_thinking=False) is 0.

Episodes are built turn by turn, as the sampler runs them: the prompt
render(M0, gen), then each action, then
  continuation(H, N) = render(H + N, gen)[k:]
where H ends with the policy's turn, N are the new messages and k is the end of
H's last end token. When the template is prefix-stable (render(H + N, gen)
starts with render(H) up to that end token) k is that position, and the episode
equals `apply_chat_template` of the whole conversation. Some templates rewrite
history instead (Qwen3 drops the reasoning of assistant turns before the
latest user query, and its empty think block appears only on the last
assistant turn): then the tokens already in the episode stay what the policy
was conditioned on and k is the end of the same count of end tokens in the new
rendering, so only the new messages and the generation prompt are appended.
`encode` builds a stored conversation the same way, so SFT and RL see one format.
A turn that did not end on the end token (a stop pattern or length cut it) gets
the end token as observation glue (`closed=False`). Each piece (prompt, action,
continuation) is tokenized on its own, as the sampler feeds them to the model;
that equals tokenizing the whole text wherever no pre-token spans a piece
boundary (continuations start after a special token; a generation prompt ends
in the newlines that the Llama 3 / Qwen pre-tokenizer split keeps apart from
the text that follows).

Text of system, user and tool messages is untrusted and passes through
`sao_jax.chat.untrusted`, so a control-token string inside it stays text.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping, Sequence

import jinja2
import numpy as np
import tokenizers

from sao_jax import bounded_json
from sao_jax.chat import jinja, tool_calls
from sao_jax.chat.untrusted import Protector
from sao_jax.models.tokenizer import TOKENIZER_CONFIG, IM_END, IM_START, TEMPLATE_FILE, load_tokenizer

ROLES = ("system", "user", "assistant", "tool")
_EXTRA_KEYS = {"assistant": ("tool_calls", "reasoning_content"), "tool": ("name", "tool_call_id")}
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                       "mask_token")  # what transformers passes a template (special_tokens_map)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '" + IM_START + "' + message['role'] + '\n' + message['content'] + '" + IM_END + "\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + IM_START + "assistant\n' }}{% endif %}")
Tools = Sequence[Mapping[str, Any]] | None  # OpenAI-format function schemas (`tool_calls`)
_PROBE = "\ue001"  # probe assistant content: a private-use character no template contains


class TurnTextError(ValueError):
  """The policy's own text hides where its turn ends (it spells the end token's text
  under a template that rewrites earlier turns): its doing, not the environment's."""


class ChatFormat:
  """A tokenizer and the chat template that renders its conversations (module docstring)."""

  def __init__(self, tokenizer: tokenizers.Tokenizer, template: str, *,
               special_tokens: Mapping[str, str], enable_thinking: bool, name: str,
               fallback: bool = False):
    # fallback: the tokenizer's directory ships no template and ChatML stands in for it
    # (a directory that ships ChatML itself, as make_tokenizer writes, is not a fallback).
    self.fallback = fallback
    if not enable_thinking and "enable_thinking" not in template:
      raise ValueError(f"run.enable_thinking=False, but the chat template of {name} has no "
                       "enable_thinking switch; set run.enable_thinking=true")
    self.tokenizer, self.name, self.template = tokenizer, name, template
    self.special_tokens = dict(special_tokens)
    self._compiled = jinja.compile_template(template)
    self._variables = {**self.special_tokens, "enable_thinking": enable_thinking}
    self._protector = Protector(tokenizer)
    self.end_token, self._trailer = self._probe()
    self.end_token_id = tokenizer.token_to_id(self.end_token)
    self.tool_format = tool_calls.tool_format(template)

  def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool,
             tools: Tools = None) -> str:
    """The template's text, untrusted contents marked (`sao_jax.chat.untrusted`)."""
    checked = [self._checked(i, message) for i, message in enumerate(messages)]
    try:
      return jinja.render(self._compiled, checked, add_generation_prompt=add_generation_prompt,
                          variables=self._variables, tools=tools)
    except jinja2.TemplateError as error:
      roles = [message["role"] for message in checked]
      raise ValueError(f"the chat template of {self.name} refused a conversation with roles "
                       f"{roles}: {error}") from error

  def prompt(self, messages: Sequence[Mapping[str, Any]], *, tools: Tools = None) -> np.ndarray:
    """Tokens (int32 [T]) of `messages` and the generation prompt: the first turn's context."""
    return self._ids(self.render(messages, add_generation_prompt=True, tools=tools))

  def continuation(self, history: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]],
                   *, closed: bool, add_generation_prompt: bool = True,
                   tools: Tools = None) -> np.ndarray:
    """Tokens (int32 [T]) to append after the policy's turn `history[-1]`: the rest
    of that turn's closing, `new` and the generation prompt. `closed`: the turn
    ended on the end token (otherwise the end token is the first appended token)."""
    if not history or history[-1].get("role") != "assistant":
      raise ValueError("continuation needs a history that ends with the policy's turn "
                       "(an assistant message)")
    old = self.render(history, add_generation_prompt=False, tools=tools)
    text = self.render([*history, *new], add_generation_prompt=add_generation_prompt, tools=tools)
    end = self._turn_end(old, len(history) - 1)
    at = end if text.startswith(old[:end]) else self._realign(history, old[:end], text)
    return self._ids(text[at if closed else at - len(self.end_token):])

  def encode(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
             *, tools: Tools = None) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int32 [T]) and action mask (int32 [T]) of a conversation, built
    turn by turn as an episode (module docstring)."""
    turns = [i for i, message in enumerate(messages) if message.get("role") == "assistant"]
    if not turns:
      ids = self._ids(self.render(messages, add_generation_prompt=add_generation_prompt,
                                  tools=tools))
      return ids, np.zeros_like(ids)
    if turns[0] == 0:
      raise ValueError("messages[0] is an assistant message; a conversation starts with the "
                       "prompt the policy answers (system and/or user messages)")
    pieces = [(self.prompt(messages[:turns[0]], tools=tools), 0)]
    for k, i in enumerate(turns):
      pieces.append((self._ids(self._action_text(messages[:i], messages[i], tools)), 1))
      following = turns[k + 1] if k + 1 < len(turns) else len(messages)
      generation = add_generation_prompt if k + 1 == len(turns) else True
      pieces.append((self.continuation(messages[:i + 1], messages[i + 1:following], closed=True,
                                       add_generation_prompt=generation, tools=tools), 0))
    tokens = np.concatenate([ids for ids, _ in pieces]).astype(np.int32)
    mask = np.concatenate([np.full(ids.shape, flag, np.int32) for ids, flag in pieces])
    return tokens, mask

  def require_role(self, role: str, sender: str) -> None:
    """Refuses, naming `sender`, a template that cannot render a `role` message after
    the policy's turn (Gemma 3's has no tool role), before any episode runs into it."""
    probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _PROBE},
             {"role": role, "content": "?"}]
    try:
      self.render(probe, add_generation_prompt=True)
    except ValueError as error:
      raise ValueError(f"{sender} answers the policy with {role!r} messages, but {error}. Use an "
                       f"environment without tool results (env.name='style' or 'sanity') or "
                       f"a checkpoint whose chat template renders {role!r} messages") from error

  def save(self, directory: str | pathlib.Path) -> None:
    """Writes the template (ChatML's too: the run directory records the format it
    trained with) and its special tokens where `load_chat` and transformers'
    `AutoTokenizer` find them (a run directory beside its tokenizer.json, an export).
    The config names `PreTrainedTokenizerFast`, so transformers takes tokenizer.json
    as it is rather than a family's class chosen by config.json's model_type."""
    directory = pathlib.Path(directory)
    (directory / TEMPLATE_FILE).write_text(self.template, encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.special_tokens}
    (directory / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=1), encoding="utf-8")

  def _ids(self, rendered: str) -> np.ndarray:
    return np.asarray(self._protector.encode(rendered), np.int32)

  def _checked(self, i: int, message: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of message `i` with its text made safe to render (module docstring)."""
    role, content = message.get("role"), message.get("content")
    allowed = ("role", "content", *_EXTRA_KEYS.get(role, ()))
    if role not in ROLES or not isinstance(content, str) or set(message) - set(allowed):
      raise ValueError(f"messages[{i}]={message!r} is invalid: expected role in {ROLES}, a string "
                       f"content and no keys beyond {allowed}")
    if role == "assistant":
      checked = {**message, "content": self._protector.escape(content)}
      if isinstance(message.get("reasoning_content"), str):
        checked["reasoning_content"] = self._protector.escape(message["reasoning_content"])
      return checked
    return {key: self._protector.mark(value) if isinstance(value, str) and key != "role" else value
            for key, value in message.items()}

  def _probe(self) -> tuple[str, str]:
    """The end token of an assistant turn and the template text after it (ChatML: "\\n")."""
    user = {"role": "user", "content": "u"}
    prompt = self.render([user], add_generation_prompt=True)
    full = self.render([user, {"role": "assistant", "content": _PROBE}], add_generation_prompt=False)
    if not full.startswith(prompt) or _PROBE not in full[len(prompt):]:
      raise ValueError(f"the chat template of {self.name} does not render an assistant turn as "
                       "its generation prompt followed by the content; it cannot drive episodes")
    after = full[full.rindex(_PROBE) + len(_PROBE):]
    specials = sorted((token.content for token in self.tokenizer.get_added_tokens_decoder().values()
                       if token.special and after.startswith(token.content)), key=len)
    if not specials:
      raise ValueError(f"the chat template of {self.name} closes an assistant turn with "
                       f"{after[:40]!r}, which does not start with a special token of the "
                       "tokenizer; the policy's end-of-turn token cannot be told")
    return specials[-1], after[len(specials[-1]):]

  def _turn_end(self, rendered: str, i: int) -> int:
    """Where the end token of assistant message `i`, the last message of `rendered`, ends."""
    if not rendered.endswith(self.end_token + self._trailer):
      raise ValueError(f"the chat template of {self.name} did not close assistant message {i} "
                       f"with {self.end_token + self._trailer!r} as it closes other turns")
    return len(rendered) - len(self._trailer)

  def _action_text(self, history: Sequence[Mapping[str, Any]], message: Mapping[str, Any],
                   tools: Tools = None) -> str:
    """What the policy generates for `message` after `history`'s generation prompt."""
    prompt = self.render(history, add_generation_prompt=True, tools=tools)
    full = self.render([*history, message], add_generation_prompt=False, tools=tools)
    if not full.startswith(prompt):
      raise ValueError(f"assistant message {len(history)} does not continue the generation prompt "
                       f"of the chat template of {self.name} (e.g. reasoning after a prompt that "
                       "already closed the think block under enable_thinking=False)")
    return full[len(prompt):self._turn_end(full, len(history))]

  def _realign(self, history: Sequence[Mapping[str, Any]], old_head: str, text: str) -> int:
    """End of the last turn in `text` when the template rewrote history: the end of
    the same count of end tokens (untrusted text is marked, so only the template's
    own end tokens and the policy's count, and these must not hold the end token's text)."""
    if any(self.end_token in message["content"] for message in history
           if message["role"] == "assistant"):
      raise TurnTextError(f"an assistant turn holds the text {self.end_token!r} and the chat "
                          f"template of {self.name} rewrites earlier turns; the turn boundary "
                          "cannot be found")
    at = -1
    for _ in range(old_head.count(self.end_token)):
      at = text.find(self.end_token, at + 1)
      if at < 0:
        raise ValueError(f"the chat template of {self.name} dropped a turn's end token when the "
                         "conversation grew; the episode cannot be continued")
    return at + len(self.end_token)


def _template_source(directory: pathlib.Path) -> tuple[str | None, dict[str, Any]]:
  """The template `directory` ships (None: none) and its tokenizer_config.json."""
  config_file = directory / TOKENIZER_CONFIG
  # Input from a downloaded checkpoint: capped (Gemma 3's, listing ~6k added tokens, is ~1 MB).
  config = (bounded_json.loads(config_file.read_bytes(), max_bytes=64 * 2**20, max_depth=16,
                               what=str(config_file)) if config_file.is_file() else {})
  if not isinstance(config, dict):
    raise ValueError(f"{str(config_file)!r} holds a {type(config).__name__}, not a JSON object")
  if (directory / TEMPLATE_FILE).is_file():
    return (directory / TEMPLATE_FILE).read_text(encoding="utf-8"), config
  template = config.get("chat_template")
  if isinstance(template, list):
    named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
    if not isinstance(named.get("default"), str):
      raise ValueError(f"{str(config_file)!r}: chat_template lists {sorted(map(str, named))} but no "
                       "'default' template")
    template = named["default"]
  if template is not None and not isinstance(template, str):
    raise ValueError(f"{str(config_file)!r}: chat_template is {type(template).__name__}; expected a "
                     "string or a list of {name, template}")
  return template, config


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
  """The named special tokens a template sees (strings or AddedToken dicts in the config)."""
  out = {}
  for name in SPECIAL_TOKEN_NAMES:
    value = config.get(name)
    if isinstance(value, dict):
      value = value.get("content")
    if isinstance(value, str):
      out[name] = value
  return out


def chat_format(path: str | pathlib.Path | None, tokenizer: tokenizers.Tokenizer, *,
                enable_thinking: bool = True) -> ChatFormat:
  """The chat format of the tokenizer at `path` (a tokenizer.json or its directory;
  None: a tokenizer trained by the run, which is ChatML)."""
  directory = None if path is None else pathlib.Path(path)
  if directory is not None and not directory.is_dir():
    directory = directory.parent
  template, config = _template_source(directory) if directory is not None else (None, {})
  if template is None:
    missing = [token for token in (IM_START, IM_END) if tokenizer.token_to_id(token) is None]
    if missing:
      raise ValueError(f"{str(directory)!r} ships no chat template (chat_template.jinja or "
                       f"tokenizer_config.json) and its tokenizer lacks the ChatML tokens {missing}")
    return ChatFormat(tokenizer, CHATML_TEMPLATE, special_tokens={},
                      enable_thinking=enable_thinking, name="ChatML", fallback=True)
  return ChatFormat(tokenizer, template, special_tokens=_special_tokens(config),
                    enable_thinking=enable_thinking,
                    name="ChatML" if template == CHATML_TEMPLATE else repr(str(directory)))


def load_chat(path: str | pathlib.Path, *, enable_thinking: bool = True) -> ChatFormat:
  """The tokenizer at `path` and its chat format."""
  return chat_format(path, load_tokenizer(path), enable_thinking=enable_thinking)
