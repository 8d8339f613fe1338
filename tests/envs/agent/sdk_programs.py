"""An agent program on the OpenAI Agents SDK (`openai-agents`) for the framework test: a
tool, an agent whose conversation starts with an earlier call of that tool, each request
the SDK sends and each result it returns recorded by task id."""

import asyncio
import json

import openai
from agents import (Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel, Runner,
                    function_tool, set_tracing_disabled)

set_tracing_disabled(True)  # its exporter would call OpenAI's servers
SENT: dict[str, list[dict]] = {}  # task id -> the JSON body of each chat call
RESULTS: dict[str, object] = {}  # task id -> the SDK's RunResult


@function_tool
def add(a: int, b: int) -> int:
  """Add two integers."""
  return a + b


def earlier_call(task):
  """The conversation so far, in the SDK's input items: the question and a call of add."""
  return [{"role": "user", "content": task.prompt},
          {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2, "b": 2}'},
          {"type": "function_call_output", "call_id": "c1", "output": "4"}]


async def _run(task, base_url, api_key):
  async def record(request):
    SENT.setdefault(task.id, []).append(json.loads(request.content))

  http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [record]})
  async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                http_client=http) as client:
    # top_logprobs=0: the SDK then asks for logprobs (each sampled token's, none other).
    agent = Agent(name="adder", instructions="Answer with the add tool's result.", tools=[add],
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                  model_settings=ModelSettings(top_logprobs=0))
    try:
      RESULTS[task.id] = await Runner.run(agent, earlier_call(task), max_turns=2)
    except MaxTurnsExceeded:
      RESULTS[task.id] = None


def tool_agent(task, base_url, api_key):
  asyncio.run(_run(task, base_url, api_key))
  return 1.0
