"""The OpenAI chat-completions shapes the agent endpoint reads and writes, in one place.

    request = parse_request(body, max_messages=64)  # ChatRequest, or ApiError (400)
    body = completion(request, turn, text, tool_format, ...)  # the `chat.completion` object
    error_body(ApiError(...))                        # {"error": {message, type, param, code}}

Follows OpenAI's API rather than a dialect of it, so unmodified clients work:
route names, field names, `finish_reason` values and the error body are OpenAI's.
What a request may hold (docs/reference/agent-endpoint.md lists it):

- `messages`: 1 to `max_messages` messages of role system, developer (read as
  system), user, assistant or tool; content a string, a list of text parts, or
  null on an assistant message with `tool_calls`; tool messages with their
  `tool_call_id`.
- `tools`: function tools (`{"type": "function", "function": {name, description,
  parameters}}`), given to the chat template as the checkpoint expects them;
  `tool_choice` absent or "auto" (the policy decides; forcing a call would sample
  from another distribution than the one trained).
- `max_tokens` / `max_completion_tokens`: caps the turn (never past the run's
  `sampler.max_new_tokens`); `n` 1; `logprobs` true returns each sampled token's
  log-prob, exactly the `behavior_logp` the learner trains against.
- `temperature`, `top_p`, `seed`, `user`, `metadata`, `parallel_tool_calls`,
  `stream_options`, `model` (any name; /v1/models lists the one served) are
  accepted and do not change sampling: a training run samples with its own
  sampler settings, or the recorded `behavior_logp` would not be the distribution
  the learner corrects for.

Refused with a 400 naming the field (`param`): `n` > 1, `stream` true,
`top_logprobs`, a non-empty `stop`, `tool_choice` other than "auto", a
`response_format` other than text, `logit_bias`, `audio` / `modalities` other
than text, and anything malformed.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Mapping

from sao_jax.chat import tool_calls
from sao_jax.envs.base import Message, SampledTurn

ROLES = ("system", "developer", "user", "assistant", "tool")
# Fields read as "accepted, sampling unchanged" (module docstring).
IGNORED = ("model", "temperature", "top_p", "seed", "user", "metadata", "parallel_tool_calls",
           "stream_options", "store", "service_tier", "frequency_penalty", "presence_penalty")
# The engine's turn ends -> OpenAI's finish_reason (a turn that makes a tool call: "tool_calls").
FINISH_REASONS = {"stop_token": "stop", "stop_pattern": "stop", "max_new_tokens": "length",
                  "max_seq_len": "length"}


class ApiError(Exception):
  """A refusal, sent as OpenAI's error body with HTTP `status`."""

  def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
               param: str | None = None, code: str | None = None):
    super().__init__(message)
    self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_body(error: ApiError) -> dict[str, Any]:
  return {"error": {"message": error.message, "type": error.type, "param": error.param,
                    "code": error.code}}


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
  return ApiError(400, f"{param}: {message}", param=param, code=code)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  """A checked request: `messages` as the chat format renders them (`{"role",
  "content", ...}`), `canonical` the same messages in a form to compare histories by,
  `tools` the function tools (None: none), the turn cap and whether to return logprobs."""

  messages: tuple[Message, ...]
  canonical: tuple[tuple, ...]
  tools: tuple[Mapping[str, Any], ...] | None
  max_tokens: int | None
  logprobs: bool
  model: str


def _text(value: Any, param: str, *, allow_none: bool = False) -> str:
  if value is None and allow_none:
    return ""
  if isinstance(value, str):
    return value
  if isinstance(value, list):  # content parts: text only
    parts = []
    for k, part in enumerate(value):
      if not (isinstance(part, Mapping) and part.get("type") == "text"
              and isinstance(part.get("text"), str)):
        raise _bad(f"{param}[{k}]", "only text content parts ({'type': 'text', 'text': ...}) "
                   "can be rendered", "unsupported_content")
      parts.append(part["text"])
    return "".join(parts)
  raise _bad(param, f"expected a string or a list of text parts, got {type(value).__name__}")


def _tool_calls(value: Any, param: str) -> list[tuple[str, str, Any]]:
  """An assistant message's tool_calls as (id, name, arguments as JSON value)."""
  if not isinstance(value, list):
    raise _bad(param, "expected a list of tool calls")
  calls = []
  for k, call in enumerate(value):
    function = call.get("function") if isinstance(call, Mapping) else None
    if not (isinstance(function, Mapping) and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str)):
      raise _bad(f"{param}[{k}]", "expected {'id', 'type': 'function', 'function': {'name': "
                 "str, 'arguments': str (JSON)}}")
    try:
      arguments = json.loads(function["arguments"])
    except ValueError:
      raise _bad(f"{param}[{k}].function.arguments", "is not valid JSON") from None
    calls.append((str(call.get("id", "")), function["name"], arguments))
  return calls


def _message(raw: Any, i: int) -> tuple[Message, tuple]:
  """One message as the template renders it, and its canonical form."""
  where = f"messages[{i}]"
  if not isinstance(raw, Mapping):
    raise _bad(where, f"expected an object, got {type(raw).__name__}")
  role = raw.get("role")
  if role not in ROLES:
    raise _bad(f"{where}.role", f"{role!r} is not one of {ROLES}")
  role = "system" if role == "developer" else role
  if role == "assistant":
    calls = _tool_calls(raw["tool_calls"], f"{where}.tool_calls") if raw.get("tool_calls") else []
    content = _text(raw.get("content"), f"{where}.content", allow_none=bool(calls))
    message: Message = {"role": role, "content": content}
    if calls:
      message["tool_calls"] = [{"type": "function", "id": call_id,
                                "function": {"name": name, "arguments": arguments}}
                               for call_id, name, arguments in calls]
    canonical = (role, content.strip(), tuple((name, json.dumps(arguments, sort_keys=True))
                                              for _, name, arguments in calls))
    return message, canonical
  content = _text(raw.get("content"), f"{where}.content")
  message = {"role": role, "content": content}
  if role == "tool":
    call_id = raw.get("tool_call_id")
    if not isinstance(call_id, str):
      raise _bad(f"{where}.tool_call_id", "a tool message names the call it answers")
    message["tool_call_id"] = call_id
    if isinstance(raw.get("name"), str):
      message["name"] = raw["name"]
  return message, (role, content, message.get("tool_call_id"))


def _tools(value: Any) -> tuple[Mapping[str, Any], ...] | None:
  if value is None or value == []:
    return None
  if not isinstance(value, list):
    raise _bad("tools", "expected a list of function tools")
  for k, tool in enumerate(value):
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if (not isinstance(tool, Mapping) or tool.get("type") != "function"
        or not isinstance(function, Mapping) or not isinstance(function.get("name"), str)):
      raise _bad(f"tools[{k}]", "expected {'type': 'function', 'function': {'name': str, "
                 "'description': str, 'parameters': JSON schema}}", "unsupported_tool")
  return tuple(value)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
  if body.get("n", 1) != 1:
    raise _bad("n", f"{body['n']!r}: one choice per call (n=1); an episode is one sequence")
  if body.get("stream"):
    raise _bad("stream", "streaming is not served; call without stream", "unsupported_value")
  if body.get("top_logprobs"):
    raise _bad("top_logprobs", "only the sampled token's log-prob is recorded (logprobs=true)",
               "unsupported_value")
  if body.get("stop"):
    raise _bad("stop", "stop sequences are the run's (sampler.stop_patterns); call without "
               "stop", "unsupported_value")
  if body.get("tool_choice", "auto") not in ("auto", None):
    raise _bad("tool_choice", f"{body['tool_choice']!r}: only 'auto' (forcing a call would "
               "sample from another distribution than the one trained)", "unsupported_value")
  response_format = body.get("response_format")
  if response_format not in (None, {"type": "text"}):
    raise _bad("response_format", "only text is served", "unsupported_value")
  if body.get("logit_bias"):
    raise _bad("logit_bias", "would change the sampled distribution", "unsupported_value")
  if body.get("modalities") not in (None, ["text"]) or body.get("audio"):
    raise _bad("modalities", "only text is served", "unsupported_value")


def parse_request(body: Any, *, max_messages: int) -> ChatRequest:
  """`body` (the decoded JSON) as a `ChatRequest`; ApiError (400) naming the field."""
  if not isinstance(body, Mapping):
    raise ApiError(400, "the request body is not a JSON object", code="invalid_json")
  _refuse_unsupported(body)
  known = {"messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "n",
           "stream", "logprobs", "top_logprobs", "stop", "response_format", "logit_bias",
           "modalities", "audio", *IGNORED}
  unknown = sorted(set(body) - known)
  if unknown:
    raise _bad(unknown[0], "is not a field this endpoint serves", "unknown_parameter")
  raw = body.get("messages")
  if not isinstance(raw, list) or not raw:
    raise _bad("messages", "expected a non-empty list of messages")
  if len(raw) > max_messages:
    raise _bad("messages", f"{len(raw)} messages exceed the episode's limit of {max_messages} "
               "(env.options.max_messages)", "too_many_messages")
  parsed = [_message(message, i) for i, message in enumerate(raw)]
  max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
  if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                 or max_tokens < 1):
    raise _bad("max_tokens", f"{max_tokens!r}: expected a positive integer")
  logprobs = body.get("logprobs", False)
  if not isinstance(logprobs, bool) and logprobs is not None:
    raise _bad("logprobs", f"{logprobs!r}: expected true or false")
  model = body.get("model", "")
  return ChatRequest(messages=tuple(m for m, _ in parsed), canonical=tuple(c for _, c in parsed),
                     tools=_tools(body.get("tools")), max_tokens=max_tokens,
                     logprobs=bool(logprobs), model=model if isinstance(model, str) else "")


def split_calls(text: str, fmt: str) -> tuple[str, list[tool_calls.ToolCall]]:
  """The text before the turn's tool calls and the calls, in the checkpoint's format
  (`tool_calls`); a malformed call leaves the whole turn as text and no call (the agent
  sees what the policy wrote, and its program decides). Hermes turns may hold several
  `<tool_call>` blocks: each is a call."""
  calls: list[tool_calls.ToolCall] = []
  rest = text
  try:
    while (call := tool_calls.parse(rest, fmt)) is not None:
      calls.append(call)
      if fmt != "hermes":
        break
      rest = rest[rest.index("</tool_call>") + len("</tool_call>"):] if "</tool_call>" in rest else ""
  except tool_calls.ToolCallError:
    return text, []
  if not calls:
    return text, []
  markers = {"hermes": "<tool_call>", "fenced": "```tool", "llama3_json": ""}
  head = text[:text.find(markers[fmt])] if markers[fmt] else ""
  return head.strip(), calls


def completion(request: ChatRequest, turn: SampledTurn, text: str, *, fmt: str, call_ids: str
               ) -> tuple[dict[str, Any], Message, tuple]:
  """The `chat.completion` body for the sampled `turn` (decoded: `text`), the assistant
  message as the client will send it back, and that message's canonical form. Its
  `usage` counts tokens as OpenAI does: `prompt_tokens` the context the turn was sampled
  from (the call's rendered conversation: kept in the KV cache, not prefilled again),
  `completion_tokens` the turn's sampled tokens."""
  content, calls = split_calls(text, fmt)
  calls_out = [{"id": f"call_{call_ids}_{k}", "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))}}
               for k, call in enumerate(calls)]
  finish = "tool_calls" if calls else FINISH_REASONS.get(turn.finish_reason, "stop")
  message = {"role": "assistant", "content": content or (None if calls else ""),
             "refusal": None}
  if calls_out:
    message["tool_calls"] = calls_out
  logprobs = None
  if request.logprobs:
    pieces = [turn.token_text(token) for token in turn.tokens]
    logprobs = {"content": [{"token": piece, "logprob": logp,
                             "bytes": list(piece.encode("utf-8", "replace")),
                             "top_logprobs": []}
                            for piece, logp in zip(pieces, turn.behavior_logp)],
                "refusal": None}
  body = {"id": f"chatcmpl-{call_ids}", "object": "chat.completion", "created": int(time.time()),
          "model": request.model or "policy",
          "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                       "finish_reason": finish}],
          "usage": {"prompt_tokens": turn.context_tokens, "completion_tokens": len(turn.tokens),
                    "total_tokens": turn.context_tokens + len(turn.tokens)}}
  canonical = ("assistant", (content or "").strip(),
               tuple((call.name, json.dumps(dict(call.arguments), sort_keys=True))
                     for call in calls))
  return body, message, canonical
