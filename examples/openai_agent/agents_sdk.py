"""The example's agent written with the OpenAI Agents SDK (`openai-agents`): a tool, an
agent, `Runner.run`; sao_jax runs it once per task as a function program.

    --set env.options.program=agents_sdk:run   (examples/openai_agent on PYTHONPATH)

`run(task, base_url, api_key)` is called on a thread of the sampler for each episode;
the SDK's chat-completions model calls the episode's endpoint with the episode's key,
and the run's reward function (reward.py) grades the conversation. An asyncio client
belongs to one event loop, so each episode (its own `asyncio.run`) has its own. The
SDK's tracing would export to OpenAI's servers: it is off.
"""

import asyncio

import openai
from agents import (Agent, MaxTurnsExceeded, OpenAIChatCompletionsModel, Runner, function_tool,
                    set_tracing_disabled)

set_tracing_disabled(True)


@function_tool
def add(a: int, b: int) -> int:
  """Add two integers."""
  return a + b


async def solve(task, base_url: str, api_key: str, max_turns: int) -> None:
  async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
    agent = Agent(name="adder", instructions="Answer with the add tool's result.", tools=[add],
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client))
    try:
      await Runner.run(agent, task.prompt, max_turns=max_turns)
    except MaxTurnsExceeded:
      pass  # still calling tools at the last turn: graded like any other conversation


def run(task, base_url: str, api_key: str, max_turns: int = 3) -> None:
  asyncio.run(solve(task, base_url, api_key, max_turns))
