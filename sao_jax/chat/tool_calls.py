"""Native tool calls: tools as JSON-schema functions, calls in the checkpoint's own format.

    tool_format(template)            -> "hermes" | "llama3_json" | "fenced"
    function("python", "Run Python.", {"code": {"type": "string"}})  -> an OpenAI `tools` entry
    parse(text, "hermes")            -> ToolCall(name, arguments) | None; ToolCallError if malformed
    check(call, tools)               -> ToolCallError unless `call` fits one of `tools`

Tools are declared in the OpenAI `tools` format, `{"type": "function", "function":
{"name", "description", "parameters": <JSON schema of an object>}}`, and handed
to the chat template as `tools=` (`ChatFormat.render`): the template writes them
where the checkpoint was tuned to read them (Qwen2.5 / Qwen3: a `# Tools` section
of the system turn; Llama 3.1: the first user turn). How the policy calls a
tool follows from the template (`tool_format`):

- "hermes" (a template that writes `<tool_call>`: Qwen2.5, Qwen3): a
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block; the first
  block of a turn is the call.
- "llama3_json" (a template that asks for `"parameters"`: Llama 3.1 / 3.2): the
  whole turn, optionally after `<|python_tag|>`, is one JSON object
  `{"name": ..., "parameters": {...}}`; a turn that starts with `{` is a call.
- "fenced" (ChatML and templates without tools): no native format; a block
  opened by ```` ```tool ```` holding `{"name": ..., "arguments": {...}}` (the
  coding environment's format), which the environment's system prompt must
  describe (`describe_fenced` writes that text); math_tool keeps its
  ```` ```python ```` blocks.

Results go back as `tool` messages, which the template renders (Qwen:
`<tool_response>` in a user turn; Llama: an `ipython` turn) and whose text is
untrusted (`sao_jax.chat.untrusted`). The policy's turn is kept verbatim as the
assistant message's content, so the action mask stays exactly the sampled tokens.
A malformed call (bad JSON, no name, arguments not an object), an unknown tool
or arguments that do not fit the schema raise `ToolCallError`, whose message is
meant for the model: environments send it back as the observation.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

FORMATS = ("hermes", "llama3_json", "fenced")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```tool[ \t]*\n(.*?)```", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
               "object": dict, "array": list, "null": type(None)}
MAX_CALL_CHARS = 65536  # of one call's JSON: a tool call is not a place for megabytes


class ToolCallError(ValueError):
  """A tool call the environment cannot run; the message tells the model why."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  arguments: Mapping[str, Any]


def tool_format(template: str) -> str:
  """The tool-call format the chat template teaches (module docstring)."""
  if "tools" not in template:
    return "fenced"
  if "<tool_call>" in template:
    return "hermes"
  if '"parameters"' in template or "<|python_tag|>" in template:
    return "llama3_json"
  return "fenced"


def function(name: str, description: str, properties: Mapping[str, Mapping[str, Any]],
             required: Sequence[str] | None = None) -> dict[str, Any]:
  """An OpenAI `tools` entry; `required` defaults to every property."""
  return {"type": "function", "function": {
      "name": name, "description": description,
      "parameters": {"type": "object", "properties": dict(properties),
                     "required": list(properties if required is None else required)}}}


def _decode(payload: str, fmt: str) -> ToolCall:
  if len(payload) > MAX_CALL_CHARS:
    raise ToolCallError(f"error: the tool call is {len(payload)} characters long; at most "
                        f"{MAX_CALL_CHARS} are accepted.")
  try:
    value = json.loads(payload)
  except json.JSONDecodeError as error:
    raise ToolCallError(f"error: the tool call is not valid JSON ({error.msg} at character "
                        f"{error.pos}); write one JSON object.") from None
  key = "parameters" if fmt == "llama3_json" else "arguments"
  if not isinstance(value, dict) or not isinstance(value.get("name"), str):
    raise ToolCallError(f'error: a tool call is a JSON object {{"name": <tool>, "{key}": '
                        "{...}}.")
  arguments = value.get(key, value.get("arguments", value.get("parameters", {})))
  if isinstance(arguments, str):  # some checkpoints write the arguments as a JSON string
    try:
      arguments = json.loads(arguments)
    except json.JSONDecodeError:
      pass
  if not isinstance(arguments, dict):
    raise ToolCallError(f'error: "{key}" of a tool call must be a JSON object, got '
                        f"{type(arguments).__name__}.")
  return ToolCall(value["name"], arguments)


def parse(text: str, fmt: str) -> ToolCall | None:
  """The first tool call of `text` in format `fmt`; None if the turn makes none."""
  if fmt == "hermes":
    match = _HERMES.search(text)
    return None if match is None else _decode(match.group(1), fmt)
  if fmt == "llama3_json":
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
      body = body[len(_PYTHON_TAG):].strip()
    return _decode(body, fmt) if body.startswith("{") else None
  if fmt == "fenced":
    match = _FENCED.search(text)
    return None if match is None else _decode(match.group(1).strip(), fmt)
  raise ValueError(f"tool format {fmt!r} is invalid: allowed values are {FORMATS}")


def describe_fenced(tools: Sequence[Mapping[str, Any]]) -> str:
  """What a system prompt says to teach the "fenced" format and `tools` (where the
  chat template cannot: ChatML)."""
  lines = ["To call a tool, write a block that starts with ```tool on its own line, holds one "
           'JSON object {"name": <tool>, "arguments": {...}} and ends with ``` on its own line. '
           "Only the first tool block of a message runs; its result is sent back to you. Tools:"]
  for tool in tools:
    spec = tool["function"]
    arguments = ", ".join(f"{name}: {schema.get('type', 'any')}" for name, schema in
                          spec.get("parameters", {}).get("properties", {}).items())
    lines.append(f"- {spec['name']}({arguments}): {spec.get('description', '')}")
  return "\n".join(lines)


def check(call: ToolCall, tools: Sequence[Mapping[str, Any]]) -> None:
  """ToolCallError unless `call` names one of `tools` with arguments its schema allows
  (the object's properties, required ones present, JSON types of each)."""
  schemas = {tool["function"]["name"]: tool["function"].get("parameters", {}) for tool in tools}
  if call.name not in schemas:
    raise ToolCallError(f"error: unknown tool {call.name[:100]!r}; the tools are "
                        f"{', '.join(map(repr, schemas))}.")
  schema = schemas[call.name]
  properties = schema.get("properties", {})
  unknown = [name for name in call.arguments if name not in properties]
  if unknown:
    raise ToolCallError(f"error: {call.name} has no argument {unknown[0][:100]!r}; its "
                        f"arguments are {', '.join(map(repr, properties)) or 'none'}.")
  for name in schema.get("required", ()):
    if name not in call.arguments:
      raise ToolCallError(f"error: {call.name} needs the argument {name!r}.")
  for name, value in call.arguments.items():
    kind = properties[name].get("type")
    expected = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
    wrong_bool = isinstance(value, bool) and kind in ("integer", "number")
    if expected is not None and (not isinstance(value, expected) or wrong_bool):
      raise ToolCallError(f"error: argument {name!r} of {call.name} must be a JSON {kind}, "
                          f"got {type(value).__name__}.")
