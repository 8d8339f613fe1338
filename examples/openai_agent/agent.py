"""An agent that knows nothing of sao_jax: the openai client, one tool, a loop.

It reads its endpoint and key from OPENAI_BASE_URL / OPENAI_API_KEY (the openai
client's own variables) and its task from SAO_TASK_PROMPT; `sao-train` runs it
once per task and trains the policy that answers it (config.py).
"""

import json
import os

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


def main(max_turns: int = 3) -> None:
  client = OpenAI()
  messages = [{"role": "user", "content": os.environ["SAO_TASK_PROMPT"]}]
  for _ in range(max_turns):
    reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
      return  # answered: the run's reward function grades the conversation
    for call in message.tool_calls:
      args = json.loads(call.function.arguments)
      result = args.get("a", 0) + args.get("b", 0)
      messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})


if __name__ == "__main__":
  main()
