"""Native tool calls: tools as JSON-schema functions, calls in the checkpoint's own format.

    tool_format(template)            -> "hermes" | "llama3_json" | "fenced"
    function("python", "Run Python.", {"code": {"type": "string"}})  -> an OpenAI `tools` entry
    parse(text, "hermes")            -> ToolCall(name, arguments) | None; ToolCallError if malformed
    check(call, tools)               -> ToolCallError unless `call` fits one of `tools`
    read(text, "hermes", tools)      -> parse, then check: what an environment's step calls
    render(call, "hermes")           -> the text that makes `call`: parse(render(c, f), f) == c
    render_turn(Turn(text, call), f) -> a scripted assistant turn (demonstrations) in format f
    format_for(tools, template_fmt)  -> the format an environment with `tools` is given

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
  opened by a ```` ```tool ```` line holding `{"name": ..., "arguments": {...}}`
  and closed by the next line that starts with ```` ``` ```` (JSON strings hold
  no raw newline, so backticks inside an argument never close it), which the
  environment's system prompt must describe (`describe_fenced` writes that
  text). `"args"` is read as `"arguments"` (the coding environment's earlier
  spelling). math_tool keeps its ```` ```python ```` blocks.

An environment with no tools gets "fenced" whatever the template (`format_for`,
the one place that decides; the sampler and the SFT demonstrations both ask it).
Demonstrations write a tool call as a `Turn` (text, then a `ToolCall`), which
`render_turn` writes in the run's format, so SFT teaches the format RL parses;
under "llama3_json" the call is the whole turn (Llama 3.1 writes nothing around
a call), so the text is dropped.

Results go back as `tool` messages, which the template renders (Qwen:
`<tool_response>` in a user turn; Llama: an `ipython` turn) and whose text is
untrusted (`sao_jax.chat.untrusted`). The policy's turn is kept verbatim as the
assistant message's content, so the action mask stays exactly the sampled tokens.
A malformed call (bad JSON, JSON nested deeper than the parser's recursion or
an integer too long to convert, no name, keys beside the name and arguments,
arguments not an object), an unknown tool or arguments that do not fit the
schema (missing, extra, wrong JSON type, a string holding an unpaired surrogate
such as `"\\ud800"`, which no file, path or program can hold) raise
`ToolCallError`, whose message is meant for the model: environments send it
back as the observation. Parsing is linear in the turn's length: the blocks are
found with `str.find` and line-anchored fences, never a lazy pattern rescanned
from every opening (a `<tool_call>` followed by 40 000 spaces took 13 s).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

FORMATS = ("hermes", "llama3_json", "fenced")
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
# A fenced block's opening and closing lines, searched apart (module docstring).
_FENCE_OPEN = re.compile(r"```tool[ \t]*\n")
_FENCE_LINE = re.compile(r"^[ \t]*```", re.MULTILINE)
_ARGUMENT_KEYS = ("arguments", "parameters", "args")  # "args": the coding env's earlier fenced key
_PYTHON_TAG = "<|python_tag|>"
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
               "object": dict, "array": list, "null": type(None)}
# Of one call's JSON, by default: a tool call is not a place for megabytes (an environment
# whose tools take whole files passes its own `max_chars`).
MAX_CALL_CHARS = 65536


class ToolCallError(ValueError):
  """A tool call the environment cannot run; the message tells the model why."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Turn:
  """A scripted assistant turn: `text`, then (if not None) the tool call `call`,
  written in the episode's format by `render_turn` (module docstring)."""

  text: str
  call: ToolCall | None = None


def tool_format(template: str) -> str:
  """The tool-call format the chat template teaches (module docstring)."""
  if "tools" not in template:
    return "fenced"
  if "<tool_call>" in template:
    return "hermes"
  if '"parameters"' in template or "<|python_tag|>" in template:
    return "llama3_json"
  return "fenced"


def format_for(tools: Sequence[Mapping[str, Any]], template_format: str) -> str:
  """The format an environment offering `tools` is given under a template whose own
  format is `template_format`: that one, or "fenced" for an environment without tools
  (its text is its own business, and the template is given no `tools=`)."""
  return template_format if tools else "fenced"


def function(name: str, description: str, properties: Mapping[str, Mapping[str, Any]],
             required: Sequence[str] | None = None) -> dict[str, Any]:
  """An OpenAI `tools` entry; `required` defaults to every property."""
  return {"type": "function", "function": {
      "name": name, "description": description,
      "parameters": {"type": "object", "properties": dict(properties),
                     "required": list(properties if required is None else required)}}}


def _decode(payload: str, fmt: str, max_chars: int) -> ToolCall:
  if len(payload) > max_chars:
    raise ToolCallError(f"error: the tool call is {len(payload)} characters long; at most "
                        f"{max_chars} are accepted.")
  key = "parameters" if fmt == "llama3_json" else "arguments"
  try:
    value = json.loads(payload)
  except json.JSONDecodeError as error:
    raise ToolCallError(f"error: the tool call is not valid JSON ({error.msg} at character "
                        f"{error.pos}); write one JSON object.") from None
  except (RecursionError, ValueError) as error:  # nesting past the parser's stack, an int past
    # Python's digit limit: JSON the decoder accepts but cannot build
    raise ToolCallError(f"error: the tool call could not be parsed ({type(error).__name__}); "
                        f'write one flat JSON object {{"name": <tool>, "{key}": {{...}}}}.'
                        ) from None
  if not isinstance(value, dict) or not isinstance(value.get("name"), str):
    raise ToolCallError(f'error: a tool call is a JSON object {{"name": <tool>, "{key}": '
                        "{...}}.")
  given = [name for name in _ARGUMENT_KEYS if name in value]
  unexpected = sorted(set(value) - {"name", *given[:1]})
  if unexpected:
    raise ToolCallError(f"error: unexpected keys {[k[:100] for k in unexpected]} in the tool "
                        f'call; it holds "name" and "{key}", and the arguments go inside "{key}".')
  arguments = value[given[0]] if given else {}
  if isinstance(arguments, str):  # some checkpoints write the arguments as a JSON string
    try:
      arguments = json.loads(arguments)
    except (RecursionError, ValueError):
      pass
  if not isinstance(arguments, dict):
    raise ToolCallError(f'error: "{key}" of a tool call must be a JSON object, got '
                        f"{type(arguments).__name__}.")
  return ToolCall(value["name"], arguments)


def parse(text: str, fmt: str, *, max_chars: int = MAX_CALL_CHARS) -> ToolCall | None:
  """The first tool call of `text` in format `fmt`; None if the turn makes none. A call
  whose JSON is longer than `max_chars` is a ToolCallError."""
  if fmt == "hermes":
    at = text.find(_HERMES_OPEN)
    if at < 0:
      return None
    start = at + len(_HERMES_OPEN)
    end = text.find(_HERMES_CLOSE, start)  # an unclosed call (a length cut) runs to the end
    return _decode(text[start:end if end >= 0 else len(text)].strip(), fmt, max_chars)
  if fmt == "llama3_json":
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
      body = body[len(_PYTHON_TAG):].strip()
    return _decode(body, fmt, max_chars) if body.startswith("{") else None
  if fmt == "fenced":
    opening = _FENCE_OPEN.search(text)
    # Without a closing line after the first opening there is none after a later one.
    closing = None if opening is None else _FENCE_LINE.search(text, opening.end())
    if closing is None:
      return None
    return _decode(text[opening.end():closing.start()].strip(), fmt, max_chars)
  raise ValueError(f"tool format {fmt!r} is invalid: allowed values are {FORMATS}")


def read(text: str, fmt: str, tools: Sequence[Mapping[str, Any]], *,
         max_chars: int = MAX_CALL_CHARS) -> ToolCall | None:
  """The first tool call of `text` in format `fmt`, checked against `tools`; None if
  the turn makes none; ToolCallError (its message for the model) if it is bad."""
  call = parse(text, fmt, max_chars=max_chars)
  if call is not None:
    check(call, tools)
  return call


def render(call: ToolCall, fmt: str) -> str:
  """The text that makes `call` in format `fmt` (what the Qwen and Llama templates
  write for an assistant message's `tool_calls`); `parse` reads it back as `call`."""
  if fmt == "hermes":
    return (f"{_HERMES_OPEN}\n{json.dumps({'name': call.name, 'arguments': dict(call.arguments)})}"
            f"\n{_HERMES_CLOSE}")
  if fmt == "llama3_json":
    return json.dumps({"name": call.name, "parameters": dict(call.arguments)})
  if fmt == "fenced":
    return f"```tool\n{json.dumps({'name': call.name, 'arguments': dict(call.arguments)})}\n```"
  raise ValueError(f"tool format {fmt!r} is invalid: allowed values are {FORMATS}")


def render_turn(turn: Turn, fmt: str) -> str:
  """`turn` as the policy would write it in format `fmt`: the text, a blank line and
  the call; under "llama3_json" the call alone (module docstring)."""
  if turn.call is None:
    return turn.text
  if fmt == "llama3_json" or not turn.text:
    return render(turn.call, fmt)
  return f"{turn.text}\n\n{render(turn.call, fmt)}"


def describe_fenced(tools: Sequence[Mapping[str, Any]]) -> str:
  """What a system prompt says to teach the "fenced" format and `tools` (where the
  chat template cannot: ChatML). An optional argument is marked `?`."""
  lines = ["To call a tool, write a block that starts with ```tool on its own line, holds one "
           'JSON object {"name": <tool>, "arguments": {...}} and ends with ``` on its own line. '
           "Only the first tool block of a message runs; its result is sent back to you. Tools:"]
  for tool in tools:
    spec = tool["function"]
    parameters = spec.get("parameters", {})
    required = set(parameters.get("required", ()))
    arguments = ", ".join(f"{name}{'' if name in required else '?'}: {schema.get('type', 'any')}"
                          for name, schema in parameters.get("properties", {}).items())
    lines.append(f"- {spec['name']}({arguments}): {spec.get('description', '')}")
  return "\n".join(lines)


def check(call: ToolCall, tools: Sequence[Mapping[str, Any]]) -> None:
  """ToolCallError unless `call` names one of `tools` with arguments its schema allows
  (the object's properties, required ones present, JSON types of each, strings that
  are text: no unpaired surrogate)."""
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
    if isinstance(value, str):
      try:  # JSON's "\ud800" decodes to a lone surrogate, which no file, path or program holds
        value.encode("utf-8")
      except UnicodeEncodeError as error:
        raise ToolCallError(f"error: argument {name!r} of {call.name} holds "
                            f"{value[error.start:error.end]!r}, an unpaired surrogate, which is "
                            "not text; write the character itself or its escaped surrogate "
                            "pair.") from None
