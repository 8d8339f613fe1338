"""Agent programs the tests run (by import path, as `env.options.program` names them):
each drives the endpoint with the real `openai` client and records what it got."""

import openai

SEEN: dict[str, list] = {}  # task id -> [(messages sent, response)] of each call


def _client(base_url, api_key):
  return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)


def _call(client, task, messages, **kwargs):
  response = client.chat.completions.create(model="policy", messages=messages, logprobs=True,
                                            **kwargs)
  SEEN.setdefault(task.id, []).append(([dict(m) for m in messages], response))
  return response.choices[0].message


def two_turns(task, base_url, api_key):
  """A system and user prompt, the policy's answer, a follow-up, an answer; reward 0.5
  returned (the function's value is the episode's reward)."""
  client = _client(base_url, api_key)
  messages = [{"role": "system", "content": "You are terse."},
              {"role": "user", "content": task.prompt}]
  reply = _call(client, task, messages)
  messages += [{"role": "assistant", "content": reply.content},
               {"role": "user", "content": "Say it again."}]
  _call(client, task, messages)
  return 0.5


def tool_history(task, base_url, api_key):
  """A first call whose history already holds a tool call and its result, with tools;
  the reward is posted to /v1/episode/end."""
  client = _client(base_url, api_key)
  tools = [{"type": "function", "function": {
      "name": "add", "description": "Add two numbers.",
      "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                      "b": {"type": "integer"}},
                     "required": ["a", "b"]}}}]
  messages = [{"role": "user", "content": task.prompt},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "c1", "type": "function",
                   "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "4"}]
  _call(client, task, messages, tools=tools)
  client.post("/episode/end", body={"reward": 1.0}, cast_to=object)


def edits_history(task, base_url, api_key):
  """Drops its first exchange before the second call: a new segment."""
  client = _client(base_url, api_key)
  first = [{"role": "user", "content": task.prompt}]
  reply = _call(client, task, first)
  _call(client, task, [{"role": "user", "content": "Start over: " + task.prompt}])
  del reply
  return 1.0


def no_reward(task, base_url, api_key):
  _call(_client(base_url, api_key), task, [{"role": "user", "content": task.prompt}])


def raises(task, base_url, api_key):
  _call(_client(base_url, api_key), task, [{"role": "user", "content": task.prompt}])
  raise RuntimeError("the agent's own bug")


def never_ends(task, base_url, api_key):
  import time
  _call(_client(base_url, api_key), task, [{"role": "user", "content": task.prompt}])
  time.sleep(30)


REWARDS: dict[str, list[float]] = {}  # task id -> the reward of each of its episodes, in order


def even_reply(task, base_url, api_key):
  """One call; reward 1 when the policy's reply has an even number of characters."""
  reply = _call(_client(base_url, api_key), task, [{"role": "user", "content": task.prompt}])
  reward = float(len(reply.content or "") % 2 == 0)
  REWARDS.setdefault(task.id, []).append(reward)
  return reward
